"""import-mlperf against the size of its log: a log of the hand-written shape with N distinct
`opt_*` keys (and as many junk lines between them), imported at two sizes in the same run. A
linear importer takes about --factor times as long for --factor times the keys; the old per-key
scan took the square of that (37 s for 50,000 keys on a 2-core AMD EPYC).

    python benchmarks/mlperf_import_scale.py [--keys 250000] [--factor 10]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcai500_tf.mlperf import mlperf_import  # noqa: E402


def line(key: str, value=None, time_ms: int = 1000, **metadata) -> str:
    event = {"namespace": "", "time_ms": time_ms, "event_type": "POINT_IN_TIME", "key": key,
             "value": value, "metadata": metadata}  # fmt: skip
    return ":::MLLOG " + json.dumps(event)


def write_log(path: Path, keys: int) -> int:
    """A complete ResNet log with `keys` distinct opt_* keys and a junk line beside each."""
    head = [line("submission_benchmark", "resnet"), line("global_batch_size", 256),
            line("train_samples", 1024), line("run_start", time_ms=10_000)]  # fmt: skip
    tail = [line("epoch_stop", time_ms=20_000, epoch_num=1),
            line("eval_accuracy", 0.8, time_ms=21_000, epoch_num=1),
            line("run_stop", time_ms=22_000, status="success")]  # fmt: skip
    with path.open("w") as handle:
        handle.write("\n".join(head) + "\n")
        for i in range(keys):
            handle.write(f"{line(f'opt_k{i}', i)}\nrank {i % 8}: some framework output\n")
        handle.write("\n".join(tail) + "\n")
    return path.stat().st_size


def timed_import(path: Path) -> float:
    start = time.perf_counter()
    mlperf_import.build_record(str(path), {"framework": "x", "flops_per_example": 1.0})
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=250_000)
    parser.add_argument("--factor", type=int, default=10)
    args = parser.parse_args()
    model = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    cpu = next((ln.split(":", 1)[1].strip() for ln in model.splitlines()
                if ln.startswith("Model name")), platform.processor())  # fmt: skip
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for keys in (args.keys, args.keys * args.factor):
            path = Path(scratch) / f"{keys}.log"
            size = write_log(path, keys)
            results[keys] = {"megabytes": round(size / 1e6, 1), "seconds": timed_import(path)}
            path.unlink()
    small, large = (results[k]["seconds"] for k in sorted(results))
    ratio = large / small
    for keys, r in sorted(results.items()):
        print(f"{keys:>9,} keys, {r['megabytes']:7.1f} MB: {r['seconds']:6.2f} s")
    print(f"{args.factor}x the keys took {ratio:.1f}x the time (linear: ~{args.factor}x; "
          f"quadratic: ~{args.factor**2}x) on {cpu}")  # fmt: skip
    print(json.dumps({"cpu": cpu, "results": results, "time_ratio": ratio,
                      "keys_ratio": args.factor}))  # fmt: skip


if __name__ == "__main__":
    main()
