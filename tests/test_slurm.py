"""Slurm clusters read from Slurm's environment in Slurm's own order: host lists, tasks per
node, the block layout, ports, GPUs and CPUs per task, and `hpcai500-tf cluster`. Slurm is
faked by its variables; no TensorFlow except where the resolver is wired."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from hpcai500_tf.cluster import slurm
from hpcai500_tf.cluster import workers as cluster_workers
from hpcai500_tf.cluster.devices import WORKER_GPUS
from hpcai500_tf.engine import cluster as tf_cluster
from hpcai500_tf.errors import UserError

# ------------------------------------------------------------------ host lists


@pytest.mark.parametrize(
    "text, expected",
    [
        ("gpu[8-11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),  # not string-sorted
        ("n[9-10],m1", ["n9", "n10", "m1"]),
        ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),
        ("n[1,3,5-7]", ["n1", "n3", "n5", "n6", "n7"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("a[1-2]b", ["a1b", "a2b"]),
        ("node7", ["node7"]),
        ("c[098-101]", ["c098", "c099", "c100", "c101"]),
    ],
)
def test_a_host_list_expands_in_slurms_order(text, expected):
    assert slurm.expand_nodelist(text) == expected


@pytest.mark.parametrize(
    "text, why",
    [
        ("gpu[8-11", "'[' is not closed"),
        ("gpu8-11]", "']' without its '['"),
        ("gpu[1-[2]]", "'[' inside brackets"),
        ("n[10-9]", "the range 10-9 ends before it starts"),
        ("n1,,n2", "an empty item"),
        ("n[1,,2]", "is not numbers and ranges"),
        ("n[a-c]", "is not numbers and ranges"),
        ("n[]", "is not numbers and ranges"),
        ("n[1-2],n2", "names n2 twice"),
    ],
)
def test_a_malformed_host_list_is_one_line_naming_the_variable_and_the_text(text, why):
    with pytest.raises(UserError) as refused:
        slurm.expand_nodelist(text)
    message = str(refused.value)
    assert message.startswith(f"SLURM_STEP_NODELIST={text!r} is not a Slurm host list")
    assert why in message and "\n" not in message


# ------------------------------------------------------------------ tasks per node


@pytest.mark.parametrize(
    "text, nodes, expected",
    [("2(x3),1", 4, [2, 2, 2, 1]), ("1(x2)", 2, [1, 1]), ("4", 1, [4]), ("1,3", 2, [1, 3])],
)
def test_tasks_per_node_expand(text, nodes, expected):
    assert slurm.expand_tasks_per_node(text, nodes) == expected


@pytest.mark.parametrize(
    "text, nodes, why",
    [
        ("2(x3)", 4, "counts tasks on 3 node(s) but SLURM_STEP_NODELIST names 4"),
        ("0,1", 2, "counts of at least 1"),
        ("2(x0)", 1, "counts of at least 1"),
        ("2x3", 3, "counts of at least 1"),
        ("", 1, "counts of at least 1"),
    ],
)
def test_bad_tasks_per_node_is_one_line(text, nodes, why):
    with pytest.raises(UserError, match=r"^SLURM_STEP_TASKS_PER_NODE=") as refused:
        slurm.expand_tasks_per_node(text, nodes)
    assert why in str(refused.value)


# ------------------------------------------------------------------ the block layout


def _env(nodes="gpu[8-11]", per_node="1(x4)", tasks=4, procid=0, **extra) -> dict:
    """A Slurm task's environment (job 42, 8 CPUs), SLURMD_NODENAME and SLURM_LOCALID left out
    unless given."""
    return {
        "SLURM_JOB_ID": "42",
        "SLURM_PROCID": str(procid),
        "SLURM_STEP_NUM_TASKS": str(tasks),
        "SLURM_STEP_NODELIST": nodes,
        "SLURM_STEP_TASKS_PER_NODE": per_node,
        "SLURM_CPUS_PER_TASK": "8",
        **extra,
    }


def _task(environ, visible=(), node_gpus=0) -> slurm.SlurmCluster:
    return slurm.SlurmCluster.from_environment(environ, list(visible), node_gpus)


JOB_42_BASE = slurm.PORT_FIRST + 42 * slurm.PORT_STRIDE  # 42 % PORT_SLOTS == 42


@pytest.mark.parametrize("procid, host", [(0, "gpu8"), (1, "gpu9"), (2, "gpu10"), (3, "gpu11")])
def test_each_task_of_gpu8_to_11_is_on_its_own_node_in_node_list_order(procid, host):
    task = _task(_env(procid=procid, SLURMD_NODENAME=host, SLURM_LOCALID="0"))
    assert task.addresses == tuple(f"gpu{n}:{JOB_42_BASE}" for n in (8, 9, 10, 11))
    assert (task.index, task.host, task.local_index, task.tasks_on_node) == (procid, host, 0, 1)
    assert task.address == f"{host}:{JOB_42_BASE}"


@pytest.mark.parametrize(
    "procid, host, local", [(0, "node9", 0), (1, "node9", 1), (2, "node10", 0), (3, "node10", 1)]
)
def test_two_tasks_per_node_are_consecutive_tasks_on_consecutive_ports(procid, host, local):
    environ = _env("node[9-10]", "2(x2)", 4, procid, SLURMD_NODENAME=host, SLURM_LOCALID=local)
    task = _task({key: str(value) for key, value in environ.items()})
    base = JOB_42_BASE
    assert task.addresses == (
        f"node9:{base}",
        f"node9:{base + 1}",
        f"node10:{base}",
        f"node10:{base + 1}",
    )
    assert (task.host, task.local_index, task.tasks_on_node) == (host, local, 2)


def test_the_job_node_list_stands_in_for_the_steps_but_tasks_are_the_steps_own():
    """The tasks of the step come from SLURM_STEP_NUM_TASKS only (the job's SLURM_NTASKS may
    count more); the job's node list and tasks per node stand in for the step's."""
    environ = {
        "SLURM_JOB_ID": "42",
        "SLURM_PROCID": "2",
        "SLURM_NTASKS": "6",
        "SLURM_STEP_NUM_TASKS": "3",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_TASKS_PER_NODE": "2,1",
    }
    task = _task(environ)
    assert (task.host, task.local_index, task.tasks_on_node) == ("n2", 0, 1)


def test_a_task_slurm_placed_on_another_node_is_one_line_naming_both_hosts():
    environ = _env("node[9-10]", "1(x2)", 2, 0, SLURMD_NODENAME="node10")
    with pytest.raises(UserError) as refused:
        _task(environ)
    assert str(refused.value) == (
        "Slurm task 0 should be on node9 by SLURM_STEP_NODELIST=node[9-10] but "
        "SLURMD_NODENAME is node10: run srun with the default block distribution (srun -m block)"
    )


def test_a_local_id_other_than_the_block_layout_says_is_one_line_naming_both():
    environ = _env("node[9-10]", "2(x2)", 4, 1, SLURMD_NODENAME="node9", SLURM_LOCALID="0")
    with pytest.raises(UserError) as refused:
        _task(environ)
    message = str(refused.value)
    assert message.startswith(
        "Slurm task 1 should be local task 1 on node9 by SLURM_STEP_TASKS_PER_NODE=2(x2) "
        "but SLURM_LOCALID is 0"
    )
    assert message.endswith("(srun -m block)")


def test_a_cyclic_step_is_refused_up_front_with_the_block_advice():
    environ = _env("node[9-10]", "2(x2)", 4, 1, SLURM_DISTRIBUTION="cyclic")
    with pytest.raises(UserError, match=r"^SLURM_DISTRIBUTION=cyclic .*\(srun -m block\)$"):
        _task(environ)
    # One task per node: cyclic and block place the tasks alike, and Slurm says cyclic then.
    one_each = _task(_env("node[9-10]", "1(x2)", 2, 1, SLURM_DISTRIBUTION="cyclic"))
    assert one_each.host == "node10"


def test_a_mismatch_under_another_distribution_names_it():
    environ = _env("node[9-10]", "1(x2)", 2, 0, SLURMD_NODENAME="node10")
    environ["SLURM_DISTRIBUTION"] = "arbitrary"
    with pytest.raises(UserError, match=r"is node10 \(SLURM_DISTRIBUTION=arbitrary\): run srun"):
        _task(environ)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"SLURM_STEP_NUM_TASKS": "3"}, "places 4 tasks but SLURM_STEP_NUM_TASKS is 3"),
        ({"SLURM_PROCID": "4"}, "SLURM_PROCID=4 is out of range for SLURM_STEP_NUM_TASKS=4"),
        ({"SLURM_PROCID": None}, "SLURM_PROCID is not set: run each task with srun"),
        (
            {"SLURM_STEP_NODELIST": None},
            "SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST) is not set",
        ),
        ({"SLURM_JOB_ID": None}, "SLURM_JOB_ID is not set"),
        ({"SLURM_CPUS_PER_TASK": "many"}, "SLURM_CPUS_PER_TASK='many' is not a whole number"),
    ],
)
def test_an_inconsistent_environment_is_one_line_naming_the_variables(change, message):
    environ = _env()
    for key, value in change.items():
        if value is None:
            del environ[key]
        else:
            environ[key] = value
    with pytest.raises(UserError) as refused:
        _task(environ)
    assert message in str(refused.value) and "\n" not in str(refused.value)


# ------------------------------------------------------------------ ports


def test_ports_come_from_the_job_id_in_a_documented_range():
    task = _task(_env(SLURM_JOB_ID=str(slurm.PORT_SLOTS * 3 + 5)))
    assert task.address == f"gpu8:{slurm.PORT_FIRST + 5 * slurm.PORT_STRIDE}"
    highest = slurm.PORT_FIRST + (slurm.PORT_SLOTS - 1) * slurm.PORT_STRIDE + slurm.PORT_STRIDE
    assert highest <= 32768  # below Linux's ephemeral ports
    assert task.ports.source == "SLURM_JOB_ID"


def test_more_tasks_on_a_node_than_a_job_id_slot_holds_is_one_line():
    """Job 1000's 32 tasks per node would take job 1001's ports (a shared node): refused,
    naming the two ways to give them ports; 16 still fit, and a port base still serves 32."""
    environ = _env("node[9-10]", "32(x2)", 64, 0, SLURM_JOB_ID="1000")
    with pytest.raises(UserError, match=r"runs 32 tasks, more than the 16 .*--resv-ports=32"):
        _task(environ)
    assert _task({**environ, "HPCAI500_SLURM_PORT_BASE": "40000"}).address == "node9:40000"
    sixteen = _task(_env("node[9-10]", "16(x2)", 32, 0, SLURM_JOB_ID="1000"))
    assert sixteen.ports.source == "SLURM_JOB_ID"


def test_slurms_reserved_ports_are_taken_by_local_index():
    environ = _env("node[9-10]", "2(x2)", 4, 3, SLURM_STEP_RESV_PORTS="12000-12007")
    task = _task(environ)
    assert task.addresses == ("node9:12000", "node9:12001", "node10:12000", "node10:12001")
    listed = _task({**environ, "SLURM_STEP_RESV_PORTS": "12000,12002"})
    assert listed.address == "node10:12002" and listed.ports.source == "SLURM_STEP_RESV_PORTS"
    with pytest.raises(UserError, match="reserves 1 port.* --resv-ports=2"):
        _task({**environ, "SLURM_STEP_RESV_PORTS": "12000"})


def test_the_users_port_base_overrides_the_others():
    environ = _env("node[9-10]", "2(x2)", 4, 1, SLURM_STEP_RESV_PORTS="12000-12007")
    task = _task({**environ, "HPCAI500_SLURM_PORT_BASE": "9000"})
    assert task.address == "node9:9001" and task.ports.source == "HPCAI500_SLURM_PORT_BASE"
    with pytest.raises(UserError, match="outside 1024-65535"):
        _task({**environ, "HPCAI500_SLURM_PORT_BASE": "80"})


def test_a_taken_port_is_refused_in_one_line_naming_where_it_came_from():
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        task = _task(_env(HPCAI500_SLURM_PORT_BASE=str(port)))
        with pytest.raises(UserError) as refused:
            task.check_port()
    finally:
        holder.close()
    assert str(refused.value) == (
        f"port {port} of this worker (gpu8:{port}) is already in use "
        f"(HPCAI500_SLURM_PORT_BASE={port} + SLURM_LOCALID 0): set HPCAI500_SLURM_PORT_BASE "
        "to the first of a free range of ports (one per task on a node, 1 here)"
    )


# ------------------------------------------------------------------ GPUs and CPUs

EIGHT = [str(index) for index in range(8)]


def test_one_task_per_gpu_uses_the_gpu_slurm_bound_to_it():
    environ = _env("node1", "8", 8, 3, SLURM_LOCALID="3")
    task = _task(environ, visible=["3"], node_gpus=8)
    assert task.gpus == ("3",) and "bound" in task.gpu_layout


@pytest.mark.parametrize(
    "binding, tasks, visible",
    [("gres/gpu:single:2", 8, ["1"]),  # --ntasks-per-gpu=2 on a node Slurm gave 4 GPUs
     ("gres/gpu:closest", 4, ["0", "1"]),  # --gpu-bind=closest: a socket's 2 GPUs, 2 tasks each
     (None, 8, ["1"])],  # Slurm 22.05 names no binding: 8 tasks, each seeing 1 of the 4
)  # fmt: skip
def test_a_binding_that_puts_two_tasks_on_one_gpu_is_refused(binding, tasks, visible):
    extra = {"SLURM_TRES_BIND": binding} if binding else {}
    environ = _env("node1", str(tasks), tasks, 1, SLURM_LOCALID="1", **extra)
    with pytest.raises(UserError) as refused:
        _task(environ, visible=visible, node_gpus=4)
    assert str(refused.value) == (
        f"Slurm bound {len(visible)} GPU(s) to each of this node's {tasks} tasks but gave the "
        "node 4, so tasks share a GPU (--ntasks-per-gpu, --gpu-bind=single or closest): run "
        "one task per GPU (--gpus-per-task=1) or one task per node"
    )


def test_gpus_per_task_is_binding_even_where_the_counts_do_not_show_it():
    environ = _env("node1", "2", 2, 1, SLURM_GPUS_PER_TASK="h200:4")
    task = _task(environ, visible=["4", "5", "6", "7"], node_gpus=8)
    assert task.gpus == ("4", "5", "6", "7")


def test_one_task_per_node_uses_every_gpu():
    task = _task(_env(), visible=EIGHT, node_gpus=8)
    assert task.gpus == tuple(EIGHT)


@pytest.mark.parametrize("local, expected", [(0, ["0", "1", "2", "3"]), (1, ["4", "5", "6", "7"])])
def test_two_unbound_tasks_take_their_slice_of_the_nodes_gpus(local, expected):
    environ = _env("node1", "2", 2, local, SLURM_LOCALID=str(local), SLURM_CPUS_PER_TASK="16")
    task = _task(environ, visible=EIGHT, node_gpus=8)
    assert list(task.gpus) == expected


def test_more_unbound_tasks_than_gpus_is_one_line_naming_the_fix():
    with pytest.raises(UserError) as refused:
        _task(_env("node1", "9", 9, 0), visible=EIGHT, node_gpus=8)
    assert str(refused.value) == (
        "9 Slurm tasks on this node share its 8 visible GPUs, unbound, so some task gets none: "
        "run one task per node (srun --ntasks-per-node=1) or one per GPU (--gpus-per-task=1)"
    )
    with pytest.raises(UserError, match="3 Slurm tasks on this node do not divide its 8"):
        _task(_env("node1", "3", 3, 0), visible=EIGHT, node_gpus=8)


def test_a_cpu_node_has_no_gpu_share():
    task = _task(_env("node1", "4", 4, 2))
    assert task.gpus == () and task.warning is None


def test_one_cpu_for_a_gpu_task_is_refused_and_few_cpus_are_a_warning():
    environ = _env("node1", "8", 8, 0, SLURM_CPUS_PER_TASK="1")
    with pytest.raises(UserError) as refused:
        _task(environ, visible=["0"], node_gpus=8)
    assert str(refused.value).startswith("Slurm gave this task 1 CPU (SLURM_CPUS_PER_TASK)")
    assert str(refused.value).endswith("ask for --cpus-per-task=4")
    few = _task({**environ, "SLURM_CPUS_PER_TASK": "2"}, visible=["0"], node_gpus=8)
    assert few.warning.startswith("Slurm gave this task 2 CPUs (SLURM_CPUS_PER_TASK) for 1 GPU")
    assert _task({**environ, "SLURM_CPUS_PER_TASK": "4"}, ["0"], 8).warning is None
    assert _task({**environ, "SLURM_CPUS_PER_TASK": "1"}).warning is None  # a CPU task


def test_cpus_default_to_the_process_affinity():
    environ = _env()
    del environ["SLURM_CPUS_PER_TASK"]
    task = _task(environ)
    assert task.cpus == len(os.sched_getaffinity(0)) and "affinity" in task.cpus_from


# ------------------------------------------------------------------ no TensorFlow


def test_the_slurm_module_and_the_cluster_plan_import_without_tensorflow():
    script = (
        "import sys; sys.modules['tensorflow'] = None\n"
        "from hpcai500_tf.cluster import slurm\n"
        "from hpcai500_tf.cluster import workers as cluster_workers\n"
        "cluster_workers.cluster_plan({}, node_gpus=0)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# ------------------------------------------------------------------ hpcai500-tf cluster

NODE9_TASK0 = {
    "SLURMD_NODENAME": "node9",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_STEP_NODELIST": "node[9-10]",
    "SLURM_JOB_ID": "4242",
    "SLURM_CPUS_PER_TASK": "32",
}


def _cluster_command(tmp_path, environ, *flags):
    env = {"PATH": os.environ["PATH"], **environ}
    return subprocess.run(
        [sys.executable, "-m", "hpcai500_tf.cli", "cluster", *flags],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )


def test_the_cluster_command_names_node9_as_task_0s_host(tmp_path):
    result = _cluster_command(tmp_path, NODE9_TASK0, "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    port = slurm.PORT_FIRST + (4242 % slurm.PORT_SLOTS) * slurm.PORT_STRIDE
    assert plan["found"] == "Slurm"
    assert plan["host"] == "node9" and plan["index"] == 0
    assert plan["workers"] == [f"node9:{port}", f"node10:{port}"]
    assert plan["ports"]["source"] == "SLURM_JOB_ID"
    assert plan["collective"] == ("nccl" if plan["gpus"] else "ring")
    table = _cluster_command(tmp_path, NODE9_TASK0)
    assert table.returncode == 0, table.stderr
    assert f"node9:{port}" in table.stdout and "node10" in table.stdout


def test_the_cluster_command_refuses_a_bad_environment_in_one_line(tmp_path):
    result = _cluster_command(tmp_path, {**NODE9_TASK0, "SLURMD_NODENAME": "other"}, "--json")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "hpcai500-tf: error: Slurm task 0 should be on node9 by SLURM_STEP_NODELIST=node[9-10] "
        "but SLURMD_NODENAME is other: run srun with the default block distribution "
        "(srun -m block)"
    ]


def test_the_cluster_plan_of_tf_config_and_of_a_single_worker():
    tf_config = json.dumps(
        {
            "cluster": {"chief": ["a:1000"], "worker": ["b:1001", "c:1002"]},
            "task": {"type": "worker", "index": 1},
        }
    )
    plan = cluster_workers.cluster_plan({"TF_CONFIG": tf_config, **NODE9_TASK0}, node_gpus=0)
    assert plan["found"] == "TF_CONFIG"  # TF_CONFIG first, as cluster_resolver takes it
    assert plan["workers"] == ["a:1000", "b:1001", "c:1002"]
    assert (plan["index"], plan["host"], plan["collective"]) == (2, "c", "ring")
    single = cluster_workers.cluster_plan({}, node_gpus=2)
    assert single["found"] == cluster_workers.SINGLE_WORKER and single["workers"] == []
    assert single["gpus"] == ["0", "1"] and single["collective"] == "nccl"
    assert single["port_free"] is None


# ------------------------------------------------------------------ the resolver


def test_the_resolver_lists_the_workers_in_slurms_order_with_this_tasks_gpus(monkeypatch):
    pytest.importorskip("tensorflow")
    _forget_share_afterwards(monkeypatch)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setattr(cluster_workers, "node_gpu_count", lambda: 8)
    environ = _env(procid=2, SLURMD_NODENAME="gpu10", SLURM_LOCALID="0")
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("", 0))
    port = str(holder.getsockname()[1])  # free again once closed
    holder.close()
    environ |= {"CUDA_VISIBLE_DEVICES": ",".join(EIGHT), "HPCAI500_SLURM_PORT_BASE": port}
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    resolver, found = tf_cluster.cluster_resolver()
    assert found == "Slurm" and resolver.task_type == "worker" and resolver.task_id == 2
    assert resolver.cluster_spec().as_dict() == {
        "worker": [f"gpu{n}:{port}" for n in (8, 9, 10, 11)]
    }
    assert resolver.num_accelerators() == {"GPU": 8}
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert WORKER_GPUS not in os.environ  # alone on its node: every GPU it sees is its own
    # 8 CPUs for 8 GPUs: a warning the run records, not a refusal
    (warning,) = resolver.hpcai500_warnings
    assert warning.startswith("Slurm gave this task 8 CPUs (SLURM_CPUS_PER_TASK) for 8 GPU(s)")


def _forget_share_afterwards(monkeypatch):
    """Unset HPCAI500_WORKER_GPUS now and again after the test (the resolver sets it in
    os.environ, which monkeypatch restores only for variables it touched)."""
    monkeypatch.setenv(WORKER_GPUS, "")
    monkeypatch.delenv(WORKER_GPUS)


def test_the_resolver_gives_a_task_sharing_its_node_its_slice_as_positions(monkeypatch):
    """Two unbound tasks on a node of 8 GPUs, Slurm granting 4-7 to both: task 1 computes on
    6 and 7, given as positions 2,3 in CUDA's list, which stays whole (NCCL then sees the
    other task's GPUs, as with `--workers N`); two replicas, one per GPU of its own."""
    pytest.importorskip("tensorflow")
    _forget_share_afterwards(monkeypatch)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setattr(cluster_workers, "node_gpu_count", lambda: 8)
    environ = _env("node1", "2", 2, 1, SLURMD_NODENAME="node1", SLURM_LOCALID="1")
    environ |= {"CUDA_VISIBLE_DEVICES": "4,5,6,7", "SLURM_CPUS_PER_TASK": "16"}
    environ["HPCAI500_SLURM_PORT_BASE"] = str(slurm.PORT_FIRST)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(slurm, "port_free", lambda port: True)
    resolver, found = tf_cluster.cluster_resolver()
    assert found == "Slurm" and resolver.task_id == 1
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert os.environ[WORKER_GPUS] == "2,3"
    assert resolver.num_accelerators() == {"GPU": 2}
    again, _ = tf_cluster.cluster_resolver()  # the share it set is its own: not refused
    assert os.environ[WORKER_GPUS] == "2,3" and again.num_accelerators() == {"GPU": 2}


