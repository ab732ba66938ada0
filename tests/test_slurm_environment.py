"""Slurm's environment as hostile or surprising as it gets (issues 36 and 42): numbers read by
one strict reader, every expansion bounded before any list is built, the step's own task count,
the GPUs and binding Slurm gives a task, unequal GPUs per worker, and hosts that do not resolve.
Each reproduction ends in one line naming what is wrong, exit 2, no traceback, within 30 s; the
expansions under a memory cap. Slurm is faked by its variables, NVML by a stand-in module."""

import os
import resource
import socket
import subprocess
import sys
import time
import tracemalloc
import types
from pathlib import Path

import pytest

from hpcai500_tf.cluster import devices as cluster_devices
from hpcai500_tf.cluster import machine, slurm
from hpcai500_tf.cluster import workers as cluster_workers
from hpcai500_tf.errors import UserError
from hpcai500_tf.pytorch import distributed

ROOT = Path(__file__).resolve().parents[1]

# The reproduction of issue 42 (kind 1): a two-task step, one task per node.
STEP = {
    "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_JOB_ID": "1", "SLURM_STEP_NODELIST": "node[1-2]",
}  # fmt: skip

HOSTILE = [
    ({"SLURM_STEP_NODELIST": "node[1-1000000000]"}, "SLURM_STEP_NODELIST='node[1-1000000000]'"),
    ({"SLURM_STEP_NODELIST": "a[1-1000]b[1-1000]c[1-1000]"}, "more than 1,000,000 hosts"),
    ({"SLURM_STEP_TASKS_PER_NODE": "1(x1000000000)"}, "counts tasks on 1000000000 node(s)"),
    ({"SLURM_STEP_TASKS_PER_NODE": f"1(x{10**30})"}, "SLURM_STEP_TASKS_PER_NODE='1(x1000"),
    ({"SLURM_STEP_TASKS_PER_NODE": "1000000(x2)"}, "places more than 1,000,000 tasks"),
    ({"SLURM_STEP_RESV_PORTS": "1-1000000000"}, "SLURM_STEP_RESV_PORTS='1-1000000000'"),
    ({"SLURM_STEP_RESV_PORTS": "65535-65536"}, "ports (1 to 65535)"),
    ({"SLURM_JOB_ID": "9" * 5000}, "SLURM_JOB_ID='99999"),
    ({"SLURM_NTASKS": "²"}, "SLURM_NTASKS='²' is not a whole number"),  # str.isdigit() takes it
    ({"SLURM_STEP_NUM_TASKS": "²"}, "SLURM_STEP_NUM_TASKS='²' is not a whole number"),
    ({"SLURM_CPUS_PER_TASK": "1" * 40}, "SLURM_CPUS_PER_TASK='1111"),
    ({"SLURM_GPUS_ON_NODE": "1(x3)"}, "SLURM_GPUS_ON_NODE='1(x3)' is not a whole number"),
]
IDS = ["nodes", "product", "tasks-x", "tasks-10**30", "tasks-sum", "ports", "port-65536",
       "job-id", "ntasks-superscript", "step-superscript", "cpus", "gpus-on-node"]  # fmt: skip


def _one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message and len(message) < 600, message
    return message


@pytest.mark.parametrize("change, named", HOSTILE, ids=IDS)
def test_a_hostile_slurm_environment_is_one_line_in_bounded_time_and_memory(
    monkeypatch, change, named
):
    """Counted arithmetically, before any list is built: well under 50 MB and 5 s."""
    monkeypatch.setattr(cluster_workers, "node_gpu_count", lambda: 0)  # NVML's: none here
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(UserError) as refused:
            cluster_workers.slurm_cluster({**STEP, **change})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert named in _one_line(refused)
    assert peak < 50e6 and time.monotonic() - started < 5


@pytest.mark.parametrize("tasks", ["-1", "0", "abc", "²", "1" * 30, " "])
def test_slurm_ntasks_that_is_no_count_is_one_line_not_a_single_worker(tasks):
    """Issue 42: SLURM_NTASKS of -1, 0, abc used to mean 'not under srun'."""
    environ = {"SLURM_PROCID": "0", "SLURM_NTASKS": tasks}
    with pytest.raises(UserError) as refused:
        cluster_workers.under_slurm(environ)
    assert _one_line(refused).startswith("SLURM_NTASKS=")
    with pytest.raises(UserError, match="^SLURM_NTASKS="):
        distributed.workers_from_environment(environ)


