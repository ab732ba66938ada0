"""GPU clusters without GPUs: how the launcher shares a node's GPUs among its workers, which
collective a multi-worker run uses, and the Slurm script's pre-flight. Device lists and Slurm
are faked; no TensorFlow worker is started."""

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcai500_tf import config
from hpcai500_tf.cluster import local_workers, slurm
from hpcai500_tf.cluster import workers as cluster_workers
from hpcai500_tf.cluster.devices import GPU_PLACEMENT, WORKER_GPUS
from hpcai500_tf.engine import cluster as tf_cluster
from hpcai500_tf.errors import UserError
from hpcai500_tf.run import launch

EIGHT_GPUS = [str(index) for index in range(8)]
SBATCH = Path(__file__).resolve().parents[1] / "tools" / "slurm_train.sbatch"


# ------------------------------------------------------------------ the --workers launcher


def test_eight_gpus_among_four_workers_two_each_every_worker_seeing_all():
    """Every worker sees every GPU (NCCL's peer-to-peer path between local workers needs the
    peer's GPU visible on some versions) and gets its share as positions to compute on."""
    environments = local_workers.worker_environments(4, EIGHT_GPUS, {"PATH": "/bin"}, cpus=16)
    assert [env[WORKER_GPUS] for env in environments] == [f"{2 * i},{2 * i + 1}" for i in range(4)]
    for env in environments:
        assert "CUDA_VISIBLE_DEVICES" not in env  # left unset: every GPU of the node
        assert env["PATH"] == "/bin" and env["TF_NUM_INTRAOP_THREADS"] == "4"
    assert launch.gpu_shares(environments, EIGHT_GPUS) == (
        2,
        "GPUs 0,1 | 2,3 | 4,5 | 6,7 by tf.config.set_visible_devices, each worker seeing every GPU",
    )


def test_an_existing_cuda_visible_devices_list_is_kept_whole_and_its_positions_split():
    base = {"CUDA_VISIBLE_DEVICES": "3,5"}
    gpus = cluster_workers.visible_gpus(base, count=8)
    assert gpus == ["3", "5"]
    environments = local_workers.worker_environments(2, gpus, base, cpus=2)
    assert [env["CUDA_VISIBLE_DEVICES"] for env in environments] == ["3,5", "3,5"]
    assert [env[WORKER_GPUS] for env in environments] == ["0", "1"]
    assert launch.gpu_shares(environments, gpus)[1] == (
        "GPUs 3 | 5 by tf.config.set_visible_devices, each worker seeing CUDA_VISIBLE_DEVICES=3,5"
    )