def _placed(environ, visible, node_gpus, local, tasks):
    environ = {**_env("node1", str(tasks), tasks, local, SLURM_LOCALID=str(local)), **environ}
    environ["SLURM_CPUS_PER_TASK"] = "32"
    task = _task(environ, visible, node_gpus)
    return task, cluster_workers.slurm_gpu_variables(environ, task, list(visible))


@pytest.mark.parametrize(
    "visible, node_gpus, local, tasks, expected",
    [
        (EIGHT, 8, 0, 1, {}),  # alone on its node: every GPU it sees
        (["3"], 8, 3, 8, {}),  # bound by Slurm (--gpus-per-task=1, --gpu-bind): left as it is
        (["4", "5"], 8, 1, 2, {}),  # bound: two GPUs each
        (EIGHT, 8, 1, 2, {WORKER_GPUS: "4,5,6,7"}),  # unbound, CUDA_VISIBLE_DEVICES unset
        (["4", "5", "6", "7"], 8, 1, 2, {WORKER_GPUS: "2,3"}),  # positions in Slurm's grant
        (EIGHT, 8, 3, 4, {WORKER_GPUS: "6,7"}),
        (["GPU-a", "GPU-b", "GPU-c", "GPU-d"], 4, 0, 2, {WORKER_GPUS: "0,1"}),
        ([], 0, 1, 2, {}),  # CPU nodes
    ],
)
def test_a_slurm_task_is_kept_to_its_gpus_by_the_fewest_variables(
    visible, node_gpus, local, tasks, expected
):
    _, variables = _placed({}, visible, node_gpus, local, tasks)
    assert variables == expected


