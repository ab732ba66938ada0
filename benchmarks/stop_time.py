"""Seconds from a stop signal to the exit of every worker of a `train` run (#38's bound: at
most two steps, the checkpoint write and 10 s).

Each round starts `hpcai500-tf train image_classification --preset P --workers N` (N = 1: the
CLI process trains itself; N = 2: the launcher's two workers), waits until the run's MLPerf
log shows the second epoch started, waits `--into` seconds more (mid-epoch), sends SIGTERM to
the last worker (the non-chief on two), and times until every worker process and the launcher
have exited. The stopped record's warning and its stop checkpoint are checked, so a round that
did not stop at a checkpoint is reported, not timed. A full-size ResNet-50 checkpoint write is
timed by `benchmarks/checkpoint_overhead.py`; the real Slurm's scancel-to-exit is printed by
`tests/test_real_slurm.py`'s scancel test (`-m slow -s`).

    python benchmarks/stop_time.py [--workers 1 2] [--rounds 3] [--preset tiny]
        [--framework tensorflow|pytorch] [--set K=V ...]

Prints one JSON line per worker count (the seconds of every round and their median), then one
line for people.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpcai500_tf.cluster.machine import cpu_facts

ROOT = Path(__file__).resolve().parents[1]


def _workers(launcher: int, count: int) -> list[int]:
    """The processes that train: the CLI itself on one worker, else its children."""
    if count == 1:
        return [launcher]
    children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    return sorted(map(int, children))


def one_round(args, workers: int, out: Path) -> float | None:
    command = [sys.executable, "-m", "hpcai500_tf.cli", "train", "image_classification",
               "--preset", args.preset, "--set", "training.epochs=1000", "--power-hz", "0",
               "--no-tensorboard", "--framework", args.framework, "--out", str(out),
               *(f"--set={s}" for s in args.set)]  # fmt: skip
    if workers > 1:
        command += ["--workers", str(workers)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with (out.parent / "stderr").open("w") as stderr:  # a pipe left unread could fill
        launcher = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.time() + 600
        while time.time() < deadline and launcher.poll() is None:
            logs = list(out.glob("*/mlperf.log"))
            if logs and logs[0].read_text().count('"epoch_start"') >= 2:
                break
            time.sleep(0.02)
        time.sleep(args.into)
        pids = _workers(launcher.pid, workers)
        sent = time.monotonic()
        os.kill(pids[-1], signal.SIGTERM)
        while any(Path(f"/proc/{pid}").exists() and pid != launcher.pid for pid in pids):
            time.sleep(0.01)
        launcher.wait(120)
        seconds = time.monotonic() - sent
    finally:
        if launcher.poll() is None:
            launcher.kill()
    (record_path,) = out.glob("*/record.json")
    record = json.loads(record_path.read_text())
    stopped = record["status"] == "stopped" and any(
        "was written at the stop" in w for w in record["warnings"]
    )
    return seconds if stopped else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--framework", choices=("tensorflow", "pytorch"), default="tensorflow")
    parser.add_argument("--into", type=float, default=0.3, help="seconds into epoch 2")
    parser.add_argument("--set", action="append", default=[], metavar="K=V")
    args = parser.parse_args()
    for workers in args.workers:
        seconds = []
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="stop-time-") as scratch:
                seconds.append(one_round(args, workers, Path(scratch) / "runs"))
        timed = [s for s in seconds if s is not None]
        result = {
            "benchmark": "stop_time", "framework": args.framework, "workers": workers,
            "preset": args.preset, "overrides": args.set, "seconds": seconds,
            "median_s": statistics.median(timed) if timed else None,
            "not_stopped_at_a_checkpoint": len(seconds) - len(timed),
            "method": "SIGTERM to the last worker mid-epoch 2 until every process exited",
            "cpu": cpu_facts()["cpu_model"],
        }  # fmt: skip
        print(json.dumps(result), flush=True)
        median = f"{result['median_s']:.2f} s" if timed else "no round stopped at a checkpoint"
        print(f"{args.framework}, {workers} worker(s): signal to exit {median}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
