"""Which PyTorch this is, and whether it can run what the runner asks: checks that end in one
line naming the install to use, shared by the runner and the benchmarks that measure PyTorch.

Installs (see docs/frameworks.md, "Installing PyTorch"): a CPU-only build,
    pip install torch --index-url https://download.pytorch.org/whl/cpu
or PyPI's default Linux x86-64 build, which is a CUDA build with its CUDA libraries and triton.
"""

from __future__ import annotations

import platform
import re
import sys

from hpcai500_tf import freed_memory
from hpcai500_tf.errors import UserError

MINIMUM = (2, 3)  # torch.amp.GradScaler("cuda", ...) and torch.utils.flop_counter
CPU_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
CUDA_INSTALL = "pip install torch (PyPI's Linux build is a CUDA build; see pytorch.org for others)"


def import_torch():
    """torch, or one line saying how to install a torch this runner can use."""
    try:
        import torch
    except ImportError:
        raise UserError(
            "PyTorch is not installed: pip install 'hpcai500-tf[torch]' (the torch extra), "
            f"or {CPU_INSTALL} (CPU only), or {CUDA_INSTALL}"
        ) from None
    if version_tuple(torch.__version__) < MINIMUM:
        raise UserError(
            f"torch {torch.__version__} is too old for the PyTorch runner (needs >= "
            f"{'.'.join(map(str, MINIMUM))}): pip install -U 'torch>=2.3'"
        )
    return torch


def version_tuple(version: str) -> tuple[int, int]:
    numbers = re.findall(r"\d+", version.split("+")[0])[:2]
    return tuple(int(n) for n in numbers) + (0,) * (2 - len(numbers))


def torch_build(torch) -> str:
    """The build in words: version, CUDA or CPU, triton, where it runs."""
    kind = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
    if torch.version.hip:
        kind = f"ROCm {torch.version.hip} build"
    try:
        from importlib.metadata import version

        triton = f", triton {version('triton')} installed"
    except Exception:  # noqa: BLE001 - not installed (or unreadable metadata)
        triton = ""
    where = "a GPU" if torch.cuda.is_available() else "the CPU"
    return f"torch {torch.__version__} ({kind}{triton}; computing on {where})"


def library_layers(torch) -> tuple[dict, dict]:
    """L4 (accelerator libraries) and L5 (framework) of this torch, as its build reports them."""
    import numpy

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    l4 = {
        "cuda_build": torch.version.cuda is not None,
        "cuda_version": torch.version.cuda,
        "cudnn_version": None if cudnn is None else str(cudnn),
        "rocm_build": torch.version.hip is not None,
        "onednn": torch.backends.mkldnn.is_available(),
    }
    l5 = {
        "framework": "pytorch",
        "framework_version": torch.__version__,
        "framework_build": torch_build(torch),
        "numpy_version": numpy.__version__,
        "python_version": platform.python_version(),
        "python_implementation": sys.implementation.name,
        "freed_memory": freed_memory.state(),  # glibc keeping it, or why not
    }
    return l4, l5


def nvidia_gpus_present() -> bool:
    """Whether this machine has NVIDIA GPUs (NVML), whatever torch can see."""
    from hpcai500_tf.cluster import machine

    return bool(machine.nvidia_gpus()[0])


def choose_device(torch, asked: str):
    """The device to train on; a GPU this torch cannot use is refused, never silently skipped."""
    usable = torch.cuda.is_available()
    if asked == "cuda" and not usable:
        if not torch.version.cuda and not torch.version.hip:
            raise UserError(f"--device cuda: this torch is a CPU-only build: {CUDA_INSTALL}")
        raise UserError(
            "--device cuda: this CUDA build of torch sees no usable GPU (check nvidia-smi and "
            "that the driver supports CUDA " + str(torch.version.cuda) + ")"
        )
    if asked == "auto" and not usable and nvidia_gpus_present():
        raise UserError(
            "this machine has NVIDIA GPUs but this torch cannot use them: "
            + (
                f"it is a CPU-only build ({CUDA_INSTALL})"
                if not torch.version.cuda
                else f"its CUDA {torch.version.cuda} needs a newer driver (check nvidia-smi)"
            )
            + "; pass --device cpu to train on the CPU on purpose"
        )
    return torch.device("cuda" if asked != "cpu" and usable else "cpu")


def check_mixed_precision(torch, device, policy: str) -> None:
    """Mixed precision (`policy`: mixed_float16 or mixed_bfloat16) needs autocast kernels for
    convolutions in its type, and bfloat16 needs a GPU that computes in it (8.0, A100, on)."""
    dtype = torch.float16 if policy == "mixed_float16" else torch.bfloat16
    if device.type == "cuda":
        from hpcai500_tf.cluster.devices import bfloat16_check  # both frameworks' check

        bfloat16_check(policy, [tuple(torch.cuda.get_device_capability(device))])
    try:
        with torch.autocast(device.type, dtype=dtype):
            x = torch.ones(1, 2, 4, 4, device=device)
            torch.nn.functional.conv2d(x, torch.ones(2, 2, 1, 1, device=device)).sum().item()
    except RuntimeError as error:
        first = str(error).strip().splitlines()[0][:200]
        raise UserError(
            f"this torch build has no {dtype} autocast convolution on {device.type} ({first}): "
            f"set training.precision='fp32', or install a newer torch ({CPU_INSTALL})"
        ) from None
