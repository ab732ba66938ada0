"""Start-up time of `hpcai500-tf --help` against a bare interpreter start, and optionally against
another checkout's (e.g. the commit before a change), interleaved in one run.

Each measurement is a fresh process (`python -m hpcai500_tf.cli --help`, or `python -c pass`
for the interpreter alone); rounds alternate the order. Reports the median wall time of each
and the CLI's own cost (median minus the interpreter's).

    python benchmarks/cli_start_time.py [--rounds 15] [--other-tree /path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_start(command: list[str], tree: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    subprocess.run(command, cwd=tree, env=env, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--other-tree", type=Path, help="another checkout to time beside this")
    args = parser.parse_args()
    help_command = [sys.executable, "-m", "hpcai500_tf.cli", "--help"]
    kinds = {
        "interpreter": ([sys.executable, "-c", "pass"], ROOT),
        "this tree": (help_command, ROOT),
    }
    if args.other_tree:
        kinds["other tree"] = (help_command, args.other_tree.resolve())
    times = {name: [] for name in kinds}
    names = list(kinds)
    for command, tree in kinds.values():
        one_start(command, tree)  # file caches warm for every kind
    for index in range(args.rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            times[name].append(one_start(*kinds[name]))
    base = statistics.median(times["interpreter"])
    print(f"{args.rounds} rounds, median wall time per start ({sys.executable})")
    for name, values in times.items():
        median = statistics.median(values)
        own = "" if name == "interpreter" else f"   CLI's own: {1000 * (median - base):6.1f} ms"
        print(f"  {name:12s} {1000 * median:7.1f} ms{own}")
    if args.other_tree:
        ratio = statistics.median(times["this tree"]) / statistics.median(times["other tree"])
        print(f"  this / other tree: {ratio:.3f}x")


if __name__ == "__main__":
    main()