def test_cuda_visible_devices_placement_gives_each_worker_only_its_share():
    base = {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b,GPU-c,GPU-d"}
    base[GPU_PLACEMENT] = "cuda_visible_devices"
    gpus = cluster_workers.visible_gpus(base, count=4)
    environments = local_workers.worker_environments(2, gpus, base, cpus=2)
    assert [env["CUDA_VISIBLE_DEVICES"] for env in environments] == ["GPU-a,GPU-b", "GPU-c,GPU-d"]
    assert not any(WORKER_GPUS in env for env in environments)
    assert launch.gpu_shares(environments, gpus) == (
        2,
        "CUDA_VISIBLE_DEVICES GPU-a,GPU-b | GPU-c,GPU-d",
    )


def test_mig_instances_are_given_as_cuda_visible_devices():
    """MIG instances have no CUDA IPC: there is no peer-to-peer path to keep."""
    base = {"CUDA_VISIBLE_DEVICES": "MIG-a,MIG-b"}
    environments = local_workers.worker_environments(
        2, cluster_workers.visible_gpus(base, count=1), base, cpus=2
    )
    assert [env["CUDA_VISIBLE_DEVICES"] for env in environments] == ["MIG-a", "MIG-b"]
    assert not any(WORKER_GPUS in env for env in environments)


def test_an_unknown_gpu_placement_is_one_line_naming_both():
    with pytest.raises(UserError) as refused:
        local_workers.worker_environments(2, EIGHT_GPUS, {GPU_PLACEMENT: "mps"})
    assert str(refused.value).startswith("HPCAI500_GPU_PLACEMENT='mps': use set_visible_devices")
    assert "cuda_visible_devices" in str(refused.value)


def test_a_share_already_in_the_environment_is_split_not_replaced():
    base = {WORKER_GPUS: "4,5,6,7"}
    environments = local_workers.worker_environments(2, EIGHT_GPUS, base, cpus=2)
    assert [env[WORKER_GPUS] for env in environments] == ["4,5", "6,7"]
    with pytest.raises(UserError, match="does not divide the 4 GPUs of HPCAI500_WORKER_GPUS"):
        local_workers.worker_environments(3, EIGHT_GPUS, base)
    with pytest.raises(UserError, match=r"HPCAI500_WORKER_GPUS='7,8' names a GPU beyond the 8"):
        local_workers.worker_environments(2, EIGHT_GPUS, {WORKER_GPUS: "7,8"})


def test_without_gpus_only_threads_are_split_as_before():
    base = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    environments = local_workers.worker_environments(2, [], base, cpus=8)
    for env in environments:
        assert env["CUDA_VISIBLE_DEVICES"] == ""  # left as it was
        assert env["TF_NUM_INTRAOP_THREADS"] == "4" and env["OMP_NUM_THREADS"] == "1"


def test_a_worker_count_that_does_not_divide_the_gpus_is_one_line_naming_the_fix():
    with pytest.raises(UserError) as refused:
        local_workers.worker_environments(3, EIGHT_GPUS, {})
    message = str(refused.value)
    assert message == (
        "--workers 3 does not divide this node's 8 GPUs: use --workers 2, 4 or 8, "
        "or leave it out for one worker"
    )
    with pytest.raises(UserError, match="the 1 GPU of CUDA_VISIBLE_DEVICES: leave out"):
        local_workers.worker_environments(2, ["6"], {"CUDA_VISIBLE_DEVICES": "6"})


@pytest.mark.parametrize(
    "listed, count, expected",
    [
        (None, 4, ["0", "1", "2", "3"]),
        ("2,3", 4, ["2", "3"]),
        ("0,-1,2", 4, ["0"]),  # CUDA ignores the list from the first invalid entry on
        ("", 4, []),
        ("GPU-1a2b,GPU-3c4d", 4, ["GPU-1a2b", "GPU-3c4d"]),
        ("0,1", 0, []),  # no GPU on the node: the variable alone does not make one
    ],
)
def test_visible_gpus(listed, count, expected):
    environ = {} if listed is None else {"CUDA_VISIBLE_DEVICES": listed}
    assert cluster_workers.visible_gpus(environ, count=count) == expected


def test_the_gpu_count_falls_back_to_nvidia_smi(tmp_path, monkeypatch):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    smi = fake_bin / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-a)'\necho 'GPU 1: NVIDIA H200'\n"
    )
    smi.chmod(0o755)
    monkeypatch.setattr(cluster_workers, "_nvml_gpu_count", lambda: None)
    monkeypatch.setenv("PATH", str(fake_bin))
    assert cluster_workers.node_gpu_count() == 2
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi either: a CPU node
    assert cluster_workers.node_gpu_count() == 0


def _launch_refused(monkeypatch, tmp_path, workers, gpus, overrides=()):
    """launch() on a faked node: the UserError it raised, having started nothing."""
    started = []
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setattr(cluster_workers, "visible_gpus", lambda: gpus)
    monkeypatch.setattr(launch.subprocess, "Popen", lambda *a, **k: started.append(a))
    setup = config.prepare("image_classification", "tiny", list(overrides))
    with pytest.raises(UserError) as refused:
        launch.launch(setup, [], workers, tmp_path / "runs")
    assert started == [] and not (tmp_path / "runs").exists()
    return str(refused.value)


def test_launch_refuses_an_uneven_gpu_split_before_any_worker_starts(monkeypatch, tmp_path):
    message = _launch_refused(monkeypatch, tmp_path, 3, EIGHT_GPUS)
    assert message.startswith("--workers 3 does not divide this node's 8 GPUs")


def test_launch_refuses_nccl_without_gpus_before_any_worker_starts(monkeypatch, tmp_path):
    message = _launch_refused(monkeypatch, tmp_path, 2, [], ["communication.collective=nccl"])
    assert message.endswith("use auto or ring on CPU")