def test_a_slurm_task_can_be_given_its_slice_as_cuda_visible_devices():
    """HPCAI500_GPU_PLACEMENT=cuda_visible_devices (as for `--workers N`), and MIG instances,
    which have no peer-to-peer path to keep: the slice is the task's CUDA_VISIBLE_DEVICES."""
    placement = {"HPCAI500_GPU_PLACEMENT": "cuda_visible_devices"}
    task, variables = _placed(placement, EIGHT, 8, 1, 2)
    assert variables == {"CUDA_VISIBLE_DEVICES": "4,5,6,7"} and task.gpus == tuple(EIGHT[4:])
    mig = [f"MIG-{index}" for index in range(4)]
    _, variables = _placed({}, mig, 4, 1, 2)
    assert variables == {"CUDA_VISIBLE_DEVICES": "MIG-2,MIG-3"}
    with pytest.raises(UserError, match=r"^HPCAI500_GPU_PLACEMENT='mps': use set_visible_dev"):
        _placed({"HPCAI500_GPU_PLACEMENT": "mps"}, EIGHT, 8, 0, 1)


@pytest.mark.parametrize("visible, local, tasks", [(EIGHT, 0, 1), (["3"], 3, 8), (EIGHT, 1, 2)])
def test_a_share_set_by_hand_under_srun_is_refused_in_one_line(visible, local, tasks):
    with pytest.raises(UserError) as refused:
        _placed({WORKER_GPUS: "0"}, visible, 8, local, tasks)
    assert str(refused.value) == (
        "HPCAI500_WORKER_GPUS='0' is set under srun, where Slurm hands out the GPUs: unset it "
        "(it is `--workers N`'s share of a node's GPUs for one worker)"
    )