@pytest.mark.parametrize(
    "text, named",
    [
        (
            '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1%s}}'
            % ("0" * 5000),
            "TF_CONFIG holds a number of more than 4,300 digits",
        ),  # fmt: skip
        (
            '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1%s}}'
            % ("0" * 4000),
            "TF_CONFIG: task index 1000",
        ),  # fmt: skip
        ('{"cluster": {"worker": ["a:²"]}, "task": {"type": "worker", "index": 0}}', "'a:²'"),
        ('{"cluster": {"worker": ["a:99999"]}, "task": {"type": "worker", "index": 0}}', "a:99999"),
        (
            '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": true}}',
            "task index must be a JSON whole number, got 'true'",
        ),
        (
            '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "0"}}',
            """task index must be a JSON whole number, got '"0"'""",
        ),
        ("[" * 100_000 + "]" * 100_000, "TF_CONFIG is nested too deeply"),
    ],
    ids=[
        "5000-digits",
        "4000-digits",
        "superscript-port",
        "port-99999",
        "bool-index",
        "str-index",
        "deep",
    ],
)
def test_tf_config_numbers_are_read_strictly(text, named):
    with pytest.raises(UserError) as refused:
        cluster_workers.parse_tf_config(text)
    assert named in _one_line(refused)


# ------------------------------------------------------------------ the step's own tasks

BATCH = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "7",
         "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "1(x2)"}  # fmt: skip


def test_a_batch_script_of_a_two_task_job_is_refused_at_once_naming_srun():
    """Issue 36 item 5: no SLURM_STEP_NUM_TASKS, so no srun started the other task."""
    for read in (
        cluster_workers.under_slurm,
        distributed.workers_from_environment,
        cluster_workers.cluster_plan,
    ):
        with pytest.raises(UserError) as refused:
            read(BATCH)
        message = _one_line(refused)
        assert message.startswith("SLURM_NTASKS=2 but SLURM_STEP_NUM_TASKS is not set")
        assert "srun hpcai500-tf train" in message and "srun -n1" in message
    one = {**BATCH, "SLURM_NTASKS": "1"}
    assert (
        not cluster_workers.under_slurm(one)
        and not distributed.workers_from_environment(one).several
    )
    assert not cluster_workers.under_slurm({**BATCH, "SLURM_STEP_NUM_TASKS": "1"})  # srun -n1


# ------------------------------------------------------------------ GPUs and binding


def _per_gpu_task(local: int, **extra) -> dict:
    """Task `local` of `srun -N2 --ntasks-per-node=8 --gpus-per-task=1` on a site that
    constrains devices: it sees only its own GPU, as CUDA_VISIBLE_DEVICES=0."""
    return {
        "SLURM_PROCID": str(8 + local), "SLURM_LOCALID": str(local), "SLURMD_NODENAME": "gpu2",
        "SLURM_NTASKS": "16", "SLURM_STEP_NUM_TASKS": "16", "SLURM_JOB_ID": "77",
        "SLURM_STEP_NODELIST": "gpu[1-2]", "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
        "SLURM_CPUS_PER_TASK": "8", "SLURM_GPUS_ON_NODE": "8", "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7",
        "SLURM_STEP_GPUS": str(local), "CUDA_VISIBLE_DEVICES": "0", **extra,
    }  # fmt: skip


@pytest.mark.parametrize(
    "tres",
    [{"SLURM_TRES_PER_TASK": "cpu=8,gres/gpu=1"}, {"SLURM_TRES_PER_TASK": "gres/gpu:1"},
     {"SLURM_TRES_PER_TASK": "gres:gpu:h200:1"}, {"SLURM_TRES_BIND": "gres/gpu:per_task:1"},
     {"SLURM_GPUS_PER_TASK": "1"}, {"SLURMD_TRES_BIND": "gpu:per_task:1"}, {}],
    ids=["23.11", "colon", "typed", "tres-bind", "gpus-per-task", "22.05", "no-binding-named"],
)  # fmt: skip
def test_a_task_slurm_bound_to_one_gpu_computes_on_it_whatever_nvml_counts(monkeypatch, tres):
    """Issue 36 item 2: NVML inside the restricted task answers 1 GPU (or 8, of which it may
    open 1); the node's count is Slurm's, so the binding is found, never refused."""
    for nvml_count in (1, 8):
        monkeypatch.setattr(cluster_workers, "node_gpu_count", lambda n=nvml_count: n)
        task = cluster_workers.slurm_cluster(_per_gpu_task(3, **tres))
        assert task.gpus == ("0",) and task.gpu_layout.startswith("bound to this task by Slurm")
        assert (task.host, task.local_index) == ("gpu2", 3)


