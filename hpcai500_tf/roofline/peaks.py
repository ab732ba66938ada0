"""Theoretical peaks where they can be known: a table of GPU models, matched by the name NVML
or ROCm reports, and for CPUs physical cores x clock x FLOPs per cycle of the core's design.

A GPU's figure is its data sheet's dense (no structured sparsity) matrix rate per device.
A CPU's FLOPs per cycle come from a small table of microarchitectures (FMA datapath width and
FMA units per core), keyed by what /proc/cpuinfo says (vendor, family, model, model name); a
core not in the table has no peak, rather than one guessed from its ISA flags. The clock is
the highest the OS reports (cpufreq's maximum, else the model name's nominal clock, else the
current clock, said so). Both are upper bounds for orientation: a GPU rarely holds its boost
clock under full load, and wide vector or AMX code runs below a CPU's maximum clock. A peak
from the current clock is not an upper bound (a hypervisor may show a low clock that the cores
exceed under load): it is called an estimate, and no efficiency is taken against it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
CURRENT_CLOCK = "current, not max"  # in a peak's method: the peak is an estimate, not a bound

# ----------------------------------------------------------------------------- GPUs


@dataclass(frozen=True)
class GpuEntry:
    """One GPU model: the pattern its reported name matches, its data sheet, FLOPS by dtype."""

    name: str
    pattern: re.Pattern
    source: str
    flops: dict[str, float]


GPU_DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16")


def _gpu(name: str, pattern: str, source: str, *teraflops: float | None) -> GpuEntry:
    """A row: fp64, fp32, tf32, bf16, fp16 in TFLOPS, None where the data sheet has none."""
    flops = {d: t * 1e12 for d, t in zip(GPU_DTYPES, teraflops, strict=True) if t is not None}
    return GpuEntry(name, re.compile(pattern, re.IGNORECASE), source, flops)


_V100 = "NVIDIA Tesla V100 data sheet"
_A100 = "NVIDIA A100 Tensor Core GPU data sheet"
_H100 = "NVIDIA H100 Tensor Core GPU data sheet, sparse tensor figures halved"
_H200 = "NVIDIA H200 Tensor Core GPU data sheet, sparse tensor figures halved"
_GH200 = "NVIDIA GH200 Grace Hopper Superchip data sheet, sparse tensor figures halved"
_B200 = "NVIDIA HGX B200 data sheet, 8-GPU totals / 8, sparse tensor figures halved"
_MI250X = "AMD Instinct MI250X data sheet, package / 2: ROCm lists each of its 2 GCDs"
_MI300X = "AMD Instinct MI300X data sheet"

# Dense peak TFLOPS per device (no structured sparsity). fp64 is the FP64 Tensor Core or
# matrix rate where the GPU has one (what a DGEMM runs on); tf32, bf16 and fp16 are tensor or
# matrix rates; None: no such rate. Most specific pattern first: the first match is taken.
GPU_TABLE = (
    # entry, pattern over the reported name, source,   fp64, fp32,  tf32,   bf16,   fp16
    _gpu("V100S PCIe", r"\bV100S-PCIE\b", _V100, 8.2, 16.4, None, None, 130),
    _gpu("V100 SXM2", r"\bV100-SXM2\b", _V100, 7.8, 15.7, None, None, 125),
    _gpu("V100 PCIe", r"\bV100-PCIE\b", _V100, 7, 14, None, None, 112),
    _gpu("A100 SXM", r"\bA100\b.*\bSXM", _A100, 19.5, 19.5, 156, 312, 312),
    _gpu("A100 PCIe", r"\bA100\b.*\bPCIE\b", _A100, 19.5, 19.5, 156, 312, 312),
    _gpu("H100 NVL", r"\bH100 NVL\b", _H100, 60, 60, 417.5, 835.5, 835.5),
    _gpu("H100 PCIe", r"\bH100\b.*\bPCIE\b", _H100, 51, 51, 378, 756.5, 756.5),
    _gpu("H100 SXM", r"\bH100\b.*(\bSXM|\bHBM3\b)", _H100, 67, 67, 494.5, 989.5, 989.5),
    _gpu("GH200", r"\bGH200\b", _GH200, 67, 67, 494.5, 989.5, 989.5),
    _gpu("H200 NVL", r"\bH200 NVL\b", _H200, 60, 60, 417.5, 835.5, 835.5),
    _gpu("H200 SXM", r"\bH200\b", _H200, 67, 67, 494.5, 989.5, 989.5),
    _gpu("B200", r"\bB200\b", _B200, 37, 75, 1125, 2250, 2250),
    # "MI250X/MI250" (the PCI ID's name) could be either card, whose figures differ.
    _gpu("MI250X (one GCD)", r"\bMI250X\b(?!\s*/)", _MI250X, 47.85, 47.85, None, 191.5, 191.5),
    # One device in the default SPX partition mode; the other modes split it into several.
    _gpu("MI300X", r"\bMI300X\b", _MI300X, 163.4, 163.4, 653.7, 1307.4, 1307.4),
)


def match_gpu(reported_name: str) -> GpuEntry | None:
    """The table entry whose pattern the reported name matches first, or None."""
    return next((e for e in GPU_TABLE if e.pattern.search(reported_name)), None)


def gpu_peak(dtype: str, gpus: list[dict]) -> tuple[float | None, str]:
    """One GPU's peak (the first of those the run uses), with the matched entry named."""
    model = str(gpus[0].get("model", ""))
    entry = match_gpu(model)
    if entry is None:
        return None, f"{model}: not in the GPU table"
    if dtype not in entry.flops:
        return None, f"{model} (entry {entry.name}): no {dtype} figure"
    mixed = (
        "; the GPUs differ, this is the first" if len({g.get("model") for g in gpus}) > 1 else ""
    )
    return entry.flops[dtype], (
        f"{model} = table entry {entry.name} ({entry.source}), dense {dtype} per GPU, "
        f"1 of {len(gpus)} GPU{'s' if len(gpus) > 1 else ''}{mixed}"
    )


