"""Theoretical peaks: the GPU table against real NVML/ROCm names, CPU peaks from the core's
design for given /proc/cpuinfo texts and cpufreq trees, and which GPUs count (L1)."""

import pytest

from hpcai500_tf.cluster import machine
from hpcai500_tf.roofline import peaks

# ----------------------------------------------------------------------------- GPUs

# Names as NVML (nvidia-smi) and ROCm report them, and the table entry each must match.
REPORTED_NAMES = [
    ("Tesla V100-SXM2-16GB", "V100 SXM2"),
    ("Tesla V100-SXM2-32GB", "V100 SXM2"),
    ("Tesla V100-PCIE-32GB", "V100 PCIe"),
    ("Tesla V100S-PCIE-32GB", "V100S PCIe"),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM"),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200 SXM"),
    ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA GH200 480GB", "GH200"),
    ("NVIDIA GH200 144G HBM3e", "GH200"),
    ("AMD Instinct MI250X", "MI250X (one GCD)"),
    ("AMD Instinct MI300X", "MI300X"),
    ("AMD Instinct MI300X VF", "MI300X"),
]


@pytest.mark.parametrize("reported, entry", REPORTED_NAMES)
def test_reported_gpu_names_match_their_entry(reported, entry):
    assert peaks.match_gpu(reported).name == entry


@pytest.mark.parametrize(
    "reported",
    [
        "NVIDIA A10",  # not an A100
        "NVIDIA A800-SXM4-80GB",
        "NVIDIA GB200",  # not a B200: other figures
        "NVIDIA H800",
        "Tesla T4",
        "AMD Instinct MI250",  # the smaller MI250, other figures
        "Aldebaran/MI200 [Instinct MI250X/MI250]",  # either card
        "Mystery GPU",
    ],
)
def test_other_gpu_names_match_nothing(reported):
    assert peaks.match_gpu(reported) is None
    peak, method = peaks.theoretical_peak("fp32", {"accelerators": [{"model": reported}]})
    assert peak is None and method == f"{reported}: not in the GPU table"


def test_every_gpu_entry_has_a_source_and_its_fp32_figure():
    for entry in peaks.GPU_TABLE:
        assert "data sheet" in entry.source and entry.flops["fp32"] > 0
        assert set(entry.flops) <= set(peaks.GPU_DTYPES)


def test_the_gpu_peak_names_the_matched_entry():
    gpus = [{"model": "NVIDIA H100 80GB HBM3"}] * 8
    peak, method = peaks.theoretical_peak("bf16", {"accelerators": gpus})
    assert peak == pytest.approx(989.5e12)
    assert "table entry H100 SXM" in method and "dense bf16" in method and "1 of 8 GPUs" in method
    pcie, method = peaks.theoretical_peak("tf32", {"accelerators": [{"model": "NVIDIA H100 PCIe"}]})
    assert pcie == pytest.approx(378e12) and "H100 PCIe" in method
    none, method = peaks.theoretical_peak(
        "bf16", {"accelerators": [{"model": "Tesla V100-PCIE-32GB"}]}
    )
    assert none is None and method.endswith("(entry V100 PCIe): no bf16 figure")


def test_only_the_gpus_the_run_uses_count():
    hidden = {"model": "NVIDIA H100 80GB HBM3", "visible": False}
    used = {"model": "NVIDIA A100-SXM4-80GB", "visible": True}
    peak, method = peaks.theoretical_peak("fp32", {"accelerators": [hidden, used]})
    assert peak == pytest.approx(19.5e12) and "1 of 1 GPU" in method
    cpu_only = {"accelerators": [hidden], "cpu_vendor": "Imaginary"}
    assert peaks.theoretical_peak("fp32", cpu_only)[1].startswith("unknown: CPU vendor")
    mig = {"accelerators": [{"model": "NVIDIA H100 80GB HBM3", "visible": None}]}
    assert peaks.theoretical_peak("fp32", mig) == (
        None,
        "unknown: which GPUs the run uses (CUDA_VISIBLE_DEVICES names MIG instances)",
    )


# ----------------------------------------------------------------------------- CPUs

ZEN3_FLAGS = "fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2"
ZEN4_FLAGS = ZEN3_FLAGS + " avx512f avx512bw avx512vl avx512_bf16"
SAPPHIRE_FLAGS = ZEN4_FLAGS + " avx512_fp16 amx_bf16 amx_tile amx_int8"


def cpuinfo(vendor, family, model, name, flags, cores=2, threads_per_core=1, topology=True):
    """A /proc/cpuinfo text: one block per logical processor, siblings sharing a core id."""
    blocks = []
    for processor in range(cores * threads_per_core):
        lines = [
            f"processor\t: {processor}",
            f"vendor_id\t: {vendor}",
            f"cpu family\t: {family}",
            f"model\t\t: {model}",
            f"model name\t: {name}",
            "cpu MHz\t\t: 2445.406",
        ]
        if topology:
            lines += ["physical id\t: 0", f"core id\t\t: {processor % cores}"]
        blocks.append("\n".join([*lines, f"flags\t\t: {flags}"]))
    return "\n\n".join(blocks) + "\n"


