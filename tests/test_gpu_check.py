"""tools/gpu_check.py: the GPU node check's harness, on a CPU (a GPU run is the real test)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "gpu_check.py"


def _gpu_check(args, env=None, timeout=600):
    return subprocess.run(
        ["timeout", "-k", "5", str(timeout), sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def _fake_nvidia_smi(directory: Path, gpus: int) -> dict:
    script = directory / "nvidia-smi"
    lines = "\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08d})" for i in range(gpus))
    script.write_text(f"#!/bin/sh\ncat <<'END'\n{lines}\nEND\n")
    script.chmod(0o755)
    return {"PATH": f"{directory}{os.pathsep}{os.environ['PATH']}"}


def test_a_machine_without_gpus_fails_the_check_and_runs_nothing_else(tmp_path):
    out = tmp_path / "summary.json"
    result = _gpu_check(["--out", str(out)], env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 1
    summary = json.loads(out.read_text())
    assert summary["passed"] is False and summary["rehearsal_on_cpu"] is False
    devices = summary["checks"]["devices"]
    assert devices["status"] == "failed" and "nvidia-smi not found" in devices["why"]
    assert devices["tensorflow"]["gpus"] == []
    others = {name: c["status"] for name, c in summary["checks"].items() if name != "devices"}
    assert others == dict.fromkeys(
        ("train_fp16", "train_bf16", "all_reduce", "energy", "roofline"), "not run"
    )
    assert "not every check passed" in result.stderr


def test_gpus_that_tensorflow_does_not_see_fail_with_the_fix(tmp_path):
    out = tmp_path / "summary.json"
    result = _gpu_check(["--out", str(out)], env=_fake_nvidia_smi(tmp_path, 2))
    assert result.returncode == 1
    devices = json.loads(out.read_text())["checks"]["devices"]
    assert len(devices["nvidia_smi"]) == 2
    assert "TensorFlow sees 0 of the 2 GPUs" in devices["why"] and ".[cuda]" in devices["why"]


def test_an_existing_summary_is_never_overwritten(tmp_path):
    out = tmp_path / "summary.json"
    out.write_text("mine")
    result = _gpu_check(["--out", str(out)])
    assert result.returncode == 2 and "exists" in result.stderr
    assert out.read_text() == "mine"


@pytest.mark.slow
def test_the_rehearsal_on_cpu_runs_every_check(tmp_path):
    """The whole harness on 2 cores (~2 min): tiny trains in both precisions, a 2-device
    all-reduce, the roofline; energy is 'not run' here (no sensors)."""
    out = tmp_path / "summary.json"
    result = _gpu_check(["--rehearse-on-cpu", "--steps", "8", "--out", str(out)])
    summary = json.loads(out.read_text())
    checks = summary["checks"]
    assert summary["rehearsal_on_cpu"] is True
    for name in ("devices", "train_fp16", "train_bf16", "all_reduce", "roofline"):
        assert checks[name]["status"] == "passed", (name, checks[name], result.stderr)
    for precision in ("fp16", "bf16"):
        assert checks[f"train_{precision}"]["examples_per_s"] > 0
    assert checks["all_reduce"]["replicas"] == 2 and checks["all_reduce"]["bus_bandwidth_gb_s"] > 0
    assert checks["energy"]["status"] == "not run"
    assert checks["roofline"]["dtypes"]["fp32"]["gemm_ceiling"] > 0
    assert result.returncode == 1  # energy could not be checked: not a pass
