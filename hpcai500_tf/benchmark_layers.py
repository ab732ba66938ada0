"""The nine layers of the system under test: what can be observed of L1-L5 on this machine.

L6-L9 (programming model, workload, hyperparameters, problem) are set by a run's config and
filled in by the engine. Values that cannot be observed are recorded as None, never guessed.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
from pathlib import Path

from hpcai500_tf.config import peak_learning_rate

# ISA features that decide which kernels a CPU can run fast for training.
_RELEVANT_ISA = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "sve",
)


def _cpuinfo() -> dict:
    info = {"model": None, "flags": [], "sockets": None}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    physical_ids = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name" and info["model"] is None:
            info["model"] = value
        elif key in ("flags", "Features") and not info["flags"]:
            info["flags"] = value.split()
        elif key == "physical id":
            physical_ids.add(value)
    info["sockets"] = len(physical_ids) or None
    return info


def _memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.system()


@functools.lru_cache(maxsize=1)
def nvidia_gpus() -> tuple[list[dict], str | None, str | None]:
    """GPUs seen by NVML: (devices, driver version, why none were listed)."""
    try:
        import pynvml  # provided by nvidia-ml-py
    except ImportError:
        return [], None, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return [], None, f"NVML unavailable ({error})"
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            devices.append(
                {
                    "index": index,
                    "model": pynvml.nvmlDeviceGetName(handle),
                    "memory_bytes": int(memory.total),
                }
            )
        return devices, driver, None
    finally:
        pynvml.nvmlShutdown()


def hardware_layer(workers: int = 1) -> dict:
    cpu = _cpuinfo()
    gpus, _, gpu_note = nvidia_gpus()
    cores = os.cpu_count()
    if gpus:
        models = sorted({g["model"] for g in gpus})
        summary = f"{len(gpus)} x {', '.join(models)}"
    else:
        summary = f"{cpu['model'] or platform.processor() or 'unknown CPU'} ({cores} cores)"
    if workers > 1:
        summary = f"{workers} workers x {summary}"
    return {
        "summary": summary,
        "cpu_model": cpu["model"],
        "cpu_sockets": cpu["sockets"],
        "cpu_logical_cores": cores,
        "cpu_isa": [flag for flag in _RELEVANT_ISA if flag in cpu["flags"]],
        "machine": platform.machine(),
        "memory_bytes": _memory_bytes(),
        "accelerators": gpus,
        "accelerator_note": gpu_note,
        "workers": workers,
        "interconnect": None,  # not observable from inside a process; set in config if known
    }


def os_layer() -> dict:
    _, driver, _ = nvidia_gpus()
    return {
        "os": _os_name(),
        "kernel": platform.release(),
        "gpu_driver": driver,
        "python": platform.python_version(),
    }


def library_layers() -> tuple[dict, dict]:
    """L4 (accelerator libraries) and L5 (framework), read from the TensorFlow build."""
    import keras
    import numpy
    import tensorflow as tf

    build = tf.sysconfig.get_build_info()
    onednn_env = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    l4 = {
        "cuda_build": bool(build.get("is_cuda_build")),
        "cuda_version": build.get("cuda_version"),
        "cudnn_version": build.get("cudnn_version"),
        "rocm_build": bool(build.get("is_rocm_build")),
        # TF enables oneDNN on x86 by default; the variable turns it off with "0".
        "onednn": onednn_env != "0" and platform.machine() in ("x86_64", "AMD64"),
    }
    l5 = {
        "framework": "tensorflow",
        "framework_version": tf.__version__,
        "keras_version": keras.__version__,
        "numpy_version": numpy.__version__,
        "python_version": platform.python_version(),
        "python_implementation": sys.implementation.name,
    }
    return l4, l5


def system_layers(workers: int = 1, collective: str | None = None) -> dict[str, dict]:
    """L1-L5 of this machine as far as they can be observed."""
    l4, l5 = library_layers()
    return {
        "L1": hardware_layer(workers),
        "L2": os_layer(),
        "L3": {
            "collective_implementation": collective,
            "note": None if collective else "single worker: no cross-worker collectives",
        },
        "L4": l4,
        "L5": l5,
    }


def run_layers(
    setup,
    workload,
    *,
    workers: int,
    replicas: int,
    global_batch: int,
    precision: str,
    intra_op_threads: int,
) -> dict[str, dict]:
    """L6-L9 of a run, in terms every framework's runner shares (`setup`: config.Setup;
    `workload`: a workload, or the PyTorch runner's facts of one)."""
    t, o = setup.training, setup.optimizer
    return {
        "L6": {
            "parallelism": "data_parallel",
            "synchronous": True,
            "strategy": t.strategy,
            "workers": workers,
            "replicas": replicas,
            "batch_per_replica": t.batch_per_replica,
            "global_batch": global_batch,
            "intra_op_threads": intra_op_threads,
        },
        "L7": {
            **workload.workload_layer(),
            "kernels": workload.kernels,  # what ran: "cpu-workarounds" or "stock", not "auto"
            "precision": precision,
            "xla": t.xla,
        },
        "L8": {
            "optimizer": "sgd_momentum" if o.name == "sgd" else "lars",
            "momentum": o.momentum,
            "weight_decay": o.weight_decay,
            "decay_all_variables": o.decay_all_variables,
            "label_smoothing": o.label_smoothing,
            "lr_schedule": f"warmup_{o.schedule}",
            "base_learning_rate": o.base_learning_rate,
            "peak_learning_rate": peak_learning_rate(o, global_batch),
            "warmup_epochs": o.warmup_epochs,
            "seed": t.seed,
            **({"lars_eta": o.lars_eta} if o.name == "lars" else {}),
            **(
                {"step_boundaries": o.step_boundaries, "step_factor": o.step_factor}
                if o.schedule == "step"
                else {}
            ),
        },
        "L9": {
            "dataset": workload.dataset_name(),
            "quality_metric": workload.quality_metric,
            "target_quality": t.target_quality,
            "epochs": t.epochs,
            **workload.problem_layer(),  # what was verified from the data, if anything
        },
    }
