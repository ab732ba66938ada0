"""The devices a TensorFlow run computes on, checked against the GPUs this machine has
(cluster/devices.py counts those, for every framework).

When CUDA's libraries fail to load, TensorFlow quietly computes on the CPU (its warning is one
of the messages TF_CPP_MIN_LOG_LEVEL=2 hides): the precision policy turns to bfloat16 and L1
still lists the GPUs NVML sees. A run is therefore refused where TensorFlow sees fewer GPUs
than this process may use, unless --allow-cpu is given (then the record says so).

On a GPU for which TensorFlow's binary holds no compiled kernels (SASS), CUDA compiles them
from PTX on first use: minutes that look like a hang. That is announced before the first step.

The checks are pure functions of plain values; `check_devices` gathers those from NVML,
CUDA_VISIBLE_DEVICES, this worker's share (HPCAI500_WORKER_GPUS), TensorFlow and the strategy.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from hpcai500_tf.cluster import machine
from hpcai500_tf.cluster.devices import bfloat16_check
from hpcai500_tf.errors import UserError

CHECK_COMMAND = (
    "python -c \"import tensorflow as tf; print(tf.config.list_physical_devices('GPU'))\""
)
CACHE_MAXSIZE_ADVICE = 4 * 1024**3  # CUDA_CACHE_MAXSIZE's largest value: 4 GiB


def gpu_check(visible: int, tensorflow_gpus: int, allow_cpu: bool) -> str | None:
    """None where TensorFlow sees every GPU this process may use (or there are none); else a
    warning for the record when `allow_cpu`, and otherwise a one-line UserError naming the
    checks that find a broken CUDA install."""
    if tensorflow_gpus >= visible:
        return None
    plural = "s" if visible > 1 else ""
    if tensorflow_gpus == 0:
        problem = (
            f"this machine has {visible} GPU{plural} this process may use (NVML, "
            "CUDA_VISIBLE_DEVICES) but TensorFlow sees none: the run would compute on the CPU"
        )
    else:
        problem = (
            f"TensorFlow sees {tensorflow_gpus} of the {visible} GPUs this process may use "
            f"(NVML, CUDA_VISIBLE_DEVICES): the run would compute on {tensorflow_gpus} only"
        )
    if allow_cpu:
        return f"{problem} (allowed by --allow-cpu)"
    raise UserError(
        f"{problem}; check the CUDA install: `{CHECK_COMMAND}` should list them "
        "(TF_CPP_MIN_LOG_LEVEL=0 shows why not), the cuda extra (tensorflow[and-cuda]) "
        "installs CUDA's libraries, `nvidia-smi` shows the driver; or pass --allow-cpu"
    )


def device_kind(device: str) -> str:
    """'GPU' or 'CPU' (upper case) from a device name such as
    /job:localhost/replica:0/task:0/device:GPU:0."""
    return device.rsplit("device:", 1)[-1].split(":")[0].upper()


def devices_used(strategy, tensorflow_gpus: int) -> list[str]:
    """The devices the strategy computes on. The default strategy does not say: TensorFlow
    places its ops on the first GPU, else on the CPU."""
    try:
        return [str(device) for device in strategy.extended.worker_devices]
    except RuntimeError:  # the default strategy: "worker_devices() method unsupported"
        kind = "GPU" if tensorflow_gpus else "CPU"
        return [f"/job:localhost/replica:0/task:0/device:{kind}:0"]


_ARCHITECTURE = re.compile(r"(sm|compute)_(\d+)(\d)([af]?)")


def _architectures(compiled: list[str]) -> list[tuple[str, int, int, str]]:
    """(sm or compute, major, minor, suffix) of each entry of the build's
    cuda_compute_capabilities (e.g. sm_89, compute_90, sm_90a, sm_100f)."""
    found = []
    for entry in compiled:
        match = _ARCHITECTURE.fullmatch(str(entry).strip().lower())
        if match:
            kind, major, minor, suffix = match.groups()
            found.append((kind, int(major), int(minor), suffix))
    return found


def _runs_on(architecture: tuple[str, int, int, str], capability: tuple[int, int]) -> bool:
    """Whether code built for `architecture` runs on a GPU of `capability`: SASS on the same
    major version at an equal or higher minor, PTX on any equal or higher capability; an
    arch-specific build ("a") only on its own capability."""
    kind, major, minor, suffix = architecture
    if suffix == "a":
        return (major, minor) == capability
    if kind == "sm":
        return major == capability[0] and minor <= capability[1]
    return (major, minor) <= capability


def compile_notice(
    capabilities: list[tuple[int, int]], compiled: list[str], environ: Mapping[str, str]
) -> str | None:
    """One console line where a GPU's compute capability has no SASS in the build, only PTX
    that CUDA compiles on first use, naming where the compiled kernels are cached; None
    otherwise (and on a CPU build, which lists no architectures)."""
    architectures = _architectures(compiled)
    sass = [a for a in architectures if a[0] == "sm"]
    ptx = [a for a in architectures if a[0] == "compute"]
    jit = sorted(
        {
            capability
            for capability in capabilities
            if not any(_runs_on(a, capability) for a in sass)
            and any(_runs_on(a, capability) for a in ptx)
        }
    )
    if not jit:
        return None
    names = ", ".join(f"{major}.{minor}" for major, minor in jit)
    home = environ.get("HOME") or str(Path.home())
    cache = (
        f"{environ['CUDA_CACHE_PATH']} (CUDA_CACHE_PATH)"
        if environ.get("CUDA_CACHE_PATH")
        else f"{Path(home) / '.nv' / 'ComputeCache'} (CUDA_CACHE_PATH moves it)"
    )
    if environ.get("CUDA_CACHE_DISABLE") == "1":
        keep = "CUDA_CACHE_DISABLE=1 turns the cache off: every run compiles them again"
    elif environ.get("CUDA_CACHE_MAXSIZE"):
        keep = f"kept in {cache}, up to CUDA_CACHE_MAXSIZE={environ['CUDA_CACHE_MAXSIZE']} bytes"
    else:
        keep = (
            f"kept in {cache} for later runs; set "
            f"CUDA_CACHE_MAXSIZE={CACHE_MAXSIZE_ADVICE} so that they all fit"
        )
    return (
        f"GPU compute capability {names}: this TensorFlow build has no compiled kernels for it "
        f"(built for {', '.join(compiled)}), so CUDA compiles them from PTX on first use, "
        f"which can take many minutes and look like a hang; {keep}"
    )


def check_devices(strategy, allow_cpu: bool, view=None, policy: str = "float32") -> list[str]:
    """Refuse a run whose TensorFlow sees fewer GPUs than this process may use (unless
    `allow_cpu`), or that asks for bfloat16 (`policy`, Keras's name) on GPUs without it;
    announce a first-use compile on `view`, else on stderr. Call once the strategy is built.
    Returns the warnings for the record."""
    import tensorflow as tf

    gpus = tf.config.get_visible_devices("GPU")  # this worker's share where one was set
    used = devices_used(strategy, len(gpus))
    # A strategy computing on no GPU is the same fallback as TensorFlow seeing none.
    computing = len(gpus) if any(device_kind(device) == "GPU" for device in used) else 0
    warning = gpu_check(machine.visible_gpu_count(), computing, allow_cpu)
    capabilities = []
    for gpu in gpus:
        capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
        if capability:
            capabilities.append(tuple(capability))
    if computing:
        bfloat16_check(policy, capabilities)
    compiled = tf.sysconfig.get_build_info().get("cuda_compute_capabilities") or []
    notice = compile_notice(capabilities, list(compiled), os.environ)
    for line in filter(None, (warning, notice)):
        if view:
            view.message(line)
        else:
            print(line, file=sys.stderr, flush=True)
    return [warning] if warning else []