def test_launch_starts_each_worker_with_every_gpu_and_its_share_and_says_so(
    monkeypatch, tmp_path, capsys
):
    started = []

    def start(command, env, stdout, stderr, **options):  # pass_fds, process_group
        started.append(env)
        return SimpleNamespace(poll=lambda: 0)

    for name in ("TF_CONFIG", "CUDA_VISIBLE_DEVICES", WORKER_GPUS, GPU_PLACEMENT):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cluster_workers, "visible_gpus", lambda: EIGHT_GPUS[:4])
    monkeypatch.setattr(launch.subprocess, "Popen", start)
    setup = config.prepare("image_classification", "tiny", [])
    assert launch.launch(setup, [], 2, tmp_path / "runs") == 0
    assert [(env.get("CUDA_VISIBLE_DEVICES"), env[WORKER_GPUS]) for env in started] == [
        (None, "0,1"),
        (None, "2,3"),
    ]
    line = capsys.readouterr().out
    shares = "GPUs 0,1 | 2,3 by tf.config.set_visible_devices, each worker seeing every GPU"
    assert "(2 GPU(s) and " in line and f"; {shares})" in line


# ------------------------------------------------------------ a worker's share, in TensorFlow


class FakeTFConfig:
    """tf.config's device calls on a node of `count` GPUs, recording set_visible_devices."""

    def __init__(self, count: int, started: bool = False):
        self.gpus = [SimpleNamespace(name=f"/physical_device:GPU:{i}") for i in range(count)]
        self.visible = list(self.gpus)
        self.started, self.calls = started, []

    def list_physical_devices(self, kind=None):
        return list(self.gpus) if kind == "GPU" else []

    def get_visible_devices(self, kind=None):
        return list(self.visible)

    def set_visible_devices(self, devices, kind=None):
        self.calls.append(([device.name for device in devices], kind))
        if self.started and devices != self.visible:
            raise RuntimeError("Visible devices cannot be modified after being initialized")
        self.visible = list(devices)


@pytest.fixture
def fake_tf_config(monkeypatch):
    import tensorflow as tf

    def install(count: int, started: bool = False) -> FakeTFConfig:
        fake = FakeTFConfig(count, started)
        for name in ("list_physical_devices", "get_visible_devices", "set_visible_devices"):
            monkeypatch.setattr(tf.config, name, getattr(fake, name))
        return fake

    return install


def test_a_workers_share_is_given_to_tensorflow_with_set_visible_devices(fake_tf_config):
    from hpcai500_tf.engine import strategy

    fake = fake_tf_config(8)
    assignment = strategy.restrict_to_worker_gpus({WORKER_GPUS: "2,3"})
    assert fake.calls == [(["/physical_device:GPU:2", "/physical_device:GPU:3"], "GPU")]
    assert assignment == (
        "tf.config.set_visible_devices: GPUs 2,3 of the 8 CUDA makes visible to every worker "
        "(HPCAI500_WORKER_GPUS)"
    )
    fake = fake_tf_config(2)
    assert strategy.restrict_to_worker_gpus({}) == (
        "CUDA_VISIBLE_DEVICES: the 2 GPUs CUDA makes visible to this process"
    )
    assert fake.calls == []  # no share: every GPU TensorFlow sees
    fake = fake_tf_config(0)  # TensorFlow sees none: check_devices says why, not this
    assert strategy.restrict_to_worker_gpus({WORKER_GPUS: "0"}) is None and fake.calls == []


def test_the_default_strategy_computes_on_one_gpu_and_counts_only_it(fake_tf_config, monkeypatch):
    """One TensorFlow process with 8 GPUs visible and the default strategy trains on the
    first: it becomes the share, so TensorFlow holds no other GPU and L1 and the energy count
    one GPU, not 8 (the ranking's accelerators)."""
    from hpcai500_tf.engine import strategy

    for share, count, after in [(None, 8, "0"), ("2,3", 8, "2"), ("5", 8, "5"),
                                (None, 1, None), ("9,9", 4, "9,9")]:  # fmt: skip
        environ = {} if share is None else {WORKER_GPUS: share}
        strategy.first_gpu_only(environ, count)
        assert environ.get(WORKER_GPUS) == after, (share, count)
    monkeypatch.setenv(WORKER_GPUS, "0")  # recorded, so that teardown removes what the
    monkeypatch.delenv(WORKER_GPUS)  # strategy sets
    fake = fake_tf_config(8)
    strategy.make_strategy("default")
    assert fake.calls == [(["/physical_device:GPU:0"], "GPU")]
    assert os.environ[WORKER_GPUS] == "0"


