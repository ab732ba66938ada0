"""Instances side by side against one after the other: what `train --instances M` costs or
gains on this machine, from the throughput records and MLPerf logs of real runs.

Each round trains M instances of a preset twice: once as `train --instances M` (side by side,
one process each, the cores split between them), and once as M plain `train` runs one after
the other (each with every core). Both are scored by the same rule (run/throughput.py):
models per minute over the window from the earliest run_start to the latest run_stop, and
the wall time from the first command to the last exit (start-up included). The kinds
alternate over rounds; medians are printed.

    python benchmarks/instances_overhead.py [--instances 2] [--preset tiny] [--rounds 3]
                                            [--epochs E]   (E: the preset's epochs otherwise)

On a small machine the side-by-side instances share the same cores: this measures how much
throughput M concurrent models keep (or lose) against the same M models in a row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
METHOD = (
    "models per minute = models counted (completed and at the target) / minutes from the "
    "earliest run_start to the latest run_stop of the M runs' MLPerf logs (run/throughput.py's "
    "window), for M instances side by side (`train --instances M`) and for the same M models "
    "(the same seeds) trained one after the other by plain `train`; wall time from the first "
    "command's start to the last one's exit; the preset's data, power sampling off; the "
    "kinds' order alternates over rounds; medians over rounds"
)


def _train(preset: str, out: str, extra: list[str]) -> None:
    command = [sys.executable, "-m", "hpcai500_tf.cli", "train", "image_classification"]
    command += ["--preset", preset, "--out", out, "--power-hz", "0", "--no-tensorboard", *extra]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if result.returncode != 0:
        raise SystemExit(
            f"{' '.join(command)} failed:\n{result.stdout[-1500:]}{result.stderr[-1500:]}"
        )


def side_by_side(preset: str, instances: int, extra: list[str]) -> tuple[float, float, int]:
    """(models/min over the window, wall seconds, models counted) of `--instances M`."""
    from hpcai500_tf.run import throughput

    with tempfile.TemporaryDirectory() as out:
        began = time.monotonic()
        _train(preset, out, ["--instances", str(instances), *extra])
        wall = time.monotonic() - began
        (path,) = Path(out).glob("*/throughput.json")
        one = throughput.score(path)
        return one.models_per_minute, wall, one.counted


def one_after_another(preset: str, instances: int, extra: list[str]) -> tuple[float, float, int]:
    """The same M models as M plain runs in a row, with the seeds `--instances` gives them,
    scored over the same kind of window (first run_start to last run_stop)."""
    from hpcai500_tf import config, record
    from hpcai500_tf.cluster.instances import seeds
    from hpcai500_tf.run import throughput

    base = config.run_setup("image_classification", preset).training.seed
    with tempfile.TemporaryDirectory() as out:
        began = time.monotonic()
        for index, seed in enumerate(seeds(base, instances)):
            run_out = str(Path(out) / f"run-{index}")
            _train(preset, run_out, ["--set", f"training.seed={seed}", *extra])
        wall = time.monotonic() - began
        members, counted = [], 0
        for run_dir in sorted(Path(out).glob("run-*/*")):
            start, stop, _ = throughput.mlperf_times(run_dir / "mlperf.log")
            members.append({"run_start": start, "run_stop": stop})
            rec = record.load(run_dir / "record.json")
            counted += rec["status"] == "completed" and rec["quality"]["reached_target"]
        start, stop = throughput.member_window(members)
        return counted / ((stop - start) / 60), wall, counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, help="training.epochs (default: the preset's)")
    args = parser.parse_args()
    extra = [] if args.epochs is None else ["--set", f"training.epochs={args.epochs}"]
    results: dict[str, list[tuple[float, float, int]]] = {"side by side": [], "in a row": []}
    kinds = {"side by side": side_by_side, "in a row": one_after_another}
    for round_index in range(args.rounds):  # the order alternates: odd rounds go in a row first
        order = list(kinds) if round_index % 2 == 0 else list(kinds)[::-1]
        for kind in order:
            results[kind].append(kinds[kind](args.preset, args.instances, extra))
    summary = {}
    for kind, rounds in results.items():
        rate = statistics.median(r[0] for r in rounds)
        wall = statistics.median(r[1] for r in rounds)
        counted = [r[2] for r in rounds]
        summary[kind] = {"models_per_minute": rate, "wall_s": wall, "counted": counted}
        print(
            f"{kind:>13}: {rate:8.3g} models/min over the window, {wall:6.1f} s wall "
            f"(median of {args.rounds}; models counted per round {counted})"
        )
    in_a_row = summary["in a row"]["models_per_minute"]
    ratio = summary["side by side"]["models_per_minute"] / in_a_row if in_a_row else None
    if ratio is None:
        print("side by side / in a row: no ratio (no model in a row reached the target)")
    else:
        print(f"side by side / in a row: {ratio:.2f}x models per minute")
    print(f"method: {METHOD}")
    shown = {"instances": args.instances, "preset": args.preset, "epochs": args.epochs}
    print(json.dumps({**shown, **summary, "ratio": ratio, "method": METHOD}))


if __name__ == "__main__":
    main()
