"""tools/gpu_check.py: the GPU node check's harness, on a CPU (a GPU run is the real test)."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcai500_tf.cluster.devices import WORKER_GPUS

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
    """Counted among the GPUs this process may use: 2 of the node's 8 here."""
    out = tmp_path / "summary.json"
    env = _fake_nvidia_smi(tmp_path, 8) | {"CUDA_VISIBLE_DEVICES": "0,1"}
    result = _gpu_check(["--out", str(out)], env=env)
    assert result.returncode == 1
    devices = json.loads(out.read_text())["checks"]["devices"]
    assert len(devices["nvidia_smi"]) == 8
    assert "TensorFlow sees 0 of the 2 GPUs CUDA_VISIBLE_DEVICES=0,1 leaves" in devices["why"]
    assert ".[cuda]" in devices["why"]


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


def test_a_second_install_reuses_its_venv_and_never_remakes_it_from_python3(tmp_path):
    """A venv made before (here: a stand-in whose Python passes the version check) is
    reused: `python3 -m venv` over it (Ubuntu's 3.10 on a rerun without PYTHON=) would
    repoint it at 3.10."""
    venv, fake = tmp_path / "venv", tmp_path / "bin"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(  # a 3.11+ Python for the version check; pip fails
        f'#!/bin/sh\n[ "$1" = -c ] && exec "{sys.executable}" "$@"\necho "$@" > "{tmp_path}/pip"\n'
        "exit 1\n"
    )
    (venv / "bin" / "python").chmod(0o755)
    fake.mkdir()
    (fake / "python3").write_text(f'#!/bin/sh\necho "$@" >> "{tmp_path}/python3-calls"\nexit 1\n')
    (fake / "python3").chmod(0o755)
    env = {"GPU_CHECK_VENV": str(venv), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "",
           "PATH": f"{fake}:{os.environ['PATH']}"}  # fmt: skip
    result = subprocess.run(
        ["bash", str(SHELL), "--install", "--out", str(tmp_path / "summary.json")],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env}, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2
    assert (tmp_path / "pip").read_text().startswith("-m pip install")  # the venv's own
    (line,) = result.stderr.splitlines()
    assert line.startswith("gpu_check.sh: error: could not install the package with its cuda")
    assert not (tmp_path / "python3-calls").exists()  # python3 -m venv never ran
    assert (venv / "bin" / "python").exists()  # the venv made before is kept


def test_a_python_older_than_3_11_is_one_line_naming_it_and_the_fix(tmp_path):
    """Ubuntu 22.04's python3 is 3.10: named before any venv is made or pip blamed."""
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("python3", "python"):
        (fake / name).write_text("#!/bin/sh\necho 3.10\n")
        (fake / name).chmod(0o755)
    venv, out = tmp_path / "venv", tmp_path / "summary.json"
    for install in (["--install"], []):
        result = subprocess.run(
            ["bash", str(SHELL), *install, "--out", str(out)], capture_output=True, text=True,
            cwd=ROOT, env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}",
                           "GPU_CHECK_VENV": str(venv)}, timeout=60,
        )  # fmt: skip
        assert result.returncode == 2
        (line,) = result.stderr.splitlines()
        python = "python3" if install else "python"
        assert line.startswith(f"gpu_check.sh: error: {python} is Python 3.10; the package "), line
        assert "3.11 or newer" in line and "PYTHON=/path/to/python3.11" in line
        assert not venv.exists() and not out.exists()


def test_the_gpus_tensorflow_is_compared_with_are_those_this_process_may_use(gpu_check):
    assert gpu_check.missing_gpus(2, 8, "0,1") is None  # a subset: all of it seen
    assert gpu_check.missing_gpus(8, 8, None) is None
    why = gpu_check.missing_gpus(1, 8, "2,3")
    assert why.startswith("TensorFlow sees 1 of the 2 GPUs CUDA_VISIBLE_DEVICES=2,3 leaves of ")
    assert "nvidia-smi's 8: CUDA's libraries did not load" in why
    assert gpu_check.missing_gpus(0, 8, None).startswith("TensorFlow sees 0 of the 8 GPUs ")
    assert gpu_check.missing_gpus(0, 2, "-1") == (
        "CUDA_VISIBLE_DEVICES=-1 leaves none of nvidia-smi's 2 GPUs: unset it"
    )


