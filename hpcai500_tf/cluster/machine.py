"""This machine as a benchmark record names it, with no framework: L1 (CPU, memory, GPUs,
each marked where this process computes on it: cluster/devices.py reads CUDA_VISIBLE_DEVICES
and a worker's share for it), L2 (OS, driver) and L3 (the collective). L4 and L5, the
framework's, come from the backend (backends.py); L6-L9 are set by a run's config
(benchmark_layers.py). Values that cannot be observed are recorded as None, never guessed.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from hpcai500_tf.cluster.devices import computing_gpus, cuda_visible_entries

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
    "amx_fp16",
    "asimd",
    "sve",
)


CPUINFO = Path("/proc/cpuinfo")
CPUFREQ = Path("/sys/devices/system/cpu/cpu0/cpufreq")


def _processor_blocks(text: str) -> list[dict[str, str]]:
    """/proc/cpuinfo as one dict per logical processor (its first value of each key)."""
    blocks = []
    for chunk in text.split("\n\n"):
        block: dict[str, str] = {}
        for line in chunk.splitlines():
            key, _, value = line.partition(":")
            block.setdefault(key.strip(), value.strip())
        if "processor" in block:
            blocks.append(block)
    return blocks


def cpu_flags(cpuinfo_text: str | None = None) -> set[str]:
    """The first processor's flags in /proc/cpuinfo (or `cpuinfo_text`); none where absent."""
    try:
        text = CPUINFO.read_text() if cpuinfo_text is None else cpuinfo_text
    except OSError:
        return set()
    blocks = _processor_blocks(text)
    return set(blocks[0].get("flags", "").split()) if blocks else set()