# ----------------------------------------------------------------------------- CPUs


@dataclass(frozen=True)
class CoreDesign:
    """What a core can do per cycle: FMA units, each `fma_bits` wide, and an AMX tile unit."""

    name: str
    fma_bits: int
    fma_units: int
    amx: bool = False  # Intel AMX: 1024 bf16 (or fp16, with amx_fp16) FLOPs per cycle
    note: str = ""  # what the method string should add: a caveat or an assumption

    @property
    def fp32_per_cycle(self) -> int:
        """Lanes x units x 2 (an FMA is a multiply and an add)."""
        return self.fma_bits // 32 * self.fma_units * 2


@dataclass(frozen=True)
class CoreRule:
    """The design of a vendor's CPUs of one family with a model number in `models` and, where
    `name_pattern` is given, a "model name" it matches."""

    vendor: str
    family: int
    models: tuple[range, ...]
    design: CoreDesign
    name_pattern: re.Pattern | None = None


def _models(*spans: tuple[int, int]) -> tuple[range, ...]:
    return tuple(range(first, last + 1) for first, last in spans)


# Two FMA units per Xeon core is what Intel ARK's "# of AVX-512 FMA Units" gives for Xeon
# Platinum, Gold 6xxx and W; Skylake-SP/Cascade Lake Bronze, Silver and Gold 5xxx (but 5122,
# 5222) have one. Later Xeon Scalable parts are taken to have two: an assumption, said so.
_TWO_XEON_FMA = "assumed: two 512-bit FMA units per core, as on Xeon Platinum and Gold 6xxx"
_ZEN = CoreDesign("AMD Zen/Zen+", 128, 2)
_ZEN2 = CoreDesign("AMD Zen 2", 256, 2)
_ZEN3 = CoreDesign("AMD Zen 3", 256, 2)
_ZEN4 = CoreDesign("AMD Zen 4", 256, 2, note="AVX-512 executes on 256-bit datapaths")
_ZEN5 = CoreDesign("AMD Zen 5", 512, 2)
_ZEN5_MOBILE = CoreDesign("AMD Zen 5 mobile", 256, 2, note="AVX-512 on 256-bit datapaths")
_HASWELL_EP = CoreDesign("Intel Haswell-EP", 256, 2)
_BROADWELL_EP = CoreDesign("Intel Broadwell-EP", 256, 2)
_SKYLAKE_ONE_FMA = CoreDesign(
    "Intel Skylake-SP/Cascade Lake", 512, 1, note="one 512-bit FMA unit (Bronze, Silver, Gold 5)"
)
_SKYLAKE_SP = CoreDesign("Intel Skylake-SP/Cascade Lake", 512, 2, note=_TWO_XEON_FMA)
_ICE_LAKE_SP = CoreDesign("Intel Ice Lake-SP", 512, 2, note=_TWO_XEON_FMA)
_SAPPHIRE = CoreDesign("Intel Sapphire Rapids", 512, 2, amx=True, note=_TWO_XEON_FMA)
_EMERALD = CoreDesign("Intel Emerald Rapids", 512, 2, amx=True, note=_TWO_XEON_FMA)
_GRANITE = CoreDesign("Intel Granite Rapids", 512, 2, amx=True, note=_TWO_XEON_FMA)

