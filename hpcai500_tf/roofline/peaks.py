"""Theoretical peaks where they can be known: a table of GPU models, and for CPUs
logical cores x clock x FLOPs per cycle from the ISA flags.

The CPU figure assumes two FMA units per core for AVX-512 parts (not observable from
software), uses the clock /proc/cpuinfo reports (nominal on most VMs, not the turbo clock),
and counts logical cores; it is an upper bound for orientation, marked as such in the record.
"""

from __future__ import annotations

from pathlib import Path

# Dense peak FLOPS by dtype (no structured sparsity), from the vendors' data sheets.
GPU_PEAKS = {
    "H200": {"fp64": 67e12, "fp32": 67e12, "tf32": 495e12, "bf16": 989e12, "fp16": 989e12},
    "H100 SXM": {"fp64": 67e12, "fp32": 67e12, "tf32": 495e12, "bf16": 989e12, "fp16": 989e12},
    "H100 PCIe": {"fp64": 51e12, "fp32": 51e12, "tf32": 378e12, "bf16": 756e12, "fp16": 756e12},
    "A100": {"fp64": 19.5e12, "fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
    "V100": {"fp64": 7.8e12, "fp32": 15.7e12, "fp16": 125e12},
}


def cpu_flops_per_cycle(dtype: str, isa: set[str]) -> int | None:
    """Per core and cycle: vector lanes x 2 (FMA) x 2 units, or the AMX tile rate."""
    fp32 = 64 if "avx512f" in isa else 32 if {"avx2", "fma"} <= isa else None
    if dtype == "fp32":
        return fp32
    if dtype == "fp64":
        return fp32 // 2 if fp32 else None
    if dtype == "bf16":
        if "amx_bf16" in isa:
            return 1024
        return 128 if "avx512_bf16" in isa else fp32
    if dtype == "fp16":
        if "amx_fp16" in isa:
            return 1024
        return 128 if "avx512_fp16" in isa else fp32
    return None


def cpu_clock_hz() -> float | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return float(line.split(":")[1]) * 1e6
    except (OSError, ValueError, IndexError):
        pass
    return None


def theoretical_peak(dtype: str, hardware: dict) -> tuple[float | None, str]:
    """(peak FLOPS or None, how it was obtained) for the first GPU, or else the CPU."""
    gpus = hardware.get("accelerators") or []
    if gpus:
        model = str(gpus[0].get("model", ""))
        for name, peaks in GPU_PEAKS.items():
            if name.split()[0] in model and (len(name.split()) == 1 or name.split()[1] in model):
                peak = peaks.get(dtype)
                count = len(gpus)
                return (
                    (peak, f"{name} data sheet, 1 of {count} GPUs")
                    if peak
                    else (None, f"{name}: no {dtype} figure")
                )
        return None, f"{model}: not in the GPU table"
    per_cycle = cpu_flops_per_cycle(dtype, set(hardware.get("cpu_isa") or []))
    clock = cpu_clock_hz()
    cores = hardware.get("cpu_logical_cores")
    if not (per_cycle and clock and cores):
        return None, "unknown: ISA, clock or core count not observable"
    return (
        cores * clock * per_cycle,
        f"{cores} logical cores x {clock / 1e9:.2f} GHz (reported) x {per_cycle} "
        f"FLOPs/cycle ({dtype}, ISA flags; assumes 2 FMA units)",
    )