@pytest.mark.parametrize(
    "share, started, message",
    [
        ("6,7", False, "HPCAI500_WORKER_GPUS='6,7' names a GPU beyond the 4 CUDA makes "
         "visible here (positions from 0) (TensorFlow sees 4)"),
        ("1,1", False, "HPCAI500_WORKER_GPUS='1,1' names a GPU twice (TensorFlow sees 4)"),
        ("GPU-a", False, "HPCAI500_WORKER_GPUS='GPU-a' is not a list of GPU positions "
         "such as 2,3 (TensorFlow sees 4)"),
        ("2,3", True, "HPCAI500_WORKER_GPUS='2,3': TensorFlow's GPU runtime had already "
         "started, so this worker cannot be restricted to its GPUs "
         "(tf.config.set_visible_devices must run before any op)"),
    ],
)  # fmt: skip
def test_a_share_that_cannot_be_applied_is_one_line(fake_tf_config, share, started, message):
    # a share set by hand under srun is refused by the resolver (tests/test_slurm.py)
    from hpcai500_tf.engine import strategy

    fake_tf_config(4, started)
    with pytest.raises(UserError) as refused:
        strategy.restrict_to_worker_gpus({WORKER_GPUS: share})
    assert str(refused.value) == message


def test_the_share_is_applied_before_the_strategy_is_built_and_recorded_in_l3(
    monkeypatch, fake_tf_config
):
    import tensorflow as tf

    from hpcai500_tf.config import CommunicationConfig
    from hpcai500_tf.engine import strategy

    fake = fake_tf_config(8)
    monkeypatch.setenv(WORKER_GPUS, "4,5")
    monkeypatch.setattr(
        tf_cluster, "cluster_resolver", lambda: (None, cluster_workers.SINGLE_WORKER)
    )
    seen = []

    def build(**options):
        seen.append([device.name for device in fake.visible])
        return SimpleNamespace(options=options)

    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", build)
    built = strategy.make_strategy("multi_worker", CommunicationConfig("auto", 0.0, 0.0))
    assert seen == [["/physical_device:GPU:4", "/physical_device:GPU:5"]]
    assert built.hpcai500_collective == "nccl"  # TensorFlow computes on GPUs
    facts, _, _ = strategy.describe(built, "default")
    assert facts["gpu_assignment"].startswith("tf.config.set_visible_devices: GPUs 4,5 of the 8")


# ------------------------------------------------------------------- the collective (L3)


@pytest.mark.parametrize(
    "requested, gpus, expected",
    [("auto", EIGHT_GPUS, "nccl"), ("auto", [], "ring"), ("ring", EIGHT_GPUS, "ring")]
    + [("nccl", EIGHT_GPUS, "nccl"), ("ring", [], "ring")],
)
def test_auto_is_nccl_between_gpu_workers_and_ring_between_cpu_workers(requested, gpus, expected):
    assert cluster_workers.resolve_collective(requested, gpus) == expected


def test_nccl_without_a_gpu_is_one_line_naming_the_fix():
    with pytest.raises(UserError) as refused:
        cluster_workers.resolve_collective("nccl", [])
    assert str(refused.value) == (
        "communication.collective=nccl needs GPUs and none is visible here: use auto or ring on CPU"
    )


def test_make_strategy_refuses_nccl_before_building_the_strategy(monkeypatch):
    import tensorflow as tf

    from hpcai500_tf.config import CommunicationConfig
    from hpcai500_tf.engine import strategy

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("TensorFlow sees a GPU here")
    for name in ("TF_CONFIG", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    built = []
    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", lambda **k: built.append(k))
    with pytest.raises(UserError, match="collective=nccl needs GPUs"):
        strategy.make_strategy("multi_worker", CommunicationConfig("nccl", 0.0, 0.0))
    assert built == []


def test_l3_records_the_resolved_implementation_and_the_request():
    import tensorflow as tf

    from hpcai500_tf.engine import strategy

    spec = tf.train.ClusterSpec({"worker": ["127.0.0.1:1", "127.0.0.1:2"]})
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec, task_type="worker", task_id=1
    )
    fake = SimpleNamespace(
        cluster_resolver=resolver,
        hpcai500_collective="nccl",
        hpcai500_collective_requested="auto",
        hpcai500_cluster_source="Slurm",
    )
    facts, workers, index = strategy.describe(fake, "multi_worker")
    assert (workers, index) == (2, 1)
    assert facts["collective_implementation"].endswith("(CommunicationImplementation.NCCL)")
    assert facts["collective_requested"] == "auto" and facts["cluster_from"] == "Slurm"


