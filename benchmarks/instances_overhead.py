"""Instances side by side against one after the other: what `train --instances M` costs or
gains on this machine, from the throughput records and MLPerf logs of real runs.

Each round trains M instances of a preset twice: once as `train --instances M` (side by side,
one process each, the cores split between them), and once as M plain `train` runs one after
the other (each with every core). Both are scored by the same rule (run/throughput.py):
models per minute over the window from the earliest run_start to the latest run_stop, and
the wall time from the first command to the last exit (start-up included). The kinds
alternate over rounds; medians are printed.

    python benchmarks/instances_overhead.py [--instances 2] [--preset tiny] [--rounds 3]

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


def _train(preset: str, out: str, extra: list[str]) -> None:
    command = [sys.executable, "-m", "hpcai500_tf.cli", "train", "image_classification"]
    command += ["--preset", preset, "--out", out, "--power-hz", "0", "--no-tensorboard", *extra]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if result.returncode != 0:
        raise SystemExit(
            f"{' '.join(command)} failed:\n{result.stdout[-1500:]}{result.stderr[-1500:]}"
        )


def side_by_side(preset: str, instances: int) -> tuple[float, float, int]:
    """(models/min over the window, wall seconds, models counted) of `--instances M`."""
    from hpcai500_tf.run import throughput

    with tempfile.TemporaryDirectory() as out:
        began = time.monotonic()
        _train(preset, out, ["--instances", str(instances)])
        wall = time.monotonic() - began
        (path,) = Path(out).glob("*/throughput.json")
        one = throughput.score(path)
        return one.models_per_minute, wall, one.counted


def one_after_another(preset: str, instances: int) -> tuple[float, float, int]:
    """The same M models as M plain runs in a row, with the seeds `--instances` gives them,
    scored over the same kind of window (first run_start to last run_stop)."""
    from hpcai500_tf import record
    from hpcai500_tf.run import throughput

    with tempfile.TemporaryDirectory() as out:
        began = time.monotonic()
        for index in range(instances):
            _train(
                preset, str(Path(out) / f"run-{index}"), ["--set", f"training.seed={10 + index}"]
            )
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
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float, int]]] = {"side by side": [], "in a row": []}
    for _ in range(args.rounds):
        results["side by side"].append(side_by_side(args.preset, args.instances))
        results["in a row"].append(one_after_another(args.preset, args.instances))
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
    ratio = summary["side by side"]["models_per_minute"] / summary["in a row"]["models_per_minute"]
    print(f"side by side / in a row: {ratio:.2f}x models per minute")
    print(json.dumps({"instances": args.instances, "preset": args.preset, **summary}))


if __name__ == "__main__":
    main()
