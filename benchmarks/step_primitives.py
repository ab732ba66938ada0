"""Where a ResNet-50 v1.5 train step's oneDNN time goes, by primitive: one step of the
reference preset (random data, default strategy, batch and precision as given) run with
ONEDNN_VERBOSE=1 in a child process, after warm-up steps, and oneDNN's own execution times
of that step's primitives summed by kind (convolution forward, backward data, backward
weights; matmul; reorder; ...), with the FLOP rate of each kind's convolutions and matmuls
from their problem descriptors (2 x outputs x the products per output) and, with `--slowest
N`, the N slowest convolutions and matmuls by rate.

The times are oneDNN's wall time per primitive: where TensorFlow runs two ops at once (its
inter-op threads) their times overlap, so the sum can exceed the step's wall time, and a
primitive sharing the cores runs slower than alone. The step's own wall time is printed
beside them.

    python benchmarks/step_primitives.py [--precision mixed] [--batch 32] [--slowest 12]
        [--keep-freed-memory]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
MARK = "STEP_PRIMITIVES"

CHILD = f"""
import sys, time
sys.path.insert(0, {str(ROOT)!r})
from resnet_step import reference_engine
engine, batch = reference_engine(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
for i in range(int(sys.argv[4]) + 1):
    start = time.perf_counter()
    print("{MARK} begin", i, flush=True)
    float(engine.traced_train_step(*batch))
    print("{MARK} end", i, time.perf_counter() - start, flush=True)
"""


def primitive_flops(kind: str, problem: str) -> float:
    """FLOPs of a convolution or matmul from oneDNN's problem descriptor; 0 for the rest."""
    if kind == "convolution":
        dims = {k: int(v) for k, v in re.findall(r"([a-z]+)(\d+)", problem)}
        outputs = dims["mb"] * dims["oc"] * dims["oh"] * dims["ow"] * dims.get("g", 1)
        return 2.0 * outputs * dims["ic"] // dims.get("g", 1) * dims["kh"] * dims["kw"]
    if kind == "matmul":
        shapes = re.match(r"(?:\d+x)*?(\d+)x(\d+):(?:\d+x)*?(\d+)x(\d+)", problem)
        if shapes:
            m, k, _, n = map(int, shapes.groups())
            batch = re.match(r"((?:\d+x)*)\d+x\d+:", problem).group(1)
            repeats = 1
            for size in filter(None, batch.split("x")):
                repeats *= int(size)
            return 2.0 * repeats * m * k * n
    return 0.0


def executed(lines: list[str], step: int) -> tuple[list[tuple[str, str, str, float]], float]:
    """(kind, propagation, problem, ms) of each primitive executed in step `step`, and the
    step's wall time (s)."""
    inside, found, wall = False, [], 0.0
    for line in lines:
        if line.startswith(f"{MARK} begin {step}"):
            inside = True
        elif line.startswith(f"{MARK} end {step}"):
            wall = float(line.split()[-1])
            break
        elif inside and line.startswith("onednn_verbose") and ",exec," in line:
            fields = line.split(",")
            found.append((fields[5], fields[7], fields[-2], float(fields[-1])))
    return found, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", default="mixed", choices=("fp32", "mixed"))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--keep-freed-memory", action="store_true")
    parser.add_argument("--slowest", type=int, default=0)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from resnet_step import KEEP_FREED_MEMORY

    env = {**os.environ, "ONEDNN_VERBOSE": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.update(KEEP_FREED_MEMORY if args.keep_freed_memory else {})
    command = [sys.executable, "-c", CHILD, args.precision, str(args.batch)]
    command += [str(args.image_size), str(args.warmup)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(f"the step failed: {result.stderr.strip().splitlines()[-1:]}")
    primitives, wall = executed(result.stdout.splitlines(), args.warmup)
    if not primitives:
        raise SystemExit("no oneDNN primitive ran: is oneDNN on (TF_ENABLE_ONEDNN_OPTS)?")
    report(primitives, wall, args)


def report(primitives: list, wall: float, args) -> None:
    times, counts, flops = collections.Counter(), collections.Counter(), collections.Counter()
    for kind, propagation, problem, ms in primitives:
        key = (kind, propagation)
        times[key] += ms
        counts[key] += 1
        flops[key] += primitive_flops(kind, problem)
    print(
        f"ResNet-50 v1.5 train step ({args.precision}), batch {args.batch}, "
        f"{args.image_size}x{args.image_size}: {wall * 1e3:.0f} ms wall, "
        f"{sum(times.values()):.0f} ms in oneDNN primitives"
    )
    for (kind, propagation), ms in times.most_common():
        rate = (
            f"{flops[(kind, propagation)] / ms / 1e6:7.0f} GFLOP/s"
            if flops[(kind, propagation)]
            else ""
        )
        count = counts[(kind, propagation)]
        print(f"  {kind:14s} {propagation:18s} {count:4d} x  {ms:8.1f} ms  {rate}")
    rated = [(primitive_flops(k, p) / ms / 1e6, k, d, p, ms) for k, d, p, ms in primitives]
    rated = [entry for entry in rated if entry[0] > 0]
    for rate, kind, propagation, problem, ms in sorted(rated)[: args.slowest]:
        print(f"  slow: {rate:6.0f} GFLOP/s {ms:7.1f} ms  {kind} {propagation} {problem}")


if __name__ == "__main__":
    main()