def test_without_slurm_gpus_on_node_the_node_count_is_the_jobs_gpu_list(monkeypatch):
    """A Slurm that sets no SLURM_GPUS_ON_NODE: the node's GPUs are SLURM_JOB_GPUS's 8, not
    SLURM_STEP_GPUS's one (the task's own under --gpus-per-task=1), so the bound task is found
    as on a Slurm that sets it, not refused as 8 tasks sharing one GPU."""
    monkeypatch.setattr(cluster_workers, "node_gpu_count", lambda: 1)
    environ = _per_gpu_task(3, SLURMD_TRES_BIND="gpu:per_task:1")
    del environ["SLURM_GPUS_ON_NODE"]
    assert slurm.slurm_node_gpus(environ) == 8
    task = cluster_workers.slurm_cluster(environ)
    assert task.gpus == ("0",) and task.gpu_layout.startswith("bound to this task by Slurm")


def test_gpu_bind_none_means_the_project_slices_the_nodes_gpus(monkeypatch):
    """--gpus-per-node=8 --ntasks-per-node=8 --gpu-bind=none: every task sees all 8."""
    monkeypatch.setattr(cluster_workers, "node_gpu_count", lambda: 8)
    environ = _per_gpu_task(5, CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7")
    environ["SLURM_TRES_BIND"] = "gres/gpu:none"
    task = cluster_workers.slurm_cluster(environ)
    assert task.gpus == ("5",) and task.gpu_layout.startswith("slice 5 of the 8 GPUs")


class NoPermission(Exception):
    pass


def _fake_pynvml(count: int, readable: set[int]) -> types.ModuleType:
    """pynvml as a task that Slurm's cgroup keeps to GPUs `readable` sees it: `count` GPUs
    listed, NoPermission for the others."""
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = Exception
    nvml.NVMLError_NoPermission = NoPermission

    def handle(index):
        if index not in readable:
            raise NoPermission("Insufficient Permissions")
        return index

    nvml.nvmlInit = nvml.nvmlShutdown = lambda: None
    nvml.nvmlSystemGetDriverVersion = lambda: "570.00"
    nvml.nvmlDeviceGetCount = lambda: count
    nvml.nvmlDeviceGetHandleByIndex = handle
    nvml.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    nvml.nvmlDeviceGetUUID = lambda h: f"GPU-{h}aaa"
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=141 * 2**30)
    nvml.nvmlDeviceGetTotalEnergyConsumption = lambda h: 1000 * h
    return nvml


@pytest.mark.parametrize("count, readable", [(1, {0}), (8, {3})], ids=["one", "seven-denied"])
def test_gpus_nvml_will_not_open_are_skipped_and_named_never_a_traceback(
    monkeypatch, count, readable
):
    from hpcai500_tf.energy.sources import nvml_sources

    nvml = _fake_pynvml(count, readable)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # the task's own GPU, as CUDA numbers it
    monkeypatch.delenv(cluster_devices.WORKER_GPUS, raising=False)
    machine.nvidia_gpus.cache_clear()
    monkeypatch.setattr(machine, "amd_gpus", lambda: ([], "none"))
    try:
        layer = machine.hardware_layer()
    finally:
        machine.nvidia_gpus.cache_clear()
    (own,) = readable
    assert [(g["index"], g["visible"]) for g in layer["accelerators"]] == [(own, True)]
    assert layer["summary"] == "1 x NVIDIA H200"
    sources, note = nvml_sources(nvml)
    assert [(s.name, s.uuid) for s in sources] == [(f"gpu{own}", f"GPU-{own}aaa")]
    assert cluster_workers._nvml_gpu_count() == 1
    if count == 8:
        assert layer["accelerator_note"].startswith("gpu0, gpu1, gpu2, gpu4, gpu5, gpu6, gpu7 ")
        assert "Insufficient Permissions" in layer["accelerator_note"]
        assert note.startswith("gpu0, gpu1, gpu2, gpu4, gpu5, gpu6, gpu7 skipped")
    else:
        assert layer["accelerator_note"] is None and note is None


