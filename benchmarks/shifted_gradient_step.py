"""The ResNet-50 v1.5 train step (reference preset, random data, default strategy) with one
small-layer filter gradient of the CPU kernel set off and on (`models/kernels.py`): the
shifted one of stride-1 3x3 layers (`--workaround shifted`: SHIFTED_GRADIENT_MAX_SIZE 0 and
its value), the blocked one of stride-2 3x3 layers (`--workaround space-to-depth`:
SPACE_TO_DEPTH_MAX_OUTPUT 0 and 7) or the subsampled one of 1x1 stride-2 layers
(`--workaround subsampled`: SUBSAMPLED_GRADIENT_MAX_OUTPUT 0 and its value), "on" on any CPU
(the CPU-flag gate of the last two opened for it). Two engines in
one process, their steps alternated A B, B A, ... so that load on a shared machine hits both
alike (after one pair that is not timed).

Prints each pair's step times, the median step time of each side and the median of the
per-pair ratios off/on (> 1: the workaround is faster).

    python benchmarks/shifted_gradient_step.py [--workaround shifted] [--precision mixed]
        [--pairs 12]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

# The constant each workaround reads, its size when on (None: the constant's value), and the
# constant naming the CPU flag it is gated on (None: not gated).
WORKAROUNDS = {
    "shifted": ("SHIFTED_GRADIENT_MAX_SIZE", None, None),
    "space-to-depth": ("SPACE_TO_DEPTH_MAX_OUTPUT", 7, "SPACE_TO_DEPTH_MEASURED_ON"),
    "subsampled": ("SUBSAMPLED_GRADIENT_MAX_OUTPUT", None, "SUBSAMPLED_GRADIENT_MEASURED_ON"),
}


def timed_step(
    precision: str, batch: int, image_size: int, constant: str, max_size: int, gate=None
):
    """A function running one train step of an engine built with kernels.`constant` at
    `max_size` (and the CPU flag that kernels.`gate` names taken as present, where given),
    warmed up. Its step is traced once (the same batch every time), so what it was built with
    stays, whatever the constants are later."""
    from resnet_step import reference_engine

    from hpcai500_tf.models import kernels

    setattr(kernels, constant, max_size)  # read as the step is traced (below)
    flags = kernels.cpu_flags
    if gate:  # this CPU's flags and the gate's own, while the step is traced
        kernels.cpu_flags = lambda: set(flags()) | {getattr(kernels, gate)}
    engine, batch_ = reference_engine(precision, batch, image_size)

    def step() -> float:
        start = time.perf_counter()
        float(engine.train_step(batch_))  # reading the loss back syncs
        return time.perf_counter() - start

    step(), step()  # traced here, then warm
    kernels.cpu_flags = flags
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", default="mixed", choices=("fp32", "mixed"))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--pairs", type=int, default=12)
    parser.add_argument("--workaround", default="shifted", choices=tuple(WORKAROUNDS))
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from hpcai500_tf.models import kernels

    constant, on, gate = WORKAROUNDS[args.workaround]
    default = getattr(kernels, constant)
    setup = (args.precision, args.batch, args.image_size, constant)
    steps = {"off": timed_step(*setup, 0), "on": timed_step(*setup, on or default, gate)}
    setattr(kernels, constant, default)
    steps["off"](), steps["on"]()  # the first step after the other engine's build ran slow
    times = {"off": [], "on": []}
    for pair in range(args.pairs):
        order = ("off", "on") if pair % 2 == 0 else ("on", "off")
        for side in order:
            times[side].append(steps[side]())
        print(f"  pair {pair}: off {times['off'][-1]:.2f} s, on {times['on'][-1]:.2f} s")
    ratios = [off / on for off, on in zip(times["off"], times["on"], strict=True)]
    print(
        f"{args.workaround}, {args.precision}, batch {args.batch}, "
        f"{args.image_size}x{args.image_size}: median "
        f"step {statistics.median(times['off']):.3f} s off, {statistics.median(times['on']):.3f}"
        f" s on; off/on per pair median {statistics.median(ratios):.3f}x "
        f"({sum(r > 1 for r in ratios)} of {len(ratios)} pairs faster on)"
    )


if __name__ == "__main__":
    main()
