"""Several PyTorch workers (hpcai500_tf/pytorch/distributed.py): who they are from torchrun's,
the launcher's or Slurm's environment, malformed values refused in one line naming the
variable; two real gloo workers on the CPU whose DistributedDataParallel step averages the
gradients, and their uneven evaluation shards gathered into evaluation order (an ensemble
member's probabilities); and each worker's feeder reading its own shard of the data."""

import concurrent.futures
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcai500_tf.cluster import local_workers, slurm
from hpcai500_tf.cluster import workers as cluster_workers
from hpcai500_tf.errors import UserError
from hpcai500_tf.pytorch import distributed
from hpcai500_tf.pytorch.distributed import Workers, workers_from_environment

ROOT = Path(__file__).resolve().parents[1]
PROBE = Path(__file__).resolve().parent / "pytorch_workers_probe.py"

TORCHRUN = {
    "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "gpu07",
    "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none",
}  # fmt: skip
SLURM = {  # a task of `srun -N3 -n6` as srun sets it (the step's own variables)
    "SLURM_PROCID": "4", "SLURM_NTASKS": "6", "SLURM_STEP_NUM_TASKS": "6", "SLURM_LOCALID": "0",
    "SLURM_STEP_NODELIST": "node[03-05]", "SLURM_STEP_TASKS_PER_NODE": "2(x3)",
    "SLURM_JOB_ID": "1234",
}  # fmt: skip


# ------------------------------------------------------------------------ who the workers are


