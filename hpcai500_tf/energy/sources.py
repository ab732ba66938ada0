"""Power sources this machine offers: the NVIDIA GPUs this run uses, through NVML; CPU packages
and DRAM through Linux RAPL (powercap). Each source reads one value: a cumulative energy counter
in joules ("counter") or instantaneous power in watts ("power").

`discover()` lists what is there and, for what is not, why: that reason ends up in the record.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from hpcai500_tf.cluster.devices import WORKER_GPUS, computing_gpus, gpu_selection
from hpcai500_tf.cluster.machine import amd_gpus, nvml_text, unreadable_gpus_note

# Where Linux exposes RAPL; HPCAI500_POWERCAP_ROOT points elsewhere (a container that mounts
# the host's sysfs under another path).
POWERCAP_ROOT = Path(os.environ.get("HPCAI500_POWERCAP_ROOT", "/sys/class/powercap"))
_PACKAGE_ZONE = re.compile(r"intel-rapl:(\d+)$")
_SUB_ZONE = re.compile(r"intel-rapl:(\d+):(\d+)$")


@dataclass
class Source:
    """One sensor. `read()` returns joules (kind "counter") or watts (kind "power")."""

    name: str  # unique within a worker, e.g. "gpu0", "rapl:package-0"
    part: str  # what it measures: "GPU board", "CPU package", "DRAM", "whole node"
    kind: str  # "counter" | "power"
    method: str  # how, in words, for the record
    wrap_j: float | None = None  # counter range, where it wraps
    uuid: str = ""  # a GPU's NVML UUID: the board's identity across workers
    read_value: object = field(default=None, repr=False)  # () -> float

    def read(self) -> float:
        return self.read_value()


# ----------------------------------------------------------------------------- NVML


def _nvml_source(nvml, index: int, handle, model: str, uuid: str) -> Source:
    """The total-energy counter where the GPU has one, else power samples."""
    try:
        nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except nvml.NVMLError:
        return Source(
            f"gpu{index}",
            "GPU board",
            "power",
            f"NVML power usage samples (no energy counter on this GPU), {model}",
            uuid=uuid,
            read_value=lambda h=handle: nvml.nvmlDeviceGetPowerUsage(h) / 1e3,
        )
    return Source(
        f"gpu{index}",
        "GPU board",
        "counter",
        f"NVML total energy counter, {model}",
        uuid=uuid,
        read_value=lambda h=handle: nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1e3,
    )


def _uuid(nvml, handle) -> str:
    try:
        return nvml_text(nvml.nvmlDeviceGetUUID(handle))
    except nvml.NVMLError:
        return ""  # names no GPU of CUDA_VISIBLE_DEVICES, which CUDA then ignores too


def nvml_sources(nvml=None, environ=None) -> tuple[list[Source], str | None]:
    """One source per GPU this run computes on: those CUDA_VISIBLE_DEVICES names (indices or
    GPU UUIDs, read as CUDA reads them), every GPU when it is unset, narrowed to this worker's
    share where HPCAI500_WORKER_GPUS is set (`--workers N`). The note names the GPUs left
    out and anything in the variable that is no GPU here; MIG instances are out of scope (no
    GPU source: a board's counter would count the other instances too). Sources are named by
    NVML index ("gpu2"), which is the same whatever the variable says, and carry the GPU's UUID
    (how the chief of a multi-worker run counts a board that two workers see once). GPUs that
    NVML lists but will not open (NoPermission, where Slurm's cgroup keeps a task to its own)
    are skipped and named in the note; CUDA's indices are positions among the others.

    `nvml` is the pynvml module or a stand-in with the same functions (tests)."""
    if nvml is None:
        try:
            import pynvml as nvml  # from nvidia-ml-py
        except ImportError:
            return [], "nvidia-ml-py is not installed"
    try:
        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as error:
        return [], f"NVML unavailable ({error})"
    if count == 0:
        return [], "NVML reports no GPU"
    opened, denied = [], []  # (NVML index, handle, model) of the GPUs this process may open
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            opened.append((index, handle, nvml_text(nvml.nvmlDeviceGetName(handle))))
        except nvml.NVMLError as error:  # NoPermission: a cgroup keeps this task to others
            denied.append((index, error))
    uuids = [_uuid(nvml, handle) for _, handle, _ in opened]
    environ = os.environ if environ is None else environ  # the view of the GPUs: the process's
    chosen, problem = computing_gpus(environ, uuids)  # positions in `opened`: CUDA's order
    skipped = unreadable_gpus_note(denied)
    if chosen is None or not opened:
        return [], "; ".join(filter(None, (skipped, problem))) or None
    sources = []
    for position in chosen:
        index, handle, model = opened[position]
        sources.append(_nvml_source(nvml, index, handle, model, uuids[position]))
    left_out = [f"gpu{i} ({model})" for n, (i, _, model) in enumerate(opened) if n not in chosen]
    notes = [note for note in (skipped, problem) if note]
    if left_out:
        # a worker's share: the other workers count the rest (the chief gathers them)
        whose = "this worker computes on" if WORKER_GPUS in environ else "this run uses"
        notes.append(
            f"{', '.join(left_out)} left out: not among the GPUs {whose} ({gpu_selection(environ)})"
        )
    return sources, "; ".join(notes) or None


# ----------------------------------------------------------------------------- RAPL


def _read_number(path: Path) -> float:
    """One sysfs number; plain system calls, as this runs 10 times a second during training."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return float(os.read(fd, 64))
    finally:
        os.close(fd)


def rapl_sources(root: Path = POWERCAP_ROOT) -> tuple[list[Source], str | None]:
    """CPU packages (top-level zones) and their DRAM sub-zones. Core, uncore and psys zones are
    left out: the first two lie inside a package's count, psys overlaps everything."""
    if not root.is_dir():
        return [], f"{root} is absent (no RAPL: not a Linux x86 host, or no powercap driver)"
    sources, denied = [], []
    for zone in sorted(root.iterdir()):
        package = _PACKAGE_ZONE.match(zone.name)
        sub = _SUB_ZONE.match(zone.name)
        if not (package or sub):
            continue
        try:
            name = (zone / "name").read_text().strip()
        except OSError:
            continue
        if sub and name != "dram" or package and not name.startswith("package"):
            continue
        energy_file = zone / "energy_uj"
        try:
            _read_number(energy_file)
            wrap = _read_number(zone / "max_energy_range_uj") / 1e6
        except PermissionError:
            denied.append(zone.name)
            continue
        except (OSError, ValueError):
            continue
        label = f"{name}-{sub.group(1)}" if sub else name
        sources.append(
            Source(
                f"rapl:{label}",
                "DRAM" if sub else "CPU package",
                "counter",
                f"RAPL energy counter {zone.name} ({name}), wraps at {wrap:.0f} J",
                wrap_j=wrap,
                read_value=lambda f=energy_file: _read_number(f) / 1e6,
            )
        )
    if sources:
        return sources, None
    if denied:
        return [], (
            f"RAPL energy files under {root} need root ({', '.join(denied)}): run as root "
            "or make energy_uj readable"
        )
    return [], f"no RAPL package zone under {root}"


def discover(
    nvml=None, powercap_root: Path | None = None, environ=None
) -> tuple[list[Source], list[str]]:
    """All sources here, and a note for each kind that is missing; GPUs as `environ` (default
    this process's) chooses them."""
    gpus, gpu_note = nvml_sources(nvml, environ)
    cpus, cpu_note = rapl_sources(powercap_root or POWERCAP_ROOT)
    notes = [f"GPU boards: {gpu_note}"] if gpu_note else []
    if not gpus and amd_gpus()[0]:  # AMD GPUs here: their power is not read yet
        notes = ["GPU boards: AMD GPUs' energy is not measured (ROCm SMI is not read yet)"]
    notes += [f"CPU packages: {cpu_note}"] if cpu_note else []
    return gpus + cpus, notes