# ------------------------------------------------------------------ Slurm tasks on GPU nodes


def _slurm_task_on_gpu_node(monkeypatch, node_gpus: int, environment: dict[str, str]) -> None:
    """This process as one Slurm task (no TF_CONFIG) on a node of `node_gpus` GPUs, with
    `environment` as Slurm set it; the share the resolver sets is unset after the test."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv(WORKER_GPUS, "")  # so that monkeypatch restores it
    monkeypatch.delenv(WORKER_GPUS)
    monkeypatch.setattr(cluster_workers, "node_gpu_count", lambda: node_gpus)
    for key, value in {"SLURM_JOB_ID": "42", **environment}.items():
        monkeypatch.setenv(key, value)


@pytest.mark.parametrize(
    "nodes, tasks_per_node, host, local_id, share, count",
    [("node[1-2]", "1(x2)", "node2", "0", None, 4), ("node1", "2", "node1", "1", "2,3", 2)],
)
def test_a_slurm_task_gets_its_share_of_the_gpus_slurm_granted(
    monkeypatch, nodes, tasks_per_node, host, local_id, share, count
):
    """Alone on its node, every GPU granted; beside another task on it, its slice (GPUs 6 and
    7) as positions in the grant, which stays whole as with `--workers N`."""
    environment = {
        "CUDA_VISIBLE_DEVICES": "4,5,6,7",  # granted by Slurm, numbered as on the node
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": local_id,
        "SLURMD_NODENAME": host,
        "SLURM_NTASKS": "2",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": nodes,
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        "SLURM_CPUS_PER_TASK": "16",
    }
    _slurm_task_on_gpu_node(monkeypatch, 8, environment)
    resolver, found = tf_cluster.cluster_resolver()
    assert found == "Slurm" and resolver.task_id == 1
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert os.environ.get(WORKER_GPUS) == share
    assert resolver.num_accelerators()["GPU"] == count


@pytest.mark.parametrize("gpu_binding", [{"SLURM_GPUS_PER_TASK": "1"}, {}])
def test_a_slurm_task_bound_to_one_gpu_uses_it(monkeypatch, gpu_binding):
    """srun --gpus-per-task=1 (or --gpu-bind): each task sees its one GPU, which
    TensorFlow's Slurm resolver counted as 0 GPUs per task and failed on."""
    monkeypatch.delenv("SLURM_GPUS_PER_TASK", raising=False)
    environment = {
        "CUDA_VISIBLE_DEVICES": "5",
        "SLURM_PROCID": "13",
        "SLURM_LOCALID": "5",
        "SLURMD_NODENAME": "gpu9",
        "SLURM_STEP_NUM_TASKS": "16",
        "SLURM_STEP_NODELIST": "gpu[8-9]",
        "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
        "SLURM_CPUS_PER_TASK": "8",
        **gpu_binding,
    }
    _slurm_task_on_gpu_node(monkeypatch, 8, environment)
    resolver, found = tf_cluster.cluster_resolver()
    assert found == "Slurm" and resolver.task_id == 13
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5" and WORKER_GPUS not in os.environ
    assert resolver.num_accelerators() == {"GPU": 1}
    workers = resolver.cluster_spec().as_dict()["worker"]
    assert workers[13] == f"gpu9:{20000 + 42 * 16 + 5}" and workers[7].startswith("gpu8:")


