"""Reading a large record: `record.load` (regular-file read, strict JSON parse, schema and
consistency checks) against a bare `json.loads` of the same file, in the same run.

The record is the published Google entry grown to about `--megabytes` MB, written to a
temporary file: `--shape points` with evaluation points and epochs (a long run evaluated
often: millions of small objects, the worst case for the checks), `--shape text` with long
warning strings (few objects: the parse dominates). Reports the median of `--repeats` timed
loads of each, and their ratio.

    python benchmarks/record_validation.py [--megabytes 200] [--repeats 3] [--shape points]
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

from hpcai500_tf import record  # noqa: E402


def big_record(megabytes: float, shape: str = "points") -> dict:
    rec = json.loads((ROOT / "examples/published_2020/2_google.json").read_text())
    if shape == "text":
        rec["warnings"] += ["x" * 100_000] * int(megabytes * 10)
        return rec
    point_bytes = 110  # one curve point plus one epoch entry, as JSON with indent 2
    count = int(megabytes * 1e6 / point_bytes / 2)
    end = rec["quality"]["curve"][-1]
    curve = [
        {
            "epoch": i / count * end["epoch"],
            "elapsed_s": i / count * end["elapsed_s"],
            "examples": i * end["examples"] // count,
            "value": 0.5,
        }
        for i in range(1, count)
    ]
    rec["quality"]["curve"] = [*curve, end]
    rec["timeline"]["epochs"] = [
        {"epoch": i, "elapsed_s": p["elapsed_s"], "examples": p["examples"], "seconds": 0.01}
        for i, p in enumerate(curve, start=1)
    ]
    return rec


def timed(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=200.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shape", choices=("points", "text"), default="points")
    args = parser.parse_args()
    cpu = next(
        (line.split(":", 1)[1].strip() for line in subprocess.run(
            ["lscpu"], capture_output=True, text=True).stdout.splitlines()
         if line.startswith("Model name")),
        "unknown",
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "record.json"
        record.write_atomic(path, big_record(args.megabytes, args.shape))
        size = path.stat().st_size / 1e6
        bare = timed(lambda: json.loads(path.read_text()), args.repeats)
        full = timed(lambda: record.load(path), args.repeats)
    print(f"record of {size:.0f} MB ({args.shape}) on {cpu}, median of {args.repeats}")
    print(f"  json.loads alone      {bare:6.2f} s")
    print(f"  record.load (checked) {full:6.2f} s   ({full / bare:.2f}x of the bare parse)")
    print(f"  target: under 1 s -> {'met' if full < 1 else 'NOT met'}")


if __name__ == "__main__":
    main()
