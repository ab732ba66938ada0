"""tools/gpu_check.py: the GPU node check's harness, on a CPU (a GPU run is the real test)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "gpu_check.py"
SHELL = ROOT / "tools" / "gpu_check.sh"
CHECKS = ("devices", "train_fp16", "train_bf16", "all_reduce", "energy", "roofline")


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


def test_the_summary_is_there_from_the_start_and_names_what_a_kill_cut_off(tmp_path):
    """SIGTERM (an outer timeout) while a check runs: the summary holds the checks done so far
    and names the rest as unfinished; it is never half a file."""
    out = tmp_path / "summary.json"
    command = [sys.executable, str(SCRIPT), "--rehearse-on-cpu", "--steps", "8", "--out", str(out)]
    child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 240
        summary = {}
        while time.time() < deadline and "devices" not in summary.get("checks", {}):
            assert child.poll() is None, child.stderr.read()
            time.sleep(0.1)
            summary = json.loads(out.read_text()) if out.exists() else {}
        assert summary["checks"]["devices"]["status"] == "passed", summary
        assert summary["unfinished"] == list(CHECKS[1:]) and summary["passed"] is False
        child.send_signal(signal.SIGTERM)  # while train_fp16 runs
        assert child.wait(60) == 143
    finally:
        child.kill()
    summary = json.loads(out.read_text())
    assert summary["checks"]["devices"]["status"] == "passed"
    assert "roofline" in summary["unfinished"] and summary["passed"] is False
    assert summary["cuda_cache_before"]["max_bytes"] == 4 * 2**30
    assert not list(tmp_path.glob(".*.tmp"))


def test_one_deadline_for_every_check(tmp_path):
    """A deadline too short for any check: each is "not run" with the deadline as the reason,
    at once, and the summary says so."""
    out = tmp_path / "summary.json"
    start = time.time()
    result = _gpu_check(["--rehearse-on-cpu", "--deadline", "4", "--out", str(out)])
    assert result.returncode == 1 and time.time() - start < 60
    checks = json.loads(out.read_text())["checks"]
    timed = [name for name in CHECKS if name != "energy"]
    assert all(checks[n] == {"status": "not run", "why": "the 4 s deadline was reached"}
               for n in timed), checks  # fmt: skip


def test_install_without_the_package_index_is_one_line_and_leaves_nothing(tmp_path):
    venv = tmp_path / "venv"
    env = {"GPU_CHECK_VENV": str(venv), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""}
    result = subprocess.run(
        ["bash", str(SHELL), "--install", "--out", str(tmp_path / "summary.json")],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env}, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("gpu_check.sh: error: could not install the package with its cuda")
    assert not venv.exists() and not (tmp_path / "summary.json").exists()
