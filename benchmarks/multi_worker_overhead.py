"""Two workers against one on this machine: the collective path's cost and the launcher's
start-up time, from the records of real `hpcai500-tf train` runs.

Both sides train the tiny preset on random data (no evaluation) with the same global batch:
one process with the default strategy, and `--workers 2` (MultiWorkerMirroredStrategy over
loopback gRPC) at half the batch per worker. On one small machine the two workers share the
same cores, so this measures overhead, not scaling. The kinds alternate over rounds.

    python benchmarks/multi_worker_overhead.py [--rounds 3] [--set data.train_examples=4096]

Throughput: examples per second of training (the record's epoch times). Start-up: seconds
from launching the command to the record's run_start (imports, cluster join, model build,
tracing, FLOP count, warm-up), medians over rounds.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_once(workers: int, batch: int, extra: list[str]) -> tuple[float, float]:
    from hpcai500_tf import record

    with tempfile.TemporaryDirectory() as out:
        command = [
            sys.executable,
            "-m",
            "hpcai500_tf.cli",
            "train",
            "image_classification",
            "--preset",
            "tiny",
            "--out",
            out,
            "--power-hz",
            "0",
            "--set",
            "data.source=random",
            "--set",
            f"training.batch_per_replica={batch}",
        ]
        for override in extra:
            command += ["--set", override]
        if workers > 1:
            command += ["--workers", str(workers)]
        launched = time.time()
        result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        if result.returncode != 0:
            raise SystemExit(f"{workers}-worker run failed:\n{result.stderr[-2000:]}")
        (path,) = Path(out).glob("*/record.json")
        rec = record.load(path)
    epochs = rec["timeline"]["epochs"]
    throughput = epochs[-1]["examples"] / sum(e["seconds"] for e in epochs)
    return throughput, rec["timeline"]["run_start"] - launched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32, help="global batch of both sides")
    parser.add_argument("--set", action="append", default=None, metavar="SECTION.KEY=VALUE")
    args = parser.parse_args()
    extra = args.set or ["data.train_examples=4096", "training.epochs=2"]
    results = {1: [], 2: []}
    for _ in range(args.rounds):
        results[1].append(run_once(1, args.batch, extra))
        results[2].append(run_once(2, args.batch // 2, extra))
    print(
        f"tiny preset, random data, global batch {args.batch}, {' '.join(extra)}, "
        f"median of {args.rounds} rounds"
    )
    medians = {}
    for workers, runs in results.items():
        rate = statistics.median(r for r, _ in runs)
        startup = statistics.median(s for _, s in runs)
        medians[workers] = rate, startup
        listed = ", ".join(f"{r:.0f}" for r, _ in runs)
        print(
            f"  {workers} worker{'s' if workers > 1 else ' '}  {rate:8.1f} examples/s "
            f"(runs: {listed})   start-up {startup:5.1f} s"
        )
    print(f"  2 workers / 1 worker throughput  {medians[2][0] / medians[1][0]:.3f}x")
    print(f"  launcher start-up overhead       {medians[2][1] - medians[1][1]:+.1f} s")


if __name__ == "__main__":
    main()
