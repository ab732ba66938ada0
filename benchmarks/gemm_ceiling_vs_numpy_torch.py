"""The roofline's measured GEMM ceiling (TensorFlow) against numpy.matmul and torch.matmul on
the same machine, in the same run: fp32 against the best of numpy and torch, bf16 against
torch. Each side runs in a process of its own, chains each multiply on the previous result,
tries B as stored and transposed, and reports the best median GFLOP/s over the sizes; the
builds measured (TensorFlow, numpy's BLAS, torch: CPU-only or CUDA) are printed first.

    python benchmarks/gemm_ceiling_vs_numpy_torch.py [--sizes 512,1024,2048] [--seconds 0.5]
        [--threads N]

`--threads 1` compares the kernels themselves, with no threading runtime in between
(TensorFlow's oneDNN runs on its own thread pool, torch's on OpenMP).

OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE, if set on this machine, slow numpy's OpenBLAS: unset
both for this command alone to measure numpy at its best (the script reports the kernel
numpy's BLAS uses, through threadpoolctl when installed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("tensorflow", "numpy", "torch")


def chained_rate(multiply, start, n: int, seconds: float) -> float:
    x = multiply(start)  # warm-up
    count = 1
    while True:
        begin = time.perf_counter()
        x = start
        for _ in range(count):
            x = multiply(x)
        elapsed = time.perf_counter() - begin
        if elapsed >= seconds / 5:
            break
        count *= 2
    samples = []
    for _ in range(5):
        begin = time.perf_counter()
        x = start
        for _ in range(count):
            x = multiply(x)
        samples.append((time.perf_counter() - begin) / count)
    return 2 * n**3 / statistics.median(samples)


def measure(side: str, sizes: list[int], seconds: float, threads: int | None) -> dict:
    """GFLOP/s of one side ("tensorflow", "numpy" or "torch") per size and dtype. Each side
    runs in a process of its own: TensorFlow and a CUDA build of torch must not share one
    (see hpcai500_tf/pytorch/feeder.py)."""
    import numpy as np

    if threads:
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads)
    results, about = {}, {}
    if side == "tensorflow":
        import tensorflow as tf

        from hpcai500_tf.roofline import timed_ops

        if threads:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        about["build"] = f"TensorFlow {tf.__version__}"
    elif side == "torch":
        import torch

        from hpcai500_tf.pytorch.build import torch_build

        if threads:
            torch.set_num_threads(threads)
        about["build"] = torch_build(torch)
    else:
        try:
            from threadpoolctl import threadpool_info

            blas = [
                f"{i.get('internal_api')} {i.get('architecture', '')}"
                for i in threadpool_info()
                if i.get("user_api") == "blas"
            ]
            about["build"] = f"numpy {np.__version__}, BLAS: " + (", ".join(blas) or "unknown")
        except ImportError:
            about["build"] = f"numpy {np.__version__}, BLAS: threadpoolctl not installed"
    for n in sizes:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = (rng.standard_normal((n, n), dtype=np.float32) / n**0.5).astype(np.float32)
        if side == "tensorflow":
            rates = {dt: timed_ops.gemm(n, dt, seconds)[0] for dt in ("fp32", "bf16")}
        elif side == "numpy":
            rates = {
                "fp32": max(chained_rate(lambda x, m=m: x @ m, a, n, seconds) for m in (b, b.T))
            }
        else:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            rates = {
                "fp32": max(
                    chained_rate(lambda x, m=m: torch.matmul(x, m), ta, n, seconds)
                    for m in (tb, tb.t())
                ),
                "bf16": max(
                    chained_rate(lambda x, m=m: torch.matmul(x, m), ta.bfloat16(), n, seconds)
                    for m in (tb.bfloat16(), tb.bfloat16().t())
                ),
            }
        results[str(n)] = rates
    return {"rates": results, **about}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="512,1024,2048")
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--threads", type=int, help="threads for every side (default: all)")
    parser.add_argument("--one", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.one:
        print(json.dumps(measure(args.one, sizes, args.seconds, args.threads)))
        return
    sides = {}
    for side in SIDES:
        command = [sys.executable, __file__, "--one", side, "--sizes", args.sizes]
        command += ["--seconds", str(args.seconds)]
        if args.threads:
            command += ["--threads", str(args.threads)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(
                f"the {side} side failed (exit code {result.returncode}):\n{result.stderr[-2000:]}"
            )
        sides[side] = json.loads(result.stdout.strip().splitlines()[-1])
        print(f"{side}: {sides[side]['build']}")
    best = {}
    for n in sizes:
        rates = {
            (side, dtype): rate
            for side in SIDES
            for dtype, rate in sides[side]["rates"][str(n)].items()
        }
        for key, rate in rates.items():
            best[key] = max(best.get(key, 0.0), rate)
        print(
            f"n={n:5d}  "
            + "  ".join(f"{fw} {dt} {r / 1e9:7.1f}" for (fw, dt), r in rates.items())
            + "  GFLOP/s"
        )
    fp32_peer = max(best[("numpy", "fp32")], best[("torch", "fp32")])
    print(
        f"best fp32: TensorFlow {best[('tensorflow', 'fp32')] / 1e9:.1f}, numpy "
        f"{best[('numpy', 'fp32')] / 1e9:.1f}, torch {best[('torch', 'fp32')] / 1e9:.1f} "
        f"GFLOP/s -> TF / best peer {best[('tensorflow', 'fp32')] / fp32_peer:.3f}x"
    )
    print(
        f"best bf16: TensorFlow {best[('tensorflow', 'bf16')] / 1e9:.1f}, torch "
        f"{best[('torch', 'bf16')] / 1e9:.1f} GFLOP/s -> TF / torch "
        f"{best[('tensorflow', 'bf16')] / best[('torch', 'bf16')]:.3f}x"
    )


if __name__ == "__main__":
    main()
