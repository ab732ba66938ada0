"""AMD GPUs named as ROCm names them (amd-smi, rocm-smi; HIP_VISIBLE_DEVICES), their peaks
reached by those names, and multi-worker runs and energy on them refused or reported as not
measured in one line, never the CPU path (fake ROCm tools: no AMD GPU here)."""

import json

import pytest

from hpcai500_tf.cluster import machine
from hpcai500_tf.cluster import workers as cluster_workers
from hpcai500_tf.energy import sources
from hpcai500_tf.errors import UserError
from hpcai500_tf.roofline import peaks

ROCM_SMI = {
    "card0": {
        "Card Series": "AMD Instinct MI300X OAM",
        "Card Vendor": "AMD",
        "GFX Version": "gfx942",
    },
    "card1": {
        "Card Series": "AMD Instinct MI300X OAM",
        "Card Vendor": "AMD",
        "GFX Version": "gfx942",
    },
}
AMD_SMI = [
    {"gpu": i, "asic": {"market_name": "AMD Instinct MI250X", "vendor_id": "0x1002"}}
    for i in range(2)
]


@pytest.fixture
def rocm_tools(tmp_path, monkeypatch):
    """Put fake `rocm-smi` or `amd-smi` on PATH (only NVIDIA's absence is real here)."""

    def install(name: str, listing) -> None:
        script = tmp_path / name
        script.write_text(f"#!/bin/sh\ncat <<'END'\n{json.dumps(listing)}\nEND\n")
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
        machine.amd_gpus.cache_clear()

    monkeypatch.setattr(machine, "nvidia_gpus", lambda: ([], None, "no NVML"))
    monkeypatch.setattr(cluster_workers, "node_gpu_count", lambda: 0)
    yield install
    machine.amd_gpus.cache_clear()


def test_rocm_smi_gpus_are_named_in_l1_and_reach_the_peak_table(rocm_tools, monkeypatch):
    rocm_tools("rocm-smi", ROCM_SMI)
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1")
    l1 = machine.hardware_layer()
    assert [(g["model"], g["vendor"], g["visible"]) for g in l1["accelerators"]] == [
        ("AMD Instinct MI300X OAM", "AMD", False),
        ("AMD Instinct MI300X OAM", "AMD", True),
    ]
    assert l1["summary"] == "1 x AMD Instinct MI300X OAM (of 2)"
    peak, method = peaks.theoretical_peak("bf16", l1)
    assert peak == pytest.approx(1307.4e12) and "MI300X" in method


def test_amd_smi_gpus_are_named_too(rocm_tools):
    rocm_tools("amd-smi", AMD_SMI)
    l1 = machine.hardware_layer()
    assert l1["summary"] == "2 x AMD Instinct MI250X"
    assert "MI250X (one GCD)" in peaks.theoretical_peak("fp32", l1)[1]


def test_a_multi_worker_run_on_amd_gpus_is_refused_in_one_line(rocm_tools):
    rocm_tools("rocm-smi", ROCM_SMI)
    with pytest.raises(UserError, match="multi-worker runs on AMD GPUs are not built yet") as error:
        cluster_workers.strategy_overrides(launching_workers=True)
    assert "\n" not in str(error.value)
    assert cluster_workers.strategy_overrides(launching_workers=False) == []  # one worker runs


def test_amd_gpu_energy_is_reported_as_not_measured(rocm_tools, tmp_path):
    rocm_tools("rocm-smi", ROCM_SMI)
    found, notes = sources.discover(nvml=None, powercap_root=tmp_path / "no-powercap")
    assert not [s for s in found if s.part == "GPU board"]
    assert "GPU boards: AMD GPUs' energy is not measured (ROCm SMI is not read yet)" in notes


def test_a_machine_without_rocm_tools_lists_no_amd_gpu(rocm_tools):
    rocm_tools("unrelated-tool", {})
    assert machine.amd_gpus()[0] == []