def _integer(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _clock(model_name: str | None, cpufreq: Path) -> tuple[float | None, str | None]:
    """The highest clock the OS reports, in Hz, and where it comes from: cpufreq's maximum,
    else the nominal clock in the model name ("@ 2.10GHz"). The current clock, which
    /proc/cpuinfo also gives, changes from read to read: it is not a fact of L1."""
    try:
        return float((cpufreq / "cpuinfo_max_freq").read_text()) * 1e3, "cpufreq cpuinfo_max_freq"
    except (OSError, ValueError):
        pass
    found = re.search(r"@\s*([0-9.]+)\s*GHz", model_name or "")
    if found:
        return float(found.group(1)) * 1e9, "nominal, from the model name"
    return None, None


def cpu_facts(cpuinfo_text: str | None = None, cpufreq: Path = CPUFREQ) -> dict:
    """The CPU part of L1 from /proc/cpuinfo (or `cpuinfo_text`) and cpufreq: plain values,
    None where not reported. Physical cores are the distinct (physical id, core id) pairs,
    counted only where every processor gives both."""
    try:
        text = CPUINFO.read_text() if cpuinfo_text is None else cpuinfo_text
    except OSError:
        text = ""
    blocks = _processor_blocks(text)
    first = blocks[0] if blocks else {}
    flags = (first.get("flags") or first.get("Features") or "").split()
    cores = {(b.get("physical id"), b.get("core id")) for b in blocks}
    physical = len(cores) if blocks and all(None not in pair for pair in cores) else None
    sockets = {b["physical id"] for b in blocks if "physical id" in b}
    clock, clock_source = _clock(first.get("model name"), cpufreq)
    return {
        "cpu_model": first.get("model name"),
        "cpu_vendor": first.get("vendor_id"),
        "cpu_family": _integer(first.get("cpu family")),
        "cpu_model_number": _integer(first.get("model")),
        "cpu_sockets": len(sockets) or None,
        "cpu_physical_cores": physical,
        "cpu_isa": [flag for flag in _RELEVANT_ISA if flag in flags],
        "cpu_clock_hz": clock,
        "cpu_clock_source": clock_source,
    }


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


def nvml_text(value) -> str:
    """A string from NVML: older nvidia-ml-py releases return bytes."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@functools.lru_cache(maxsize=1)
def nvidia_gpus() -> tuple[list[dict], str | None, str | None]:
    """Every GPU NVML lets this process open, used or not: (devices with index, model, memory
    and UUID; driver version; a note: why none were listed, or which were not readable). A task
    that Slurm's cgroup keeps to its own GPUs sees the node's others listed but gets NVML's
    NoPermission for them: they are skipped and named, and the list holds the GPUs CUDA can see,
    in CUDA's order (CUDA_VISIBLE_DEVICES indices are positions in it)."""
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
        devices, denied = [], []
        for index in range(pynvml.nvmlDeviceGetCount()):
            try:
                devices.append(_nvml_device(pynvml, index))
            except pynvml.NVMLError as error:
                denied.append((index, error))
        return devices, driver, unreadable_gpus_note(denied)
    finally:
        pynvml.nvmlShutdown()


def _nvml_device(pynvml, index: int) -> dict:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return {
        "index": index,
        "model": nvml_text(pynvml.nvmlDeviceGetName(handle)),
        "memory_bytes": int(memory.total),
        "uuid": nvml_text(pynvml.nvmlDeviceGetUUID(handle)),
    }


def unreadable_gpus_note(denied: list[tuple[int, Exception]]) -> str | None:
    """A one-line note naming the GPUs NVML listed but would not open, with its first answer
    (NoPermission where a cgroup keeps this process to other GPUs); None where there are none."""
    if not denied:
        return None
    names = ", ".join(f"gpu{index}" for index, _ in denied[:16])
    more = f" and {len(denied) - 16} more" if len(denied) > 16 else ""
    return (
        f"{names}{more} skipped: NVML lists them but does not open them for this process "
        f"({denied[0][1]}; a Slurm task sees only its own GPUs where the site constrains "
        "devices)"
    )


@functools.lru_cache(maxsize=1)
def amd_gpus() -> tuple[list[dict], str | None]:
    """Every AMD GPU ROCm's tools list (`amd-smi`, else `rocm-smi`): (devices with index and
    model as ROCm names it; which tool, or why none were listed). Visibility follows
    HIP_VISIBLE_DEVICES, else ROCR_VISIBLE_DEVICES (indices)."""
    for command, parse in (
        (["amd-smi", "static", "--asic", "--json"], _amd_smi_models),
        (["rocm-smi", "--showproductname", "--json"], _rocm_smi_models),
    ):
        if shutil.which(command[0]) is None:
            continue
        try:
            listing = subprocess.run(command, capture_output=True, text=True, timeout=30)
            models = parse(json.loads(listing.stdout)) if listing.returncode == 0 else []
        except (OSError, subprocess.SubprocessError, ValueError, TypeError, AttributeError):
            models = []
        if models:
            return [{"index": i, "model": m} for i, m in enumerate(models)], command[0]
    return [], "no amd-smi or rocm-smi listing (not a ROCm machine)"


def _amd_smi_models(data) -> list[str]:
    """Market names from `amd-smi static --asic --json` (a list of GPUs, or {"gpu_data": ...})."""
    gpus = data.get("gpu_data", []) if isinstance(data, dict) else data
    return [str(gpu["asic"]["market_name"]) for gpu in gpus if gpu.get("asic")]


def _rocm_smi_models(data: dict) -> list[str]:
    """Card series from `rocm-smi --showproductname --json` ({"card0": {...}, ...})."""
    models = []
    for card in sorted((k for k in data if k.startswith("card")), key=lambda k: int(k[4:])):
        fields = {key.lower(): value for key, value in data[card].items()}
        models.append(str(fields.get("card series") or fields.get("card model")))
    return models


def amd_visible(count: int, environ=None) -> list[int]:
    """The AMD GPUs a HIP program here may use: HIP_VISIBLE_DEVICES, else
    ROCR_VISIBLE_DEVICES (indices), else all."""
    environ = os.environ if environ is None else environ
    listed = environ.get("HIP_VISIBLE_DEVICES") or environ.get("ROCR_VISIBLE_DEVICES")
    if listed is None:
        return list(range(count))
    entries = cuda_visible_entries(listed)
    return [int(e) for e in entries if e.isdigit() and int(e) < count]


def visible_gpu_count(environ: Mapping[str, str] | None = None) -> int:
    """The GPUs this process may use: NVML's, narrowed by CUDA_VISIBLE_DEVICES as CUDA reads
    it and to this worker's share (HPCAI500_WORKER_GPUS, `--workers N`). MIG instances are not
    resolved to GPUs: where they are named, at least one."""
    environ = os.environ if environ is None else environ
    gpus, _, _ = nvidia_gpus()
    if not gpus:
        return 0
    indices, _ = computing_gpus(environ, [gpu["uuid"] for gpu in gpus])
    return 1 if indices is None else len(indices)


def _gpu_summary(used: list[dict], count: int, mig: bool) -> str:
    models = ", ".join(sorted({g["model"] for g in used}))
    of = f" (of {count})" if len(used) < count else ""
    return f"{len(used)} x {models}{of}" + (" (as MIG instances)" if mig else "")


def hardware_layer(workers: int = 1) -> dict:
    """L1: CPU, memory and GPUs, each GPU marked "visible" when this process computes on it
    (CUDA_VISIBLE_DEVICES and this worker's share, WORKER_GPUS; None where the variable names
    MIG instances); the summary counts those GPUs (L5 `devices_used` of a run's record says
    what it computed on)."""
    cpu = cpu_facts()
    gpus, _, gpu_note = nvidia_gpus()
    cores = os.cpu_count()
    environment = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible, visibility_note = computing_gpus(os.environ, [g["uuid"] for g in gpus])
    # positions in `gpus` (the GPUs this process can open, CUDA's order), not NVML indices
    accelerators = [
        {
            "index": g["index"],
            "model": g["model"],
            "memory_bytes": g["memory_bytes"],
            "visible": None if visible is None else position in visible,
        }
        for position, g in enumerate(gpus)
    ]
    used = gpus if visible is None else [g for i, g in enumerate(gpus) if i in visible]
    if gpus and gpu_note:  # some listed GPUs could not be opened: named with the others' note
        visibility_note, gpu_note = "; ".join(filter(None, (gpu_note, visibility_note))), None
    if not gpus:  # no NVIDIA GPU: AMD's, named as ROCm names them
        amd, amd_source = amd_gpus()
        on_amd = amd_visible(len(amd))
        accelerators = [
            {**g, "vendor": "AMD", "source": amd_source, "visible": g["index"] in on_amd}
            for g in amd
        ]
        used = [g for g in accelerators if g["visible"]]
        gpu_note = gpu_note if not amd else None
    if gpus and not used and not visibility_note:
        visibility_note = f"CUDA_VISIBLE_DEVICES={environment!r} leaves no GPU to this run"
    if used:
        summary = _gpu_summary(used, len(accelerators), visible is None and bool(gpus))
    else:
        summary = f"{cpu['cpu_model'] or platform.processor() or 'unknown CPU'} ({cores} cores)"
    if workers > 1:
        summary = f"{workers} workers x {summary}"
    return {
        "summary": summary,
        **cpu,
        "cpu_logical_cores": cores,
        "machine": platform.machine(),
        "memory_bytes": _memory_bytes(),
        "accelerators": accelerators,
        "accelerator_note": gpu_note or visibility_note,
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


def system_layers(
    library: tuple[dict, dict], workers: int = 1, collective: str | None = None
) -> dict[str, dict]:
    """L1-L5 of this machine as far as they can be observed, `library` being the framework's
    L4 and L5 (`Backend.library_layers`)."""
    l4, l5 = library
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
