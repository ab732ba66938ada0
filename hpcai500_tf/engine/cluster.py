"""Where a multi-worker run's cluster comes from, and how a worker avoids hanging forever.

The cluster is taken from `TF_CONFIG` when it is set (by the user, or by `hpcai500-tf train
--workers N`), else from Slurm when the process runs under `srun`. Both are checked before
TensorFlow sees them, so a malformed cluster is one clear line.

GPUs are handed out as `CUDA_VISIBLE_DEVICES` entries: the node's GPUs by index, or the list
already in that variable (Slurm's grant, a user's choice), which is split, never replaced.

A worker waiting for a peer that never arrives blocks inside TensorFlow with the interpreter
lock held and SIGTERM ignored: no Python thread or signal handler can end it. `JoinWatchdog`
therefore runs a tiny separate process that SIGKILLs the worker, after saying why, unless
the worker joins the cluster in time.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping

from hpcai500_tf import benchmark_layers
from hpcai500_tf.errors import UserError

SLURM_PORT_BASE = 8888


def parse_tf_config(text: str) -> dict:
    """The decoded TF_CONFIG of a worker task, checked: cluster, task type and index, ports."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise UserError(f"TF_CONFIG is not valid JSON ({error.msg})") from None
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict):
        raise UserError('TF_CONFIG needs a "cluster" object, e.g. {"worker": ["host:port", ...]}')
    task = config.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise UserError('TF_CONFIG needs a "task" object with "type" and "index"')
    cluster = config["cluster"]
    for job, addresses in cluster.items():
        if job not in ("chief", "worker"):
            raise UserError(f"TF_CONFIG: job '{job}' is not supported (chief and worker only)")
        if not isinstance(addresses, list) or not addresses:
            raise UserError(f"TF_CONFIG: cluster.{job} must be a non-empty list of host:port")
        for address in addresses:
            host, _, port = str(address).rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise UserError(f"TF_CONFIG: '{address}' in cluster.{job} is not host:port")
    kind, index = task["type"], task["index"]
    if kind not in cluster:
        raise UserError(f"TF_CONFIG: task type '{kind}' is not a job of the cluster")
    if not isinstance(index, int) or not 0 <= index < len(cluster[kind]):
        raise UserError(
            f"TF_CONFIG: task index {index!r} is out of range for {len(cluster[kind])} "
            f"{kind} address(es)"
        )
    return config


def own_address(config: dict) -> str:
    task = config["task"]
    return config["cluster"][task["type"]][task["index"]]


def check_port_free(address: str) -> None:
    """Refuse a worker whose own port is taken (on this host) before TensorFlow binds it."""
    host, _, port = address.rpartition(":")
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.bind(("", int(port)))
    except OSError:
        raise UserError(f"port {port} of this worker ({address}) is already in use") from None
    finally:
        probe.close()


def under_slurm() -> bool:
    """Whether this process is one of several tasks of a Slurm step (`srun`)."""
    tasks = os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS") or "1"
    return "SLURM_PROCID" in os.environ and tasks.isdigit() and int(tasks) > 1


def cluster_in_environment() -> str | None:
    """Where a multi-worker cluster is described for this process, if anywhere."""
    if os.environ.get("TF_CONFIG"):
        return "TF_CONFIG"
    return "Slurm" if under_slurm() else None


def strategy_overrides(launching_workers: bool) -> list[str]:
    """The config override a run takes from its environment: multi_worker when this process
    launches workers (--workers N) or is one task of a cluster (srun, TF_CONFIG)."""
    if launching_workers or cluster_in_environment():
        return ["training.strategy=multi_worker"]
    return []


def _nvml_gpu_count() -> int | None:
    """NVIDIA GPUs on this node by NVML (nvidia-ml-py), or None when NVML cannot be used."""
    try:
        import pynvml  # provided by nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def node_gpu_count() -> int:
    """NVIDIA GPUs on this node: NVML, else `nvidia-smi -L`; 0 on a node without them."""
    count = _nvml_gpu_count()
    if count is not None:
        return count
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in listing.stdout.splitlines())


def visible_gpus(environ: Mapping[str, str] | None = None, count: int | None = None) -> list[str]:
    """The GPUs this process may use, as `CUDA_VISIBLE_DEVICES` entries: that variable's list
    when it is set (CUDA ignores it from the first negative entry on), else every GPU of the
    node by index. `count` is the node's GPU count (looked up when None); with none, the list
    is empty whatever the variable says, and work stays on the CPUs."""
    environ = os.environ if environ is None else environ
    count = node_gpu_count() if count is None else count
    if count == 0:
        return []
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(index) for index in range(count)]
    return benchmark_layers.cuda_visible_entries(listed)


