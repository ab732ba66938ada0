"""The GPUs a run may compute on, for every framework: how many this process may use, and
whether they compute in the precision asked for. TensorFlow's own checks of what it sees are
engine/devices.py's; PyTorch's, pytorch/build.py's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hpcai500_tf.cluster import machine
from hpcai500_tf.errors import UserError


def visible_gpu_count(environ: Mapping[str, str] | None = None) -> int:
    """The GPUs this process may use: NVML's, narrowed by CUDA_VISIBLE_DEVICES as CUDA reads
    it and to this worker's share (HPCAI500_WORKER_GPUS, `--workers N`). MIG instances are not
    resolved to GPUs: where they are named, at least one."""
    environ = os.environ if environ is None else environ
    gpus, _, _ = machine.nvidia_gpus()
    if not gpus:
        return 0
    indices, _ = machine.computing_gpus(environ, [gpu["uuid"] for gpu in gpus])
    return 1 if indices is None else len(indices)


BFLOAT16_CAPABILITY = (8, 0)  # bfloat16 tensor cores from Ampere (A100) on


def bfloat16_check(policy: str, capabilities: list[tuple[int, int]]) -> None:
    """A one-line UserError where bfloat16 was asked for on a GPU without bfloat16 arithmetic
    (before compute capability 8.0: V100, T4): it would run emulated or not at all."""
    older = sorted({c for c in capabilities if tuple(c) < BFLOAT16_CAPABILITY})
    if policy != "mixed_bfloat16" or not older:
        return
    names = ", ".join(f"{major}.{minor}" for major, minor in older)
    raise UserError(
        f"training.precision=bf16 on GPU compute capability {names}: these GPUs have no "
        "bfloat16 arithmetic (it needs 8.0, A100, or newer); use training.precision=fp16 "
        "(float16 with loss scaling, as the reference ran on V100) or mixed"
    )