# ------------------------------------------------------------------ PyTorch, one task per node


def test_pytorch_with_one_task_per_node_and_eight_gpus_is_refused_before_any_join():
    """Issue 36 item 3: one task per node (the sbatch default) would train on GPU 0 alone."""
    environ = {
        **STEP, "SLURM_LOCALID": "0", "SLURMD_NODENAME": "node1", "SLURM_GPUS_ON_NODE": "8",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "SLURM_CPUS_PER_TASK": "64",
    }  # fmt: skip
    with pytest.raises(UserError) as refused:
        distributed.workers_from_environment(environ)
    message = _one_line(refused)
    assert message.startswith("this Slurm task has 8 GPUs (the only task on its node")
    assert "--ntasks-per-node=8" in message and "TASK_PER=gpu" in message
    per_gpu = distributed.workers_from_environment(
        {**_per_gpu_task(3, SLURM_TRES_PER_TASK="cpu=8,gres/gpu=1"), "SLURMD_NODENAME": "gpu2"}
    )
    assert (per_gpu.world_size, per_gpu.rank, per_gpu.local_rank) == (16, 11, 3)
    assert per_gpu.master_addr == "gpu1"


# ------------------------------------------------------------------ unequal GPUs per worker


def test_nodes_with_different_task_counts_sharing_gpus_are_refused_naming_the_nodes():
    """tasks per node 3,1 with 4 GPUs per node: 4/3 and 4 GPUs per worker."""
    environ = {
        **STEP, "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
        "SLURM_PROCID": "1", "SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_GPUS_ON_NODE": "4",
        "SLURM_CPUS_PER_TASK": "16",
    }  # fmt: skip
    for changed in ({}, {"SLURM_PROCID": "3", "SLURM_LOCALID": "0", "SLURM_GPUS_PER_NODE": "4"}):
        with pytest.raises(UserError) as refused:
            cluster_workers.slurm_cluster({**environ, **changed})
        message = _one_line(refused)
        assert "different numbers of tasks (node2: 1, node1: 3" in message
        assert "--gpus-per-node" in message
    bound = {**environ, "SLURM_TRES_PER_TASK": "gres/gpu=1", "CUDA_VISIBLE_DEVICES": "1"}
    assert cluster_workers.slurm_cluster(bound).gpus == ("1",)  # one GPU each, as Slurm bound them


def test_gpus_spread_unevenly_over_the_nodes_are_refused_naming_this_node():
    """--gpus=12 over 2 nodes, one task each: Slurm may give one node 8 and the other 4."""
    environ = {
        **STEP, "SLURM_LOCALID": "0", "SLURMD_NODENAME": "node1", "SLURM_GPUS": "12",
        "SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "8", "SLURM_CPUS_PER_TASK": "64",
    }  # fmt: skip
    with pytest.raises(UserError) as refused:
        cluster_workers.slurm_cluster(environ)
    assert _one_line(refused).startswith("node1 has 8 of the job's SLURM_GPUS=12 GPUs over 2")
    even = cluster_workers.slurm_cluster({**environ, "SLURM_GPUS_ON_NODE": "6"})
    assert len(even.gpus) == 6


# ------------------------------------------------------------------ hosts that do not resolve


def test_a_host_that_does_not_resolve_is_named_and_a_hanging_resolver_is_bounded(monkeypatch):
    with pytest.raises(UserError) as refused:
        slurm.check_hosts_resolve(["localhost", "n1.invalid", "n2.invalid"], "the step")
    assert _one_line(refused).startswith("host 'n1.invalid' of the step does not resolve")
    real = socket.getaddrinfo
    monkeypatch.setattr(
        socket, "getaddrinfo", lambda host, *a, **k: time.sleep(60) if host == "slow" else real
    )
    started = time.monotonic()
    with pytest.raises(UserError, match="'slow' of the step did not resolve within 0.5 s"):
        slurm.check_hosts_resolve(["localhost", "slow"], "the step", seconds=0.5)
    assert time.monotonic() - started < 5