# ------------------------------------------------------------------ Slurm's own words for GPUs


@pytest.mark.parametrize(
    "text, count",
    [("cpu=8,gres/gpu=1", 1), ("gres/gpu:2", 2), ("gres:gpu:4", 4), ("gres/gpu:h200:8", 8),
     ("cpu=8,gres/gpu:h200=2,mem=1G", 2), ("cpu=8", None), ("gres/gpuX:1", None), ("", None)],
)  # fmt: skip
def test_the_gpu_count_of_a_tres_list_in_each_versions_form(text, count):
    assert slurm.tres_gpus(text) == count


@pytest.mark.parametrize(
    "variable, bind, visible, bound",
    [("SLURM_TRES_BIND", "gres/gpu:closest", ["0"], True),
     ("SLURM_TRES_BIND", "gpu:map_gpu:0,1", ["1"], True),
     ("SLURM_TRES_BIND", "gres/gpu:none", ["0"], False),
     ("SLURM_TRES_BIND", "gres:gpu:verbose,none", ["0"], False),
     ("SLURMD_TRES_BIND", "gpu:per_task:1", ["0"], True),
     ("SLURMD_TRES_BIND", "gpu:none", ["0"], False),
     (None, "", ["0"], True)],
)  # fmt: skip
def test_a_binding_slurm_names_decides_and_none_means_unbound(variable, bind, visible, bound):
    """Eight tasks on a node Slurm gave 8 GPUs: SLURM_TRES_BIND decides, else Slurm 22.05's
    SLURMD_TRES_BIND (as tests/test_real_slurm.py captures it); without either, a task seeing
    fewer GPUs than Slurm gave its node is bound."""
    environ = {variable: bind} if variable else {}
    assert slurm._bound_by_slurm(environ, visible, 8, 8) is bound


def test_a_port_a_previous_step_left_in_time_wait_is_free_and_a_listened_one_is_not():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    assert not slurm.port_free(port)  # a worker of a step still running listens there
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    server.close()
    accepted.close()  # the server side closes first: its connection stays in TIME_WAIT
    client.close()
    time.sleep(0.1)
    assert slurm.port_free(port)