def hardware(text, tmp_path, max_khz=None, logical=None):
    """L1's CPU facts for `text`, with a cpufreq tree that gives `max_khz` where set."""
    cpufreq = tmp_path / "cpufreq"
    if max_khz:
        cpufreq.mkdir()
        (cpufreq / "cpuinfo_max_freq").write_text(f"{max_khz}\n")
    facts = machine.cpu_facts(text, cpufreq)
    return {**facts, "cpu_logical_cores": logical or text.count("processor\t:")}


@pytest.fixture
def current_clock(tmp_path, monkeypatch):
    """/proc/cpuinfo's current clock, as peaks reads it when no maximum is known: 2.445 GHz."""
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\ncpu MHz\t\t: 2445.406\n")
    monkeypatch.setattr(peaks, "CPUINFO", path)


def test_zen3_like_this_machine_is_two_256_bit_fma_units(tmp_path, current_clock):
    text = cpuinfo("AuthenticAMD", 25, 1, "AMD EPYC", ZEN3_FLAGS)
    facts = hardware(text, tmp_path)
    assert (facts["cpu_family"], facts["cpu_model_number"], facts["cpu_clock_hz"]) == (25, 1, None)
    peak, method = peaks.theoretical_peak("fp32", facts)
    assert peak == pytest.approx(2 * 2.445406e9 * 32)
    assert method.startswith("AMD Zen 3 (AuthenticAMD family 0x19 model 0x01): 32 fp32")
    assert "2 physical cores x 2.45 GHz (current, not max: /proc/cpuinfo cpu MHz)" in method
    bf16, method = peaks.theoretical_peak("bf16", facts)
    assert bf16 == peak and "bf16 computed in fp32" in method
    assert peaks.theoretical_peak("fp64", facts)[0] == pytest.approx(peak / 2)
    assert peaks.theoretical_peak("tf32", facts) == (None, "AMD Zen 3: no tf32 arithmetic on CPUs")


def test_zen4_runs_avx512_on_256_bit_datapaths(tmp_path):
    text = cpuinfo("AuthenticAMD", 25, 17, "AMD EPYC 9654 96-Core Processor", ZEN4_FLAGS, 96, 2)
    facts = hardware(text, tmp_path, max_khz=3_700_000)
    assert facts["cpu_physical_cores"] == 96 and facts["cpu_logical_cores"] == 192
    peak, method = peaks.theoretical_peak("fp32", facts)
    assert peak == pytest.approx(96 * 3.7e9 * 32)  # not 64 FLOPs/cycle: the ISA flags would say
    assert "AMD Zen 4" in method and "AVX-512 executes on 256-bit datapaths" in method
    assert "96 physical cores x 3.70 GHz (cpufreq cpuinfo_max_freq)" in method
    bf16, method = peaks.theoretical_peak("bf16", facts)
    assert bf16 == pytest.approx(2 * peak) and "avx512_bf16" in method


def test_sapphire_rapids_bf16_runs_on_amx_tiles(tmp_path):
    name = "Intel(R) Xeon(R) Platinum 8480+ @ 2.00GHz"
    text = cpuinfo("GenuineIntel", 6, 143, name, SAPPHIRE_FLAGS, 56, 2)
    facts = hardware(text, tmp_path)
    assert facts["cpu_clock_source"] == "nominal, from the model name"
    fp32, method = peaks.theoretical_peak("fp32", facts)
    assert fp32 == pytest.approx(56 * 2.0e9 * 64) and "assumed: two 512-bit FMA units" in method
    bf16, method = peaks.theoretical_peak("bf16", facts)
    assert bf16 == pytest.approx(56 * 2.0e9 * 1024) and "AMX tiles (amx_bf16)" in method
    fp16, method = peaks.theoretical_peak("fp16", facts)  # no amx_fp16 before Granite Rapids
    assert fp16 == pytest.approx(2 * fp32) and "avx512_fp16" in method
    hidden_amx = hardware(text.replace(" amx_bf16", ""), tmp_path / "other")
    assert peaks.theoretical_peak("bf16", hidden_amx)[0] == pytest.approx(2 * fp32)


def test_skylake_silver_has_one_fma_unit(tmp_path):
    for name, per_cycle in [
        ("Intel(R) Xeon(R) Silver 4114 CPU @ 2.20GHz", 32),
        ("Intel(R) Xeon(R) Gold 5218R CPU @ 2.10GHz", 32),
        ("Intel(R) Xeon(R) Gold 5122 CPU @ 3.60GHz", 64),
        ("Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz", 64),
    ]:
        facts = hardware(cpuinfo("GenuineIntel", 6, 85, name, ZEN4_FLAGS), tmp_path)
        peak, _ = peaks.theoretical_peak("fp32", facts)
        assert peak == pytest.approx(2 * facts["cpu_clock_hz"] * per_cycle), name