def test_a_training_check_cut_while_cuda_compiled_says_cold_jit_rerun(gpu_check):
    before = {"path": "/home/u/.nv/ComputeCache", "max_bytes": 2**32, "bytes": 0}
    after = before | {"bytes": 300 * 2**20}
    cut = {"train_fp16": {"status": "failed", "why": "did not finish within 171 s"}}
    cut["train_bf16"] = {"status": "not run", "why": "the 600 s deadline was reached"}
    note = gpu_check.cold_jit(cut, before, after)
    assert note.startswith("cold JIT: rerun: train_fp16 and train_bf16 cut by the deadline")
    assert "300 MiB more" in note
    assert gpu_check.cold_jit(cut, before, before) is None  # nothing compiled: not JIT
    passed = {name: {"status": "passed"} for name in ("train_fp16", "train_bf16")}
    assert gpu_check.cold_jit(passed, before, after) is None


# ------------------------------------------------------------------ the all-reduce check's parts


@pytest.fixture(scope="module")
def gpu_check():
    """tools/gpu_check.py as a module (it imports no TensorFlow)."""
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FOUR = ["0", "1", "2", "3"]


def test_the_all_reduce_workers_get_their_gpu_as_train_workers_n_gives_it(gpu_check):
    """set_visible_devices (the project's default): every worker sees every GPU (the variable
    as it was) and computes on its position; cuda_visible_devices: each sees its own only. A
    share set by hand is not passed on; NCCL_DEBUG=INFO unless set."""
    base = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "4,5,6,7", WORKER_GPUS: "1"}
    gpus = ["4", "5", "6", "7"]
    ports = [2001, 2002, 2003, 2004]
    share = gpu_check.all_reduce_environments("set_visible_devices", gpus, ports, base)
    assert [env[WORKER_GPUS] for env in share] == FOUR
    assert {env["CUDA_VISIBLE_DEVICES"] for env in share} == {"4,5,6,7"}
    isolated = gpu_check.all_reduce_environments("cuda_visible_devices", gpus, ports, base)
    assert [env["CUDA_VISIBLE_DEVICES"] for env in isolated] == gpus
    assert not any(WORKER_GPUS in env for env in isolated)
    for index, env in enumerate(share + isolated):
        config = json.loads(env["TF_CONFIG"])
        assert config["task"] == {"type": "worker", "index": index % 4}
        assert config["cluster"]["worker"] == [f"127.0.0.1:{port}" for port in ports]
        assert env["NCCL_DEBUG"] == "INFO" and env["TF_NUM_INTRAOP_THREADS"]
    unset = gpu_check.all_reduce_environments("set_visible_devices", FOUR, ports, {})
    assert [env[WORKER_GPUS] for env in unset] == FOUR
    assert not any("CUDA_VISIBLE_DEVICES" in env for env in unset)  # every GPU of the node
    quieter = {"NCCL_DEBUG": "WARN"}
    assert (
        gpu_check.all_reduce_environments("set_visible_devices", FOUR, ports, quieter)[0][
            "NCCL_DEBUG"
        ]
        == "WARN"
    )
    rehearsal = gpu_check.all_reduce_environments("set_visible_devices", [], ports[:2], {})
    for env in rehearsal:  # CPU workers: no GPU variable, no NCCL
        assert not {WORKER_GPUS, "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG"} & set(env)


