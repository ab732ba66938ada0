"""This project's TensorFlow ResNet-50 v1.5 train step under a few variants of its process
environment or config, timed A B A B ... in fresh processes, each against the first variant.

A variant is `NAME:ITEM,ITEM,...`; an ITEM with an upper-case name before `=` is an
environment variable given to that process (e.g. MALLOC_MMAP_MAX_=0, TF_NUM_INTEROP_THREADS=1),
any other is a config override (e.g. model.kernels='gpu-fused-batch-norm'). Each round runs
every variant once, in the order given, each in its own process (the step of
`train_step_vs_pytorch.py`: batch, image size, steps and warm-up as there). Reports, per
variant, the median images/s over all its steps, the per-round ratio of its median step time
to the first variant's (neighbours in time, so drift on a shared machine hits both alike) and
the median of those ratios (> 1: faster than the first), and its kernel (system) time and minor
page faults per step (the faults do not depend on the machine's load).

    python benchmarks/train_step_variants.py --precision mixed --rounds 3 \\
        --variant base: --variant keep:MALLOC_MMAP_MAX_=0,MALLOC_TRIM_THRESHOLD_=1099511627776
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from resnet_step import step_parser

ROOT = Path(__file__).resolve().parents[1]


def parse_variant(text: str) -> tuple[str, dict[str, str], list[str]]:
    """(name, environment, config overrides) of `NAME:ITEM,ITEM`."""
    name, _, items = text.partition(":")
    if not name:
        raise SystemExit(f"--variant {text!r}: no name before ':'")
    env, overrides = {}, []
    for item in filter(None, items.split(",")):
        key, equals, value = item.partition("=")
        if not equals:
            raise SystemExit(f"--variant {text!r}: {item!r} is not KEY=VALUE")
        if key.isupper():
            env[key] = value
        else:
            overrides.append(item)
    return name, env, overrides


def run_variant(env: dict, overrides: list, args) -> dict:
    """One timed process of the step under `env` and `overrides`."""
    command = [sys.executable, __file__, "--one", args.precision, *map(str, args.sizes())]
    command += [f"--override={item}" for item in overrides]
    full_env = {**os.environ, **env}
    full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=full_env)
    if result.returncode != 0:
        raise SystemExit(f"{env} {overrides} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def report(names: list[str], runs: dict, batch: int) -> list[dict]:
    """Print each variant's rate and its per-round ratios to the first; return the rows."""
    first = names[0]
    rows = []
    for name in names:
        times = [t for run in runs[name] for t in run["times"]]
        ratios = [
            statistics.median(a["times"]) / statistics.median(b["times"])
            for a, b in zip(runs[first], runs[name], strict=True)
        ]
        system = statistics.median(run["system_seconds_per_step"] for run in runs[name])
        faults = statistics.median(run["minor_page_faults_per_step"] for run in runs[name])
        print(
            f"  {name:16s} {batch / statistics.median(times):7.2f} images/s   "
            f"against {first}: per round " + " ".join(f"{r:.3f}" for r in ratios)
            + f", median {statistics.median(ratios):.3f}x   kernel time {system:.2f} s/step, "
            f"{faults:.0f} minor page faults/step"
        )  # fmt: skip
        rows.append(
            {"variant": name, "images_per_s": batch / statistics.median(times),
             "round_ratios": ratios, "median_round_ratio": statistics.median(ratios),
             "system_seconds_per_step": system, "minor_page_faults_per_step": faults,
             "times": [r["times"] for r in runs[name]]}
        )  # fmt: skip
    return rows


def main() -> None:
    parser = step_parser(__doc__, rounds=3)
    parser.add_argument("--precision", default="mixed", choices=("fp32", "mixed"))
    parser.add_argument("--variant", action="append", default=[], help="NAME:ITEM,ITEM")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--one", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--override", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.sizes = lambda: (args.batch, args.image_size, args.steps, args.warmup)
    if args.one:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from train_step_vs_pytorch import tf_step_times

        precision, *sizes = args.one
        print(json.dumps(tf_step_times(precision, *map(int, sizes), overrides=args.override)))
        return
    variants = [parse_variant(text) for text in args.variant]
    if len(variants) < 2:
        raise SystemExit("give at least two --variant (the first is the one compared against)")
    runs = {name: [] for name, _, _ in variants}
    for _ in range(args.rounds):
        for name, env, overrides in variants:
            runs[name].append(run_variant(env, overrides, args))
            median = statistics.median(runs[name][-1]["times"])
            print(f"  ({name}: {median:.2f} s per step)", file=sys.stderr, flush=True)
    print(
        f"ResNet-50 v1.5 train step ({args.precision}), batch {args.batch}, "
        f"{args.image_size}x{args.image_size}, {args.steps} steps x {args.rounds} rounds"
    )
    rows = report([name for name, _, _ in variants], runs, args.batch)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
