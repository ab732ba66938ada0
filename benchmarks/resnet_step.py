"""The ResNet-50 v1.5 step the step benchmarks time: the reference preset on random data at a
given batch, image size and precision, on the default strategy (one replica), built as `train`
builds it; shared by step_profile.py, train_step_vs_pytorch.py, layers_vs_pytorch.py,
shifted_gradient_step.py and step_vs_ceiling.py, with the environment their child processes run
in and the arguments of those that time it over rounds.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

# What glibc is told to keep freed memory (no mmap, no trim): `--keep-freed-memory`.
KEEP_FREED_MEMORY = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**40)}


def benchmark_env(root: Path, keep_freed_memory: bool) -> dict:
    """The environment of a benchmark's child process: the project imported from `root`, and
    glibc keeping freed memory where asked."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    return {**env, **KEEP_FREED_MEMORY} if keep_freed_memory else env


def _at_least(minimum: int):
    """argparse's type for a whole number of at least `minimum` (a one-line refusal else)."""

    def whole(text: str) -> int:
        if not text.strip().isdigit() or int(text) < minimum:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number of at least {minimum}"
            )
        return int(text)

    return whole


def step_parser(doc: str, rounds: int) -> argparse.ArgumentParser:
    """The arguments of a script that times the whole step in fresh processes over rounds:
    the step's batch and image size, timed steps after a warm-up (which may be 0), rounds."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--batch", type=_at_least(1), default=32)
    parser.add_argument("--image-size", type=_at_least(1), default=224)
    parser.add_argument("--steps", type=_at_least(1), default=5)
    parser.add_argument("--warmup", type=_at_least(0), default=2)
    parser.add_argument("--rounds", type=_at_least(1), default=rounds)
    return parser


def reference_engine(precision: str, batch: int, image_size: int, overrides=()):
    """The engine (engine/loop.py) and one of its training batches (images, labels)."""
    from hpcai500_tf.config import prepare
    from hpcai500_tf.engine.run import build_engine

    setup = prepare(
        "image_classification",
        "reference",
        [
            "data.source='random'",
            f"data.image_size={image_size}",
            "data.num_classes=1000",
            f"training.batch_per_replica={batch}",
            "training.strategy='default'",
            f"training.precision='{precision}'",
            *overrides,
        ],
    )
    engine = build_engine(setup, None)
    return engine, next(engine.train_batches())