NCCL_OUTPUT = """\
gpu8:101:101 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
gpu8:101:130 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1
gpu8:101:130 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
gpu8:101:130 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read
gpu8:101:130 [0] NCCL INFO Ring 02 : 0[1a000] -> 1[1b000] via P2P/IPC
gpu8:101:130 [0] NCCL INFO Channel 00/1 : 0[0] -> 1[1] [send] via NET/IB/0
gpu8:101:130 [0] NCCL INFO Could not enable P2P between dev 0(=1a000) and dev 1(=1b000)
gpu8:101:130 [0] NCCL INFO Could not enable P2P between dev 0(=1a000) and dev 1(=1b000)
gpu8:101:130 [0] NCCL WARN Cuda failure 'peer access is not supported between these two devices'
gpu8:101:130 [0] NCCL INFO Connected all rings
"""


def test_nccl_debug_output_gives_the_transports_version_and_p2p_notes(gpu_check):
    log = gpu_check.nccl_log([NCCL_OUTPUT, "gpu8:102:140 [1] NCCL INFO Channel 00/0 : 1[1] -> "
                              "0[0] via SHM/direct/direct\n"])  # fmt: skip
    assert log["transports"] == {
        "NET/IB/0": 1, "P2P/CUMEM/read": 2, "P2P/IPC": 1, "SHM/direct/direct": 1
    }  # fmt: skip
    assert log["version"] == "2.21.5+cuda12.4"
    assert log["notes"] == [
        "INFO Could not enable P2P between dev 0(=1a000) and dev 1(=1b000)",
        "WARN Cuda failure 'peer access is not supported between these two devices'",
    ]
    assert gpu_check.nccl_log(["no NCCL here"]) == {"transports": {}, "version": None, "notes": []}


def test_the_p2p_verdict_names_the_placement_that_kept_p2p(gpu_check):
    def placement(transports, bus=None, status="passed"):
        return {"status": status, "nccl_transports": transports, "bus_bandwidth_gb_s": bus}

    both = {
        "set_visible_devices": placement({"P2P/CUMEM/read": 24}, 351.0),
        "cuda_visible_devices": placement({"SHM/direct/direct": 24}, 20.25),
    }
    assert gpu_check.p2p_verdict(both) == (
        "P2P with set_visible_devices only (set_visible_devices: P2P/CUMEM/read, bus 351.0 "
        "GB/s; cuda_visible_devices: SHM/direct/direct, bus 20.2 GB/s)"
    )
    both["cuda_visible_devices"] = placement({"P2P/IPC": 24}, 350.0)
    assert gpu_check.p2p_verdict(both).startswith(
        "P2P with set_visible_devices and cuda_visible_devices ("
    )
    shm = {"set_visible_devices": placement({"SHM/direct/direct": 2}, 9.0)}
    shm["cuda_visible_devices"] = {"status": "not run", "why": "the check's time was spent"}
    assert gpu_check.p2p_verdict(shm) == (
        "no P2P with set_visible_devices (set_visible_devices: SHM/direct/direct, bus 9.0 "
        "GB/s; cuda_visible_devices: not run)"
    )
    unseen = {"set_visible_devices": placement("not seen (...)", 1.0)}
    assert gpu_check.p2p_verdict(unseen).startswith("not seen: no NCCL_DEBUG=INFO connection")


def test_the_all_reduce_worker_builds_its_strategy_as_train_does(gpu_check):
    """Through make_strategy, which gives TensorFlow the worker's share (set_visible_devices)
    before it builds the strategy; NCCL between GPUs, ring in the rehearsal."""
    script = gpu_check.ALL_REDUCE_SCRIPT
    compile(script, "all_reduce", "exec")
    assert 'make_strategy("multi_worker", CommunicationConfig("nccl" if nccl else "ring"' in script
    assert "MultiWorkerMirroredStrategy(" not in script and "set_visible_devices" not in script
    assert script.index("import_tensorflow()") < script.index("make_strategy(")


