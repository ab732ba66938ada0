"""The power sampler's cost on the training loop: the tiny preset trained with and without
sampling at 10 Hz, in one process on one engine, the two kinds alternating over rounds.

The sampler reads this machine's own sources; where there are none (no NVML, no RAPL), it
reads a RAPL-like powercap tree of real files in a temporary directory (two packages and
their DRAM), so the thread does the same file reads as on a real host.

    python benchmarks/power_sampler_overhead.py [--rounds 7] [--hz 10]
        [--set data.train_examples=8192]

Prints the median examples/s of each, their ratio, and the median of the per-round ratios
(each round runs both kinds back to back, so slow drifts of this shared machine cancel);
target >= 0.99x.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def fake_powercap(root: Path) -> Path:
    for zone, name in (
        ("intel-rapl:0", "package-0"),
        ("intel-rapl:0:0", "dram"),
        ("intel-rapl:1", "package-1"),
        ("intel-rapl:1:0", "dram"),
    ):
        (root / zone).mkdir(parents=True)
        (root / zone / "name").write_text(name + "\n")
        (root / zone / "energy_uj").write_text("123456789\n")
        (root / zone / "max_energy_range_uj").write_text("262143328850\n")
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--hz", type=float, default=10.0)
    parser.add_argument(
        "--set", action="append", default=None, metavar="SECTION.KEY=VALUE", help="overrides"
    )
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from hpcai500_tf.config import prepare
    from hpcai500_tf.energy.sampler import PowerSampler
    from hpcai500_tf.energy.sources import discover
    from hpcai500_tf.engine.run import build_trainer
    from hpcai500_tf.mlperf.mllog import MLLogger
    from hpcai500_tf.run import lifecycle
    from hpcai500_tf.run.options import RunOptions
    from hpcai500_tf.run.progress import Progress

    overrides = args.set or ["data.train_examples=8192"]
    setup = prepare(
        "image_classification", "tiny", ["data.source=random", "training.epochs=1", *overrides]
    )
    trainer = build_trainer(setup, RunOptions())
    trainer.warm_up(False)

    def train_epochs(kind: str, sampler=None):
        """The run's own epoch loop (no run directory: no checkpoint) over the budget."""
        one = lifecycle.Run(setup, trainer, None, False, Progress(kind), MLLogger(None))
        return lifecycle.train_epochs(one, power=sampler)

    with tempfile.TemporaryDirectory() as scratch:
        sources, _ = discover()
        where = "this machine's sensors"
        if not sources:
            sources, _ = discover(powercap_root=fake_powercap(Path(scratch)))
            where = "simulated RAPL files (this machine has no sensors)"
        rates = {"sampled": [], "unsampled": []}
        reads = []
        train_epochs("warm-up")  # the input pipeline's first start, untimed
        for _ in range(args.rounds):
            for kind in ("unsampled", "sampled"):
                sampler = PowerSampler(sources, args.hz).start() if kind == "sampled" else None
                start = time.perf_counter()
                progress = train_epochs(kind, sampler)
                seconds = time.perf_counter() - start
                if sampler:
                    sampler.stop()
                    reads.append(len(sampler.readings[sources[0].name]) / seconds)
                rates[kind].append(progress.examples / seconds)
    sampled = statistics.median(rates["sampled"])
    unsampled = statistics.median(rates["unsampled"])
    print(
        f"tiny preset {' '.join(overrides)}, random data, {args.rounds} rounds, "
        f"{len(sources)} sources ({where}) at {args.hz:g} Hz "
        f"(achieved {statistics.median(reads):.1f} readings/s per source)"
    )
    for kind in ("unsampled", "sampled"):
        runs = ", ".join(f"{r:.0f}" for r in rates[kind])
        print(f"  {kind:9s} {statistics.median(rates[kind]):8.1f} examples/s   (runs: {runs})")
    print(f"  sampled / unsampled  {sampled / unsampled:.3f}x (ratio of the medians)")
    paired = [b / a for a, b in zip(rates["unsampled"], rates["sampled"], strict=True)]
    print(f"  median of the per-round ratios  {statistics.median(paired):.3f}x")


if __name__ == "__main__":
    main()