_AMD, _INTEL = "AuthenticAMD", "GenuineIntel"
# AMD model ranges as Linux (arch/x86/kernel/cpu/amd.c) sorts them into Zen generations;
# Zen 5 split by datapath: server and desktop parts are 512 bits wide, mobile ones 256.
CPU_TABLE = (
    CoreRule(_AMD, 0x17, _models((0x00, 0x2F), (0x50, 0x5F)), _ZEN),
    CoreRule(_AMD, 0x17, _models((0x30, 0x4F), (0x60, 0x7F), (0x90, 0x91), (0xA0, 0xAF)), _ZEN2),
    CoreRule(_AMD, 0x19, _models((0x00, 0x0F), (0x20, 0x5F)), _ZEN3),
    CoreRule(_AMD, 0x19, _models((0x10, 0x1F), (0x60, 0xAF)), _ZEN4),
    CoreRule(_AMD, 0x1A, _models((0x00, 0x1F), (0x40, 0x4F)), _ZEN5),  # Turin, Granite Ridge
    CoreRule(_AMD, 0x1A, _models((0x20, 0x2F), (0x60, 0x6F)), _ZEN5_MOBILE),  # Strix, Krackan
    CoreRule(_INTEL, 6, _models((0x3F, 0x3F)), _HASWELL_EP),
    CoreRule(_INTEL, 6, _models((0x4F, 0x4F)), _BROADWELL_EP),
    CoreRule(
        _INTEL,
        6,
        _models((0x55, 0x55)),
        _SKYLAKE_ONE_FMA,
        re.compile(r"\b(Bronze|Silver|Gold 5(?!122|222)\d{3})"),
    ),
    CoreRule(_INTEL, 6, _models((0x55, 0x55)), _SKYLAKE_SP),
    CoreRule(_INTEL, 6, _models((0x6A, 0x6A)), _ICE_LAKE_SP),
    CoreRule(_INTEL, 6, _models((0x8F, 0x8F)), _SAPPHIRE),
    CoreRule(_INTEL, 6, _models((0xCF, 0xCF)), _EMERALD),
    CoreRule(_INTEL, 6, _models((0xAD, 0xAD)), _GRANITE),
)


def core_design(hardware: dict) -> tuple[CoreDesign | None, str]:
    """The design of this CPU's cores from L1's vendor, family, model and model name, with
    what identified it; or None and what is unknown."""
    vendor, family = hardware.get("cpu_vendor"), hardware.get("cpu_family")
    model, name = hardware.get("cpu_model_number"), hardware.get("cpu_model") or ""
    if vendor is None or family is None or model is None:
        return None, "unknown: CPU vendor, family or model not reported"
    where = f"{vendor} family 0x{family:x} model 0x{model:02x}"
    for rule in CPU_TABLE:
        if (rule.vendor, rule.family) != (vendor, family):
            continue
        if any(model in span for span in rule.models) and (
            rule.name_pattern is None or rule.name_pattern.search(name)
        ):
            return rule.design, where
    return None, f"unknown: {where} ({name or 'no model name'}) is not in the CPU table"