def test_both_placements_are_timed_within_the_checks_time(gpu_check, monkeypatch):
    """Each placement gets an equal part of what is left (all of it to the default one where
    a part is too short); one that hangs to its limit leaves the other its part; the
    top-level figures are the default placement's."""
    clock = [1000.0]
    runs = []

    def run_together(command, environments, seconds):
        placement = "set_visible_devices" if WORKER_GPUS in environments[0] else "cuda_vis"
        runs.append((placement, round(seconds, 3), [env.get(WORKER_GPUS) for env in environments]))
        clock[0] += seconds if placement == "set_visible_devices" else 1.0  # the first hangs
        line = "gpu8:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct\n"
        measured = {"replicas": 2, "seconds": [0.01] * 10, "chain": 5, "value_correct": True,
                    "gpu_assignment": "cuda", "cuda_gpus": 1, "tensorflow_gpus": 1}  # fmt: skip
        hung = {"ok": False, "code": None, "stdout": line, "stderr": "did not finish within",
                "stderr_all": "did not finish within"}  # fmt: skip
        done = {"ok": True, "code": 0, "stdout": f"{line}{json.dumps(measured)}\n", "stderr": "",
                "stderr_all": ""}  # fmt: skip
        return [hung if placement == "set_visible_devices" else done for _ in environments]

    monkeypatch.setattr(gpu_check, "run_together", run_together)
    fake_time = SimpleNamespace(monotonic=lambda: clock[0], time=time.time)  # this module's
    monkeypatch.setattr(gpu_check, "time", fake_time)
    result = gpu_check.check_all_reduce(False, ["0", "1"], 60.0)
    assert runs == [("set_visible_devices", 30.0, ["0", "1"]), ("cuda_vis", 30.0, [None, None])]
    placements = result["placements"]
    assert list(placements) == ["set_visible_devices", "cuda_visible_devices"]
    assert placements["set_visible_devices"]["status"] == "failed"
    assert placements["cuda_visible_devices"]["bus_bandwidth_gb_s"] == pytest.approx(
        2**28 / 0.01 / 1e9
    )
    assert result["status"] == "failed" and result["why"].startswith("set_visible_devices: did")
    assert result["default_placement"] == "set_visible_devices" and "replicas" not in result
    assert result["p2p"].startswith("no P2P with set_visible_devices or cuda_visible_devices")
    assert placements["cuda_visible_devices"]["worker_gpus"] == [
        "CUDA_VISIBLE_DEVICES='0'", "CUDA_VISIBLE_DEVICES='1'"
    ]  # fmt: skip
    runs.clear()
    clock[0] = 1000.0
    late = gpu_check.check_all_reduce(False, ["0", "1"], 9.0)  # 4.5 s each: all to the first
    assert runs == [("set_visible_devices", 9.0, ["0", "1"])]
    assert late["placements"]["cuda_visible_devices"]["status"] == "not run"
    mig = gpu_check.check_all_reduce(False, ["MIG-a", "MIG-b"], 60.0)
    assert list(mig["placements"]) == ["cuda_visible_devices"]  # no CUDA IPC between them
    assert mig["status"] == "passed" and mig["default_placement"] == "cuda_visible_devices"


def test_workers_run_together_write_freely_and_are_ended_by_the_time_limit(gpu_check):
    """Output to files, not pipes: a worker writing more than a pipe holds while its peer
    waits does not stall them; a worker past the limit is killed and says so."""
    chatty = [sys.executable, "-c", "import sys; sys.stdout.write('x' * 300_000 + '\\nok\\n')"]
    start = time.monotonic()
    results = gpu_check.run_together(chatty, [dict(os.environ)] * 2, 60)
    assert [r["ok"] for r in results] == [True, True] and time.monotonic() - start < 30
    assert all(r["stdout"].endswith("ok\n") and len(r["stdout"]) > 300_000 for r in results)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    (late,) = gpu_check.run_together(sleeper, [dict(os.environ)], 1)
    assert late["code"] is None and "did not finish within 1 s" in late["stderr"]