def test_more_slurm_tasks_than_gpus_on_a_node_is_refused_naming_the_fix(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    environment = {
        "SLURM_PROCID": "0",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_NODELIST": "node1",
        "SLURM_STEP_TASKS_PER_NODE": "4",
        "SLURM_CPUS_PER_TASK": "8",
    }
    _slurm_task_on_gpu_node(monkeypatch, 2, environment)
    with pytest.raises(
        UserError, match=r"--ntasks-per-node=1\) or one per GPU \(--gpus-per-task=1"
    ):
        tf_cluster.cluster_resolver()


# ------------------------------------------------------------- tools/slurm_train.sbatch


def _sbatch(tmp_path: Path, **environment: str) -> tuple[subprocess.CompletedProcess, list]:
    """Run the batch script with bash under a fake Slurm environment and a fake `srun` that
    records its arguments: (the script's result, srun's arguments or None if not run)."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(exist_ok=True)
    record = tmp_path / "srun-arguments"
    record.unlink(missing_ok=True)
    srun = fake_bin / "srun"
    srun.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > "{record}"\n'
        f'printf "%s" "$NCCL_DEBUG" > "{record}.nccl_debug"\n'
    )
    srun.chmod(0o755)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "SLURM_JOB_ID": "42", "SLURM_CPUS_ON_NODE": "64"}
    env["SLURM_JOB_NUM_NODES"] = "4"
    env |= environment
    result = subprocess.run(
        ["bash", str(SBATCH), "/data/imagenet", "/shared/runs"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    arguments = record.read_text().splitlines() if record.exists() else None
    return result, arguments


TRAIN = ["hpcai500-tf", "train", "image_classification", "--preset", "reference"]
TRAIN += ["--data", "/data/imagenet", "--resume-or-start", "/shared/runs/slurm-42"]


def _shape(tasks_per_node: int, cpus: int) -> list[str]:
    """The whole step's shape srun is given (4 nodes here): --ntasks-per-node alone would be
    only a maximum under the batch script's SLURM_NTASKS."""
    return [
        "--nodes=4", f"--ntasks={4 * tasks_per_node}", f"--ntasks-per-node={tasks_per_node}",
        f"--cpus-per-task={cpus}", "--distribution=block", "--kill-on-bad-exit=1",
    ]  # fmt: skip


def test_sbatch_syntax():
    assert subprocess.run(["bash", "-n", str(SBATCH)]).returncode == 0
    text = SBATCH.read_text()
    assert "#SBATCH --gpus-per-node=8" in text and "#SBATCH --ntasks-per-node=1" in text
    assert "#SBATCH --exclusive" in text and "#SBATCH --signal=B:USR1@300" in text
    assert "#SBATCH --requeue" in text
    for setting in ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "ulimit -l", "optimizer.name=lars"):
        assert setting in text  # named for a first run on a new cluster


