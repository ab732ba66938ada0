"""The roofline's measured GEMM ceiling (TensorFlow) against numpy.matmul and torch.matmul on
the same machine, in the same run: fp32 against the best of numpy and torch, bf16 against
torch. Every side chains each multiply on the previous result, tries B as stored and transposed,
and reports the best median GFLOP/s over the sizes.

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
import os
import statistics
import time


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="512,1024,2048")
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--threads", type=int, help="threads for every side (default: all)")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sizes = [int(s) for s in args.sizes.split(",")]
    import numpy as np
    import tensorflow as tf
    import torch

    from hpcai500_tf.roofline import kernels

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
        torch.set_num_threads(args.threads)
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.threads)

    best = {}
    for n in sizes:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = (rng.standard_normal((n, n), dtype=np.float32) / n**0.5).astype(np.float32)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        rates = {
            ("tensorflow", "fp32"): kernels.gemm(n, "fp32", args.seconds)[0],
            ("numpy", "fp32"): max(
                chained_rate(lambda x, m=m: x @ m, a, n, args.seconds) for m in (b, b.T)
            ),
            ("torch", "fp32"): max(
                chained_rate(lambda x, m=m: torch.matmul(x, m), ta, n, args.seconds)
                for m in (tb, tb.t())
            ),
            ("tensorflow", "bf16"): kernels.gemm(n, "bf16", args.seconds)[0],
            ("torch", "bf16"): max(
                chained_rate(lambda x, m=m: torch.matmul(x, m), ta.bfloat16(), n, args.seconds)
                for m in (tb.bfloat16(), tb.bfloat16().t())
            ),
        }
        for key, rate in rates.items():
            best[key] = max(best.get(key, 0.0), rate)
        print(
            f"n={n:5d}  "
            + "  ".join(f"{fw} {dt} {r / 1e9:7.1f}" for (fw, dt), r in rates.items())
            + "  GFLOP/s"
        )
    try:
        from threadpoolctl import threadpool_info

        blas = [
            f"{i.get('internal_api')} {i.get('architecture', '')}"
            for i in threadpool_info()
            if i.get("user_api") == "blas"
        ]
        print("numpy BLAS:", ", ".join(blas) or "unknown")
    except ImportError:
        print("numpy BLAS: threadpoolctl not installed")
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