def test_the_summary_names_the_faster_setting_from_the_timed_runs(gpu_check, monkeypatch, tmp_path):
    """A node of 4 GPUs whose fake timed runs make XLA faster and one process per GPU slower
    than MirroredStrategy in one process: the summary's `defaults` names each faster setting,
    its speed-up and the option that applies it; every run it timed was asked as named."""
    rates = {"": 1000.0, "xla": 1200.0, "one-process": 3900.0, "workers": 3600.0}
    timed = {}

    def fake_train(precision, rehearse, steps, batch, work, seconds, setting=None):
        name = setting.name if setting else ""
        timed[name] = setting
        return {"status": "passed", "examples_per_s": rates[name] if precision == "fp16" else 1.0}

    devices = {
        "status": "passed",
        "tensorflow": {"gpus": [{"name": f"/GPU:{i}"} for i in range(4)]},
    }
    monkeypatch.setattr(gpu_check, "check_train", fake_train)
    monkeypatch.setattr(gpu_check, "check_devices", lambda rehearse, seconds: devices)
    monkeypatch.setattr(gpu_check, "check_all_reduce", lambda *a: {"status": "passed"})
    monkeypatch.setattr(gpu_check, "check_roofline", lambda *a: {"status": "passed"})
    monkeypatch.setattr(gpu_check, "check_energy", lambda *a: {"status": "passed"})
    asked = gpu_check.checks_asked(compare_settings=True)
    assert asked == (*CHECKS[:3], "train_fp16_xla", "node_one_process", "node_workers") + (
        "defaults",
        *CHECKS[3:],
    )
    summary, out = {"started": 0.0, "checks": {}, "asked": asked}, tmp_path / "summary.json"
    args = type("Args", (), {"rehearse_on_cpu": False, "steps": 10, "batch": 8, "deadline": 600})
    gpu_check.run_checks(summary, out, args, gpu_check.time.monotonic() + 600, tmp_path)
    defaults = summary["checks"]["defaults"]
    assert defaults["status"] == "passed"
    assert (
        defaults["xla"]["faster"] == "on" and defaults["xla"]["apply"] == "--set training.xla=true"
    )
    assert defaults["xla"]["speedup"] == pytest.approx(1.2)
    assert defaults["node"]["faster"] == "one process"
    assert defaults["node"]["apply"] == "--set training.strategy=mirrored"
    assert defaults["node"]["speedup"] == pytest.approx(3900 / 3600)
    assert timed["xla"].arguments == ("--set", "training.xla=true") and timed["xla"].gpus == 1
    assert timed["workers"].arguments == ("--workers", "4") and timed["workers"].gpus == 4
    written = json.loads(out.read_text())
    assert written["checks"]["defaults"] == defaults and written["passed"] is True


def test_a_single_gpu_node_times_xla_but_compares_no_processes(gpu_check):
    checks = {
        "train_fp16": {"examples_per_s": 1000.0},
        "train_fp16_xla": {"examples_per_s": 900.0},
        "node_one_process": {"status": "not run", "why": "1 GPU(s): one process each"},
    }
    defaults = gpu_check.faster_settings(checks, 1)
    assert defaults["xla"]["faster"] == "off" and defaults["xla"]["speedup"] == pytest.approx(
        1 / 0.9
    )
    assert defaults["node"]["status"] == "not run" and "node_one_process" in defaults["node"]["why"]
    assert defaults["status"] == "not run"


@pytest.mark.parametrize(
    ("given", "limit"),
    [(["--deadline", "1200"], "1260"), (["--deadline=1200"], "1260"), ([], "660")],
)
def test_the_outer_limit_follows_the_deadline_in_either_form(tmp_path, given, limit):
    """`--deadline=1200` left the outer limit at 660 s, which cut a 1200 s check; an
    abbreviated `--dead 1200` is refused by the harness rather than read past."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "timeout").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{tmp_path}/timeout"\n')
    (fake / "timeout").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "PYTHON": sys.executable}
    result = subprocess.run(
        ["bash", str(SHELL), *given], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "timeout").read_text().splitlines()[:3] == ["-k", "10", limit]
    refused = _gpu_check(["--dead", "1200", "--out", str(tmp_path / "s.json")])
    assert refused.returncode == 2 and "unrecognized arguments: --dead" in refused.stderr