def resolve_collective(requested: str, gpus: list) -> str:
    """The collective implementation ("nccl" or "ring") for `communication.collective` on a
    worker that sees `gpus`: auto is NCCL between GPU workers and ring (gRPC) between CPU
    workers, where TensorFlow's own AUTO would take ring even on GPUs; nccl without a GPU is
    refused now, where it would otherwise fail only once every worker has joined."""
    if requested == "nccl" and not gpus:
        raise UserError(
            "communication.collective=nccl needs GPUs and none is visible here: "
            "use auto or ring on CPU"
        )
    if requested == "auto":
        return "nccl" if gpus else "ring"
    return requested


def cluster_resolver():
    """(resolver or None, how the cluster was found). TF_CONFIG first, then Slurm."""
    import tensorflow as tf

    text = os.environ.get("TF_CONFIG")
    if text:
        config = parse_tf_config(text)
        check_port_free(own_address(config))
        return tf.distribute.cluster_resolver.TFConfigClusterResolver(), "TF_CONFIG"
    if under_slurm():
        try:
            return _slurm_resolver(tf), "Slurm"
        except (RuntimeError, ValueError, KeyError, OSError, subprocess.SubprocessError) as err:
            raise UserError(f"cannot read the Slurm cluster ({err})") from None
    return None, "a single worker (no TF_CONFIG, not under srun)"


def _slurm_resolver(tf):
    """This Slurm task's cluster resolver; on GPU nodes, CUDA_VISIBLE_DEVICES is narrowed to
    this task's share of the GPUs it may use (all of them with one task per node)."""
    port_base = int(os.environ.get("HPCAI500_SLURM_PORT_BASE", SLURM_PORT_BASE))
    gpus = visible_gpus()
    if not gpus:
        # TensorFlow's Slurm resolver lays tasks out along the GPUs of each node; on CPU
        # nodes give it one placeholder per task, keep the cluster it resolves and tell the
        # strategy there is no accelerator.
        slurm = tf.distribute.cluster_resolver.SlurmClusterResolver(
            port_base=port_base, gpus_per_node=1024, gpus_per_task=1, auto_set_gpu=False
        )
        spec = slurm.cluster_spec()
        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            spec, task_type=slurm.task_type, task_id=slurm.task_id, rpc_layer="grpc"
        )
    # TensorFlow's resolver would set CUDA_VISIBLE_DEVICES to indices from 0 whatever Slurm
    # granted; it only counts GPUs per task here, and the share is cut from `gpus`.
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
        port_base=port_base, gpus_per_node=len(gpus), auto_set_gpu=False
    )
    resolver.cluster_spec()
    share = resolver.num_accelerators()["GPU"]
    if share == 0:
        raise UserError(
            f"more Slurm tasks on this node than its {len(gpus)} GPUs: "
            "run one task per node (srun --ntasks-per-node=1)"
        )
    local = int(os.environ.get("SLURM_LOCALID", "0"))
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[local * share : (local + 1) * share])
    return resolver


class JoinWatchdog:
    """Kill this process with a message unless the `with` block ends within `seconds`."""

    _CODE = (
        "import os, signal, sys, time\n"
        "pid, seconds, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]\n"
        "deadline = time.time() + seconds\n"
        "while time.time() < deadline:\n"
        "    time.sleep(0.2)\n"
        "    if os.getppid() != pid: sys.exit(0)\n"
        "sys.stderr.write('hpcai500-tf: error: ' + message + '\\n'); sys.stderr.flush()\n"
        "os.kill(pid, signal.SIGKILL)\n"
    )

    def __init__(self, seconds: float, message: str):
        self.seconds, self.message = seconds, message
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> JoinWatchdog:
        if self.seconds > 0:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    self._CODE,
                    str(os.getpid()),
                    str(self.seconds),
                    self.message,
                ]
            )
        return self

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


def same_on_all_workers(strategy, fingerprint: str) -> bool:
    """Whether every worker holds this fingerprint (a hex string): gathered collectively."""
    import tensorflow as tf

    value = int(fingerprint[:15], 16)  # 60 bits, as three float32-exact 20-bit pieces
    local = tf.constant([[(value >> (20 * i)) & 0xFFFFF for i in range(3)]], tf.float32)
    return bool((_all_gather(strategy, local) == local.numpy()).all())


def gather_rows(strategy, row: list[float]):
    """Every worker's `row` (float64), ordered by worker: (workers, len(row)) numpy array.
    With several replicas per worker, each worker's first replica is kept."""
    import tensorflow as tf

    rows = _all_gather(strategy, tf.constant([row], tf.float64))
    per_worker = len(rows) // max(1, strategy.extended._num_workers)  # replicas per worker
    return rows[::per_worker]


def _all_gather(strategy, local):
    """Every replica's `local` (one row each), stacked in replica order: a numpy array."""
    import tensorflow as tf

    @tf.function
    def gather():
        def replica():
            return tf.distribute.get_replica_context().all_gather(local, axis=0)

        return strategy.experimental_local_results(strategy.run(replica))[0]

    return gather().numpy()


def exit_without_shutdown(code: int) -> None:
    """End a worker of a failed multi-worker run now: TensorFlow's orderly shutdown would wait
    for the lost peer forever. Output is flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