@pytest.mark.parametrize(
    "vendor, family, model, reason",
    [
        ("CentaurHauls", 7, 91, "unknown: CentaurHauls family 0x7 model 0x5b"),
        ("AuthenticAMD", 26, 0x70, "unknown: AuthenticAMD family 0x1a model 0x70"),
        ("GenuineIntel", 6, 0x97, "unknown: GenuineIntel family 0x6 model 0x97"),
    ],
)
def test_a_core_not_in_the_table_has_no_peak(tmp_path, vendor, family, model, reason):
    facts = hardware(cpuinfo(vendor, family, model, "Some CPU", ZEN4_FLAGS), tmp_path, 3_000_000)
    peak, method = peaks.theoretical_peak("fp32", facts)
    assert peak is None and method.startswith(reason) and "not in the CPU table" in method


def test_cores_are_logical_where_the_topology_is_not_reported(tmp_path, current_clock):
    text = cpuinfo("AuthenticAMD", 23, 0x31, "AMD EPYC 7742", ZEN3_FLAGS, 4, topology=False)
    facts = hardware(text, tmp_path)
    assert facts["cpu_physical_cores"] is None and facts["cpu_sockets"] is None
    peak, method = peaks.theoretical_peak("fp32", facts)
    assert peak == pytest.approx(4 * 2.445406e9 * 32)
    assert "AMD Zen 2" in method and "4 logical cores (physical cores not reported)" in method


def test_arm_cpuinfo_gives_no_vendor_and_no_peak(tmp_path):
    text = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd sve\nCPU implementer\t: 0x41\n"
    facts = hardware(text, tmp_path)
    assert facts["cpu_isa"] == ["asimd", "sve"] and facts["cpu_vendor"] is None
    peak, method = peaks.theoretical_peak("fp32", facts)
    assert peak is None and method == "unknown: CPU vendor, family or model not reported"


# ----------------------------------------------------------------------------- L1


def test_l1_marks_the_visible_gpus_and_counts_only_those(monkeypatch):
    devices = [
        {
            "index": i,
            "model": "NVIDIA H100 80GB HBM3",
            "memory_bytes": 80 << 30,
            "uuid": f"GPU-{i}a",
        }
        for i in range(4)
    ]
    monkeypatch.setattr(machine, "nvidia_gpus", lambda: (devices, "550.54", None))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-2a,0")
    layer = machine.hardware_layer()
    assert [g["visible"] for g in layer["accelerators"]] == [True, False, True, False]
    assert "uuid" not in layer["accelerators"][0]  # one machine's, not its kind's
    assert layer["summary"] == "2 x NVIDIA H100 80GB HBM3 (of 4)"
    assert layer["accelerator_note"] is None
    assert "1 of 2 GPUs" in peaks.theoretical_peak("fp32", layer)[1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    layer = machine.hardware_layer()
    assert not any(g["visible"] for g in layer["accelerators"])
    assert layer["accelerator_note"] == "CUDA_VISIBLE_DEVICES='' leaves no GPU to this run"
    assert "GPU" not in peaks.theoretical_peak("fp32", layer)[1]  # the CPU's peak, or none


def test_a_peak_from_the_current_clock_is_an_estimate_never_an_efficiency_above_one(
    tmp_path, monkeypatch
):
    """A 2-core Zen 4 VM whose hypervisor shows no maximum clock and the model name "AMD EPYC":
    the peak comes from the current clock (2.60 GHz: 166 GFLOP/s fp32) and roofline --quick
    measured 231 GFLOP/s. The peak is called an estimate; no efficiency is given against it,
    and the measured ceiling above it is a warning naming both."""
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\ncpu MHz\t\t: 2600.000\n")
    monkeypatch.setattr(peaks, "CPUINFO", path)
    facts = hardware(cpuinfo("AuthenticAMD", 25, 17, "AMD EPYC", ZEN4_FLAGS), tmp_path)
    peak, method = peaks.theoretical_peak("fp32", facts)
    assert peak == pytest.approx(2 * 2.6e9 * 32)  # 166.4 GFLOP/s
    below, why_below = peaks.efficiency(150e9, peak, method)
    assert below is None and "estimate from the current clock" in why_below
    above, why_above = peaks.efficiency(231e9, peak, method)
    assert above is None
    assert "231.0 GFLOP/s is above the stated peak 166.4 GFLOP/s" in why_above
    assert "current, not max" in why_above


def test_efficiency_against_an_upper_bound(tmp_path):
    text = cpuinfo("AuthenticAMD", 25, 17, "AMD EPYC 9654 96-Core Processor", ZEN4_FLAGS, 96, 2)
    peak, method = peaks.theoretical_peak("fp32", hardware(text, tmp_path, max_khz=3_700_000))
    assert peaks.efficiency(peak / 4, peak, method) == (pytest.approx(0.25), None)
    above, warning = peaks.efficiency(peak * 1.1, peak, method)
    assert above is None and "no upper bound here" in warning
    assert peaks.efficiency(1e9, None, "unknown: ...") == (None, None)