# ------------------------------------------------------------------ the commands themselves


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def _command(args: list[str], environ: dict, tmp_path, cap: bool = False):
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "TF_CONFIG"))},
        "PYTHONPATH": str(ROOT), **environ,
    }  # fmt: skip
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "hpcai500_tf.cli", *args],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=30,
        preexec_fn=_cap_memory if cap else None,
    )  # fmt: skip
    return result, time.monotonic() - started


def _refused_in_one_line(result, named: str) -> None:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("hpcai500-tf: error: ") and named in line, line


TRAIN = ["train", "image_classification", "--preset", "tiny"]


@pytest.mark.parametrize("change, named", HOSTILE[:6], ids=IDS[:6])
def test_the_cluster_command_ends_in_one_line_under_a_memory_cap(tmp_path, change, named):
    result, _ = _command(["cluster"], {**STEP, **change}, tmp_path, cap=True)
    _refused_in_one_line(result, named)


@pytest.mark.parametrize("framework", ["tensorflow", "pytorch"])
def test_train_ends_in_one_line_before_its_framework_loads(tmp_path, framework):
    """A hostile expansion (under the memory cap) and a batch script's environment: refused
    before TensorFlow or torch loads, so within seconds."""
    args = [*TRAIN, "--framework", framework, "--out", str(tmp_path / "runs")]
    nodes = {**STEP, "SLURM_STEP_NODELIST": "node[1-1000000000]"}
    result, _ = _command(args, nodes, tmp_path, cap=True)
    _refused_in_one_line(result, "more than 1,000,000 hosts")
    result, seconds = _command(args, BATCH, tmp_path)
    _refused_in_one_line(result, "SLURM_NTASKS=2 but SLURM_STEP_NUM_TASKS is not set")
    assert seconds < 30 and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("framework", ["tensorflow", "pytorch"])
def test_workers_launched_by_each_task_of_a_step_are_refused(tmp_path, framework):
    """`srun -n2 ... train --workers 4` would have started two separate 4-worker runs, each
    recorded as the whole run: refused in one line before anything starts. One task with
    --workers (srun -n1, or a batch shell) still launches its workers."""
    args = [*TRAIN, "--framework", framework, "--workers", "4", "--out", str(tmp_path / "runs")]
    result, _ = _command(args, STEP, tmp_path)
    _refused_in_one_line(result, "this is one of 2 tasks of an srun step")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "environ", [{**STEP, "SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "1"}, BATCH]
)
def test_one_task_or_a_batch_shell_still_launches_workers(monkeypatch, environ):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert cluster_workers.strategy_overrides(True) == ["training.strategy=multi_worker"]


UNRESOLVABLE = {
    **STEP, "SLURM_STEP_NODELIST": "n[1-2].invalid", "SLURMD_NODENAME": "n1.invalid",
    "SLURM_LOCALID": "0", "SLURM_JOB_ID": "4321",
}  # fmt: skip


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_workers_whose_hosts_do_not_resolve_end_in_one_line_before_joining(tmp_path, framework):
    """Issue 42 kind 15 (PyTorch: 132 s and 53 lines of c10d warnings) and issue 36 item 8:
    the step's hosts are resolved before either framework loads."""
    args = [*TRAIN, "--framework", framework, "--out", str(tmp_path / "runs")]
    result, seconds = _command(args, UNRESOLVABLE, tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "socket.cpp" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert errors == [line for line in errors if line.startswith("hpcai500-tf: error: ")]
    assert "host 'n1.invalid'" in errors[-1] and "does not resolve" in errors[-1]
    assert seconds < 30


def test_a_pytorch_rank_0_that_does_not_resolve_is_one_line_before_c10d_tries(monkeypatch):
    """torchrun's MASTER_ADDR, resolved in init_process_group before torch.distributed's
    rendezvous (which retries a name that does not resolve past its timeout)."""
    joined = []
    dist = types.SimpleNamespace(is_available=lambda: True, init_process_group=joined.append)
    torch = types.SimpleNamespace(distributed=dist, __version__="2.x")
    workers = distributed.Workers(2, 1, 1, "rank0.invalid", 29500, "torchrun")
    with pytest.raises(UserError) as refused:
        distributed.init_process_group(torch, workers, types.SimpleNamespace(type="cpu"), 60)
    message = _one_line(refused)
    assert message.startswith("host 'rank0.invalid' of this torchrun run (rank 0's) does not")
    assert joined == []