def test_torchrun_the_launcher_and_a_hand_set_environment():
    assert workers_from_environment(TORCHRUN) == Workers(8, 5, 1, "gpu07", 29500, "torchrun")
    plain = {k: v for k, v in TORCHRUN.items() if k != "TORCHELASTIC_RUN_ID"}
    assert workers_from_environment(plain).source == "environment"
    one = {**plain, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    assert not workers_from_environment(one).several


def test_the_launchers_environments_name_every_worker_and_share_the_cores():
    base = {"PATH": "/bin", "TORCHELASTIC_USE_AGENT_STORE": "True", "HPCAI500_WORKER_GPUS": "0"}
    environments = local_workers.torch_environments(3, 41000, base, cpus=8)
    assert [workers_from_environment(env) for env in environments] == [
        Workers(3, rank, rank, "127.0.0.1", 41000, "launcher") for rank in range(3)
    ]
    for env in environments:
        assert env["OMP_NUM_THREADS"] == env["TF_NUM_INTRAOP_THREADS"] == "2"  # 8 cores // 3
        assert env["LOCAL_WORLD_SIZE"] == "3" and env["PATH"] == "/bin"
        # A torchrun agent's store is not there for these workers.
        assert not any(k.startswith("TORCHELASTIC_") for k in env)
    kept = local_workers.torch_environments(2, 41000, {"OMP_NUM_THREADS": "3"}, cpus=8)
    assert kept[1]["OMP_NUM_THREADS"] == "3"  # set by the user: kept


def test_slurm_tasks_find_rank_0_on_the_first_node_and_agree_on_a_port():
    port = slurm.PORT_FIRST + (1234 % slurm.PORT_SLOTS) * slurm.PORT_STRIDE
    assert workers_from_environment(SLURM) == Workers(6, 4, 0, "node03", port, "slurm")
    # The step's own count and node list first; MASTER_ADDR and MASTER_PORT where set.
    step = {**SLURM, "SLURM_STEP_NUM_TASKS": "5", "SLURM_STEP_NODELIST": "gpu[10,8]"}
    step["SLURM_STEP_TASKS_PER_NODE"] = "4,1"
    assert workers_from_environment(step).world_size == 5
    assert workers_from_environment(step).master_addr == "gpu10"
    job = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_NODELIST"}
    job["SLURM_JOB_NODELIST"] = "m1,node[03-05]"
    job["SLURM_STEP_TASKS_PER_NODE"] = "1,1,2,2"
    assert workers_from_environment(job).master_addr == "m1"
    given = {**SLURM, "MASTER_ADDR": "head", "MASTER_PORT": "23456"}
    given = workers_from_environment(given)
    assert (given.master_addr, given.master_port) == ("head", 23456)
    based = {**SLURM, "HPCAI500_SLURM_PORT_BASE": "31000"}
    assert workers_from_environment(based).master_port == 31000
    # More tasks on a node than a job id's slot of ports holds: a PyTorch worker listens on
    # none but rank 0's one port (TensorFlow's gRPC servers each on their own are refused).
    many = {**SLURM, "SLURM_STEP_NUM_TASKS": "64", "SLURM_NTASKS": "64", "SLURM_PROCID": "40"}
    many |= {"SLURM_STEP_NODELIST": "node[03-04]", "SLURM_STEP_TASKS_PER_NODE": "32(x2)"}
    many["SLURM_LOCALID"] = "8"
    assert workers_from_environment(many) == Workers(64, 40, 8, "node03", port, "slurm")
    with pytest.raises(UserError, match="runs 32 tasks, more than the 16 ports"):
        cluster_workers.slurm_cluster(many)
    # RANK wins over Slurm's variables (torchrun started inside an allocation).
    assert workers_from_environment({**SLURM, **TORCHRUN}).source == "torchrun"


def test_one_task_or_no_launcher_is_a_single_worker():
    assert workers_from_environment({}) == distributed.SINGLE
    single = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    assert workers_from_environment(single).source == "single"
    assert distributed.SINGLE.world_size == 1 and distributed.SINGLE.chief


@pytest.mark.parametrize(
    "env, named",
    [
        ({**TORCHRUN, "RANK": "one"}, "RANK='one' is not a whole number"),
        ({**TORCHRUN, "WORLD_SIZE": "0", "RANK": "0"}, "WORLD_SIZE=0 must be at least 1"),
        ({**TORCHRUN, "RANK": "8"}, "RANK=8 is out of range for WORLD_SIZE=8"),
        ({**TORCHRUN, "LOCAL_RANK": "-1"}, "LOCAL_RANK='-1' is not a whole number"),
        ({**TORCHRUN, "MASTER_PORT": "0"}, "MASTER_PORT='0' is not a port"),
        ({**TORCHRUN, "MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not a port"),
        ({**TORCHRUN, "MASTER_PORT": "29500x"}, "MASTER_PORT='29500x' is not a port"),
        ({k: v for k, v in TORCHRUN.items() if k != "LOCAL_RANK"}, "LOCAL_RANK is not set"),
        ({k: v for k, v in TORCHRUN.items() if k != "RANK"}, "RANK is not set"),
        ({**TORCHRUN, "MASTER_ADDR": ""}, "MASTER_ADDR is not set"),
        ({**SLURM, "SLURM_PROCID": "a"}, "SLURM_PROCID='a' is not a whole number"),
        ({**SLURM, "SLURM_NTASKS": "six"}, "SLURM_NTASKS='six' is not a whole number"),
        ({**SLURM, "SLURM_PROCID": "6"}, "SLURM_PROCID=6 is out of range for SLURM_STEP"),
        ({**SLURM, "SLURM_NTASKS": "0", "SLURM_PROCID": "0"}, "SLURM_NTASKS='0' is not a whole"),
        ({k: v for k, v in SLURM.items() if k != "SLURM_LOCALID"}, "SLURM_LOCALID is not set"),
        ({**SLURM, "SLURM_LOCALID": "x"}, "SLURM_LOCALID='x' is not a whole number"),
        ({k: v for k, v in SLURM.items() if k != "SLURM_JOB_ID"}, "SLURM_JOB_ID"),
        ({**SLURM, "SLURM_STEP_NODELIST": "node[03-"}, "SLURM_STEP_NODELIST='node[03-'"),
        ({**SLURM, "MASTER_PORT": "65536"}, "MASTER_PORT='65536' is not a port"),
        ({k: v for k, v in SLURM.items() if k != "SLURM_STEP_NODELIST"}, "SLURM_STEP_NODELIST"),
    ],
)
def test_a_malformed_value_is_one_line_naming_the_variable(env, named):
    with pytest.raises(UserError) as caught:
        workers_from_environment(env)
    message = str(caught.value)
    assert named in message and len(message.splitlines()) == 1, message


def test_peer_lost_knows_torchs_network_errors_and_gloos_messages():
    class DistError(RuntimeError):
        pass

    class DistNetworkError(DistError):
        pass

    class DistBackendError(DistError):
        pass

    assert distributed.peer_lost(DistNetworkError("anything"))
    assert distributed.peer_lost(
        RuntimeError("[pair.cc:537] Read error [127.0.0.1]:1438: Connection reset by peer.")
    )
    assert distributed.peer_lost(
        RuntimeError("[unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation")
    )
    assert distributed.peer_lost(DistBackendError("NCCL error: remote process exited"))
    assert not distributed.peer_lost(DistBackendError("NCCL error: unhandled cuda error"))
    assert not distributed.peer_lost(RuntimeError("CUDA out of memory"))
    assert not distributed.peer_lost(ValueError("timed out"))


# ------------------------------------------------------------------------ two gloo workers


def run_workers(mode: str, ranks=(0, 1), world: int = 2, timeout: int = 90) -> list[dict]:
    """The probe as workers `ranks` of `world` on loopback; each one's JSON line, by rank."""
    (port,) = local_workers.free_ports(1)
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "TORCHELASTIC_", "HPCAI500_LAUNCHER"))
    }
    processes = []
    for rank in ranks:
        env = {
            **base, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
        }  # fmt: skip
        processes.append(
            subprocess.Popen(
                [sys.executable, str(PROBE), mode],
                env=env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs = []
    try:
        for process in processes:
            stdout, stderr = process.communicate(timeout=timeout)
            outputs.append((process.returncode, stdout, stderr))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    results = []
    for code, stdout, stderr in outputs:
        assert code == 0, stderr[-3000:]
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return results


def test_two_gloo_workers_average_their_gradients(torch_installed):
    first, second = run_workers("step")
    for result in (first, second):
        assert result["source"] == "environment" and not result["tensorflow_loaded"]
        # Rank 1 started from other weights (its own seed): DDP gave it rank 0's.
        assert result["start"] == first["start"]
        # After one step on different data, the same weights: those of the mean gradient.
        assert result["params"] == pytest.approx(result["expected"], rel=1e-5, abs=1e-7)
        assert result["rows"] == [[0.0, 0.0], [1.0, 10.0]]
        assert result["same"] is True and result["differ"] is False
        assert not result["initialised_after_shutdown"]
    assert first["params"] == second["params"]
    # Each worker's batch norm ran on its own data; averaged, both hold the mean.
    assert first["mean_before"] != second["mean_before"]
    assert first["mean_after"] == second["mean_after"]
    mean = [(a + b) / 2 for a, b in zip(first["mean_before"], second["mean_before"], strict=True)]
    assert first["mean_after"] == pytest.approx(mean, rel=1e-6)
    assert first["batches_tracked"] == second["batches_tracked"] == 1


def test_a_peer_that_leaves_is_a_lost_peer(torch_installed):
    first, second = run_workers("lose")
    assert second == {"left": True}
    assert first["error"] is not None and first["peer_lost"], first


def test_a_worker_alone_is_told_in_one_line_whom_it_could_not_reach(torch_installed):
    (alone,) = run_workers("alone", ranks=(0,))
    message = alone["user_error"]
    assert message.startswith("worker 0 could not reach the others at 127.0.0.1:"), message
    assert "within 2s: " in message and len(message.splitlines()) == 1


def test_a_torchrun_worker_refuses_unshardable_config_before_the_rendezvous(
    tmp_path, torch_installed
):
    """Rank 0 of two, alone (torchrun's environment, no peer): what the config alone shows
    cannot be sharded is refused in one line at once, not after waiting for the peer, and
    nothing is written."""
    env = {
        **os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(local_workers.free_ports(1)[0]),
        "TORCHELASTIC_RUN_ID": "none",
    }  # fmt: skip
    command = [
        sys.executable, "-m", "hpcai500_tf.cli", "train", "image_classification",
        "--preset", "tiny", "--framework", "pytorch", "--out", str(tmp_path / "out"),
        "--set", "data.eval_examples=1", "--set", "communication.join_timeout_s=60",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "hpcai500-tf: error: 1 evaluation examples cannot be sharded to 2 workers"
    )
    assert not (tmp_path / "out").exists()


def test_uneven_shards_are_gathered_into_evaluation_order(torch_installed):
    """An ensemble member's evaluation on two workers (pytorch/train.py `_gathered`): 26
    and 25 rows, padded for the all-gather and cut back, interleaved into examples 0..50."""
    first, second = run_workers("gather")
    assert first == second
    assert first["sizes"] == [26, 25]
    assert first["ordered"] == [[float(i), pytest.approx(i / 10)] for i in range(51)]
    assert first["labels"] == list(range(51)) and first["label_dtype"] == "torch.int64"


# ------------------------------------------------------------------------ the feeder's shards


def test_each_workers_feeder_reads_its_own_shard():
    from hpcai500_tf import config
    from hpcai500_tf.pytorch.feeder import Feeder

    with pytest.raises(ValueError, match="shard"):
        Feeder("image_classification", {}, None, 8, True, shard=(2, 2))
    settings = ["data.train_examples=64", "data.eval_examples=51"]
    setup = config.prepare("image_classification", "tiny", settings)
    trained, evaluated = [], []
    # Both data processes start at once (each loads TensorFlow: seconds), as two workers' do.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        starting = [
            pool.submit(Feeder, "image_classification", setup.config, None, 8, True, shard=(2, i))
            for i in (0, 1)
        ]
    feeders = [future.result() for future in starting if future.exception() is None]
    try:
        for future in starting:
            future.result()  # a feeder that failed to start fails the test here
        for feeder in feeders:
            assert feeder.workload.eval_examples == 51  # the whole split's count
            assert feeder.workload.data_warnings == ()
            train = feeder.batches(True, 3)
            # One epoch of this worker's half: 32 examples.
            trained.append({digest(image) for _ in range(4) for image in next(train)[0]})
            train.close()
            evaluated.append([digest(image) for images, _, _ in feeder.batches(False, 7)
                              for image in images])  # fmt: skip
    finally:
        for feeder in feeders:
            feeder.close()
    assert len(trained[0]) == len(trained[1]) == 32 and not trained[0] & trained[1]
    assert (len(evaluated[0]), len(evaluated[1])) == (26, 25)  # 51 split by position
    assert len(set(evaluated[0]) | set(evaluated[1])) == 51  # every example once


def digest(image) -> str:
    return hashlib.sha256(image.tobytes()).hexdigest()


def test_a_pytorch_worker_counts_only_the_gpu_it_computes_on(monkeypatch):
    """A task that sees all 8 of its node's GPUs (srun --gpu-bind=none, the sbatch's PyTorch
    default; --workers N) computes on GPU LOCAL_RANK: L1 marks that one as used, so 16 such
    workers are 16 accelerators in the ranking, not 128."""
    import types

    from hpcai500_tf.cluster import machine
    from hpcai500_tf.cluster.devices import WORKER_GPUS
    from hpcai500_tf.results import scoring

    gpus = [
        {"index": i, "model": "NVIDIA H100", "memory_bytes": 80 << 30, "uuid": f"GPU-{i:08d}"}
        for i in range(8)
    ]
    monkeypatch.setattr(machine, "nvidia_gpus", lambda: (gpus, "570.00", None))
    monkeypatch.delenv(WORKER_GPUS, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    environ = dict(os.environ)
    cuda = types.SimpleNamespace(current_device=lambda: 0)
    distributed.mark_computing_gpu(environ, types.SimpleNamespace(cuda=cuda),
                                   types.SimpleNamespace(type="cuda", index=3))  # fmt: skip
    assert environ[WORKER_GPUS] == "3"
    monkeypatch.setenv(WORKER_GPUS, environ[WORKER_GPUS])
    l1 = machine.hardware_layer(16)
    assert [a["index"] for a in l1["accelerators"] if a["visible"]] == [3]
    facts = scoring.system_facts({"layers": {"L1": l1, "L3": {}, "L5": {}}})
    assert facts["accelerators"] == 16
    cpu = {}
    distributed.mark_computing_gpu(cpu, None, types.SimpleNamespace(type="cpu", index=None))
    assert cpu == {}