def flops_per_cycle(dtype: str, design: CoreDesign, isa: set[str]) -> tuple[int | None, str]:
    """FLOPs per cycle and core for `dtype`, and which units give them."""
    fp32 = design.fp32_per_cycle
    units = f"{design.fma_units} x {design.fma_bits}-bit FMA"
    if dtype == "fp32":
        return fp32, units
    if dtype == "fp64":
        return fp32 // 2, units
    if dtype in ("bf16", "fp16"):
        amx_flag, vector_flag = f"amx_{dtype}", f"avx512_{dtype}"
        if design.amx and amx_flag in isa:
            return 1024, f"AMX tiles ({amx_flag})"
        if vector_flag in isa:
            return 2 * fp32, f"{units}, {vector_flag}: 2 {dtype} products per fp32 lane"
        return fp32, f"{units}, {dtype} computed in fp32 (no {dtype} arithmetic here)"
    return None, f"no {dtype} arithmetic on CPUs"


def current_clock_hz(cpuinfo_text: str | None = None) -> float | None:
    """The first "cpu MHz" of /proc/cpuinfo: the current clock, not the maximum."""
    try:
        text = CPUINFO.read_text() if cpuinfo_text is None else cpuinfo_text
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "cpu MHz":
            try:
                return float(value) * 1e6
            except ValueError:
                return None
    return None


def cpu_peak(dtype: str, hardware: dict) -> tuple[float | None, str]:
    """Cores x clock x FLOPs per cycle, each with how it was found."""
    design, identified = core_design(hardware)
    if design is None:
        return None, identified
    per_cycle, units = flops_per_cycle(dtype, design, set(hardware.get("cpu_isa") or []))
    if per_cycle is None:
        return None, f"{design.name}: {units}"
    clock, clock_source = hardware.get("cpu_clock_hz"), hardware.get("cpu_clock_source")
    if not clock:
        clock, clock_source = current_clock_hz(), f"{CURRENT_CLOCK}: /proc/cpuinfo cpu MHz"
    cores = hardware.get("cpu_physical_cores")
    core_kind = "physical cores" if cores else "logical cores (physical cores not reported)"
    cores = cores or hardware.get("cpu_logical_cores")
    if not (clock and cores):
        return None, f"unknown: {design.name} clock or core count not observable"
    note = f" ({design.note})" if design.note else ""
    return cores * clock * per_cycle, (
        f"{design.name} ({identified}): {per_cycle} {dtype} FLOPs/cycle/core from {units}"
        f"{note}; {cores} {core_kind} x {clock / 1e9:.2f} GHz ({clock_source})"
    )


def theoretical_peak(dtype: str, hardware: dict) -> tuple[float | None, str]:
    """(peak FLOPS or None, how it was obtained) of one GPU the run uses, or else of the CPU.

    `hardware` is an L1 layer: GPUs marked "visible": False are not the run's; "visible":
    None means which GPUs the run uses is not known (MIG instances named)."""
    gpus = hardware.get("accelerators") or []
    if any(g.get("visible", True) is None for g in gpus):
        return None, "unknown: which GPUs the run uses (CUDA_VISIBLE_DEVICES names MIG instances)"
    used = [g for g in gpus if g.get("visible", True)]
    return gpu_peak(dtype, used) if used else cpu_peak(dtype, hardware)


def efficiency(measured: float, peak: float | None, method: str) -> tuple[float | None, str | None]:
    """(measured / peak, or None; a warning, or None). An efficiency is only taken against a
    peak that is an upper bound; a measured ceiling above the stated peak is a warning naming
    both, never an efficiency above 1."""
    if not peak:
        return None, None
    if measured > peak:
        return None, (
            f"measured ceiling {measured / 1e9:.1f} GFLOP/s is above the stated peak "
            f"{peak / 1e9:.1f} GFLOP/s ({method}): that peak is no upper bound here, so no "
            "efficiency is given"
        )
    if CURRENT_CLOCK in method:
        return None, (
            f"the peak {peak / 1e9:.1f} GFLOP/s is an estimate from the current clock (the "
            "maximum clock is not reported here), not an upper bound: no efficiency is given"
        )
    return measured / peak, None