@pytest.mark.parametrize(
    "granted",
    [{"SLURM_GPUS_ON_NODE": "8"}, {"SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7"}]
    + [{"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}],
)
def test_sbatch_gives_the_one_task_per_node_all_its_gpus(tmp_path, granted):
    result, arguments = _sbatch(tmp_path, **granted)
    assert result.returncode == 0, result.stderr
    # the whole node's CPUs for its one task, and NCCL's transports printed on a first run
    expected = [*_shape(1, 64), "--gpus-per-node=8", *TRAIN]
    assert arguments == expected
    assert (tmp_path / "srun-arguments.nccl_debug").read_text() == "INFO"


def test_sbatch_runs_one_task_per_gpu_with_its_share_of_the_cpus(tmp_path):
    result, arguments = _sbatch(tmp_path, SLURM_GPUS_ON_NODE="8", TASK_PER="gpu", NCCL_DEBUG="WARN")
    assert result.returncode == 0, result.stderr
    # every task sees the node's GPUs and takes its own (NVLink P2P between them kept)
    expected = [*_shape(8, 8), "--gpus-per-node=8", "--gpu-bind=none", *TRAIN]
    assert arguments == expected
    assert (tmp_path / "srun-arguments.nccl_debug").read_text() == "WARN"  # the user's kept


def test_sbatch_refuses_an_unknown_layout_in_one_line(tmp_path):
    result, arguments = _sbatch(tmp_path, SLURM_GPUS_ON_NODE="8", TASK_PER="socket")
    assert result.returncode != 0 and arguments is None
    assert result.stderr.splitlines() == [
        "slurm_train.sbatch: error: TASK_PER must be node or gpu, got 'socket'"
    ]


def test_sbatch_refuses_a_max_segments_that_is_no_count_before_srun(tmp_path):
    """It was read only after the segment had trained (an unbound-variable error then)."""
    result, arguments = _sbatch(tmp_path, SLURM_GPUS_ON_NODE="8", MAX_SEGMENTS="ten")
    assert result.returncode == 2 and arguments is None
    assert result.stderr.splitlines() == [
        "slurm_train.sbatch: error: MAX_SEGMENTS must be a whole number >= 1, got 'ten'"
    ]


def test_sbatch_refuses_a_job_without_gpus_before_srun(tmp_path):
    result, arguments = _sbatch(tmp_path)
    assert result.returncode != 0 and arguments is None
    (line,) = result.stderr.splitlines()
    assert line.startswith("slurm_train.sbatch: error: Slurm gave this job no GPUs")
    assert "HPCAI500_ALLOW_CPU=1" in line


def test_sbatch_follows_the_gpus_slurm_granted_and_refuses_another_count(tmp_path):
    result, arguments = _sbatch(tmp_path, SLURM_JOB_GPUS="0,1,2,3", TASK_PER="gpu")
    assert result.returncode == 0, result.stderr  # sbatch --gpus-per-node=4
    assert arguments == [*_shape(4, 16), "--gpus-per-node=4", "--gpu-bind=none", *TRAIN]
    result, arguments = _sbatch(tmp_path, SLURM_JOB_GPUS="0,1,2,3", GPUS_PER_NODE="8")
    assert result.returncode == 2 and arguments is None
    (line,) = result.stderr.splitlines()
    assert "gave this node 4 GPUs but GPUS_PER_NODE is 8" in line


def test_sbatch_keeps_slurms_own_binding_as_an_option(tmp_path):
    result, arguments = _sbatch(tmp_path, SLURM_GPUS_ON_NODE="8", TASK_PER="gpu", GPU_BIND="slurm")
    assert result.returncode == 0, result.stderr
    assert arguments == [*_shape(8, 8), "--gpus-per-task=1", *TRAIN]


def test_sbatch_starts_pytorch_one_task_per_gpu(tmp_path):
    result, arguments = _sbatch(tmp_path, SLURM_GPUS_ON_NODE="8", FRAMEWORK="pytorch")
    assert result.returncode == 0, result.stderr
    train = [*TRAIN[:3], "--framework", "pytorch", *TRAIN[3:]]
    assert arguments == [*_shape(8, 8), "--gpus-per-node=8", "--gpu-bind=none", *train]
    result, arguments = _sbatch(
        tmp_path, SLURM_GPUS_ON_NODE="8", FRAMEWORK="pytorch", TASK_PER="node"
    )
    assert result.returncode == 2 and arguments is None
    assert result.stderr.splitlines() == [
        "slurm_train.sbatch: error: FRAMEWORK=pytorch computes on one GPU per process: use "
        "TASK_PER=gpu (one task per GPU), not TASK_PER=node"
    ]


def test_sbatch_runs_on_cpus_when_allowed(tmp_path):
    result, arguments = _sbatch(tmp_path, HPCAI500_ALLOW_CPU="1", CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 0, result.stderr
    assert arguments == [*_shape(1, 64), *TRAIN]


def test_a_slurm_task_given_gpus_that_tensorflow_cannot_see_is_refused_in_one_line(monkeypatch):
    """A CPU-only TensorFlow (this machine's) in a GPU job: the task is refused before the
    strategy waits for GPU replicas that never come (it used to hang at the first step)."""
    import tensorflow as tf

    from hpcai500_tf.engine import strategy as strategies

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("TensorFlow sees a GPU here")
    environment = {
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURMD_NODENAME": "gpu8",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "gpu[8-9]",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_CPUS_PER_TASK": "8",
        "SLURM_GPUS_ON_NODE": "4",
    }
    _slurm_task_on_gpu_node(monkeypatch, 4, environment)
    monkeypatch.setattr(slurm, "port_free", lambda port: True)
    with pytest.raises(UserError, match=r"^Slurm gave this task 4 GPU\(s\), but TensorFlow sees"):
        strategies.make_strategy("multi_worker")


def test_a_task_given_two_mig_instances_is_refused(monkeypatch):
    """CUDA shows a process one MIG instance however many CUDA_VISIBLE_DEVICES names: a
    strategy told two would wait for a replica with no device."""
    import types

    from hpcai500_tf.engine import strategy as strategies

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-aaaa,MIG-bbbb")
    resolver = types.SimpleNamespace(hpcai500_gpus=2)
    with pytest.raises(UserError) as refused:
        strategies.check_gpus_seen(resolver, "Slurm", ["GPU:0"])
    assert str(refused.value).startswith("Slurm gave this task 2 GPUs, but TensorFlow sees 1")
    assert "CUDA shows a process one MIG instance" in str(refused.value)
    strategies.check_gpus_seen(resolver, "Slurm", ["GPU:0", "GPU:1"])  # whole GPUs: fine
