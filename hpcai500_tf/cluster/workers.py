"""Where a multi-worker run's cluster comes from, and how a worker avoids hanging forever:
for every framework, before any loads.

The cluster is taken from `TF_CONFIG` when it is set (by the user, or by `hpcai500-tf train
--workers N`), else from Slurm's environment when the process runs under `srun` (read in
Slurm's own order by `cluster.slurm`); PyTorch's workers also from torchrun's `WORLD_SIZE`.
Both are checked before a framework sees them, so a malformed cluster is one clear line;
`cluster_plan` shows it without a framework.

GPUs are handed out as `CUDA_VISIBLE_DEVICES` entries: the node's GPUs by index, or the list
already in that variable (Slurm's grant, a user's choice), which is split, never replaced. A
Slurm task that shares its node's GPUs with the node's other tasks gets its slice as positions
in that list (`HPCAI500_WORKER_GPUS`, as `--workers N` gives them), the list left whole so
that NCCL sees the peers' GPUs; a task Slurm bound GPUs to keeps Slurm's list as it is.

A worker waiting for a peer that never arrives blocks inside the framework with the
interpreter lock held and SIGTERM ignored: no Python thread or signal handler can end it.
`JoinWatchdog` therefore runs a tiny separate process that SIGKILLs the worker, after saying
why, unless the worker joins the cluster in time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping

from hpcai500_tf.cluster import devices as cluster_devices
from hpcai500_tf.cluster import machine, slurm
from hpcai500_tf.cluster.devices import WORKER_GPUS
from hpcai500_tf.cluster.slurm import SlurmCluster, port_free, shown
from hpcai500_tf.errors import UserError

SINGLE_WORKER = "a single worker (no TF_CONFIG, not under srun)"


def parse_tf_config(text: str) -> dict:
    """The decoded TF_CONFIG of a worker task, checked: cluster, task type and index, ports."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise UserError(f"TF_CONFIG is not valid JSON ({error.msg})") from None
    except ValueError:  # Python reads no integer of more than 4,300 digits
        raise UserError("TF_CONFIG holds a number of more than 4,300 digits") from None
    except RecursionError:
        raise UserError("TF_CONFIG is nested too deeply to be a cluster") from None
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict):
        raise UserError('TF_CONFIG needs a "cluster" object, e.g. {"worker": ["host:port", ...]}')
    task = config.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise UserError('TF_CONFIG needs a "task" object with "type" and "index"')
    cluster = config["cluster"]
    for job, addresses in cluster.items():
        if job not in ("chief", "worker"):
            raise UserError(f"TF_CONFIG: job '{job}' is not supported (chief and worker only)")
        if not isinstance(addresses, list) or not 0 < len(addresses) <= slurm.MAX_TASKS:
            raise UserError(
                f"TF_CONFIG: cluster.{job} must be a list of 1 to {slurm.MAX_TASKS:,} host:port"
            )
        for address in addresses:
            host, _, port = str(address).rpartition(":")
            if not host or not re.fullmatch("[0-9]{1,5}", port) or not 0 < int(port) < 65536:
                raise UserError(
                    f"TF_CONFIG: {shown(str(address))} in cluster.{job} is not host:port "
                    "(a port from 1 to 65535)"
                )
    kind, index = task["type"], task["index"]
    if kind not in cluster:
        raise UserError(f"TF_CONFIG: task type {shown(str(kind))} is not a job of the cluster")
    if type(index) is not int:
        raise UserError(
            f"TF_CONFIG: task index must be a JSON whole number, got {shown(json.dumps(index))}"
        )
    if not 0 <= index < len(cluster[kind]):
        raise UserError(
            f"TF_CONFIG: task index {shown(str(index))[1:-1]} is out of range for "
            f"{len(cluster[kind])} {kind} address(es)"
        )
    return config


def own_address(config: dict) -> str:
    task = config["task"]
    return config["cluster"][task["type"]][task["index"]]


def under_slurm(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is one of several tasks of a Slurm step (`srun`): by
    SLURM_STEP_NUM_TASKS, never the job's SLURM_NTASKS (a batch script running `train` with
    several tasks in its job and no srun is refused in one line, `slurm.step_tasks`)."""
    environ = os.environ if environ is None else environ
    return slurm.step_tasks(environ) > 1  # SLURM_STEP_NUM_TASKS, read strictly


def cluster_in_environment() -> str | None:
    """Where a multi-worker cluster is described for this process, if anywhere."""
    if os.environ.get("TF_CONFIG"):
        return "TF_CONFIG"
    return "Slurm" if under_slurm() else None


def strategy_overrides(
    launching_workers: bool, *, reads_torchrun: bool = False, reads_tf_config: bool = True
) -> list[str]:
    """The config override a run takes from its environment: multi_worker when this process
    launches workers (--workers N) or is one task of a cluster (srun, TF_CONFIG; where the
    framework `reads_torchrun` (PyTorch), also torchrun's WORLD_SIZE above 1). A task's
    cluster (TF_CONFIG where the framework `reads_tf_config`, TensorFlow; Slurm's step for
    both frameworks) is checked here, its hosts resolved, in one line, before the framework
    loads (backends.Backend.strategy_overrides gives the framework's flags)."""
    step = launching_workers and "SLURM_STEP_NUM_TASKS" in os.environ  # read strictly there
    if step and (tasks := slurm.step_tasks(os.environ)) > 1:
        raise UserError(
            f"--workers launches its workers on this machine, but this is one of {tasks} "
            "tasks of an srun step, each of which would launch a run of its own: srun -n1 "
            "with --workers for one machine, or drop --workers and let the step's tasks be "
            "the workers"
        )
    torch_workers = reads_torchrun and os.environ.get("WORLD_SIZE", "1") not in ("", "1")
    found = None if launching_workers or torch_workers else cluster_in_environment()
    if launching_workers or torch_workers or found:
        if not node_gpu_count() and machine.amd_gpus()[0]:
            raise UserError(
                "multi-worker runs on AMD GPUs are not built yet (GPUs are handed out by "
                "CUDA_VISIBLE_DEVICES and NVML here): run one worker per node, without "
                "--workers, srun or TF_CONFIG"
            )
        torch_variables = {"RANK", "WORLD_SIZE"} & set(os.environ)  # torchrun's, read there
        if reads_tf_config and found == "TF_CONFIG":
            check_hosts_resolve(parse_tf_config(os.environ["TF_CONFIG"])["cluster"], found)
        elif found == "Slurm" and not (reads_torchrun and torch_variables):
            check_hosts_resolve({"worker": slurm_cluster().addresses}, found)
        return ["training.strategy=multi_worker"]
    return []


def _nvml_gpu_count() -> int | None:
    """NVIDIA GPUs this process can open by NVML (nvidia-ml-py), or None when NVML cannot be
    used. A task that a cgroup keeps to some of the node's GPUs sees the others listed but
    gets NVML's NoPermission for them: they are not counted."""
    try:
        import pynvml  # provided by nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        return sum(_nvml_opens(pynvml, index) for index in range(pynvml.nvmlDeviceGetCount()))
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def _nvml_opens(pynvml, index: int) -> bool:
    try:
        pynvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError:
        return False
    return True


def gpus_on_node(environ: Mapping[str, str] | None = None) -> int:
    """The GPUs of this node for this process: Slurm's count where Slurm gives one
    (SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS: `slurm.slurm_node_gpus`), else `node_gpu_count`."""
    environ = os.environ if environ is None else environ
    from_slurm = slurm.slurm_node_gpus(environ)
    return node_gpu_count() if from_slurm is None else from_slurm


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
    return cluster_devices.cuda_visible_entries(listed)


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


def slurm_cluster(
    environ: Mapping[str, str] | None = None,
    node_gpus: int | None = None,
    listening: int | None = None,
) -> SlurmCluster:
    """This Slurm task's cluster, GPUs and CPUs, checked; `node_gpus` is the node's GPU count
    (looked up when None); `listening` how many of a node's tasks listen on a port (None:
    all)."""
    environ = os.environ if environ is None else environ
    node_gpus = gpus_on_node(environ) if node_gpus is None else node_gpus
    visible = visible_gpus(environ, node_gpus)
    return SlurmCluster.from_environment(environ, visible, node_gpus, listening)


def slurm_gpu_variables(
    environ: Mapping[str, str], task: SlurmCluster, visible: list[str]
) -> dict[str, str]:
    """The variables that keep a Slurm task to its GPUs (`task.gpus`, cut from `visible`, the
    CUDA_VISIBLE_DEVICES entries it sees). None where it computes on all it sees: alone on its
    node, or bound by Slurm (--gpus-per-task, --gpu-bind), whose CUDA_VISIBLE_DEVICES is this
    task's already. For its slice of GPUs its node's tasks share: the slice's positions in
    CUDA's list as WORKER_GPUS, CUDA_VISIBLE_DEVICES left as Slurm set it (every task sees
    every GPU, as with `--workers N`); or the slice as CUDA_VISIBLE_DEVICES with
    HPCAI500_GPU_PLACEMENT=cuda_visible_devices, the default for MIG instances. A share set
    already, other than this task's, is refused: Slurm hands out the GPUs here."""
    placement = cluster_devices.gpu_placement(environ, visible, "task")
    variables = {}
    if task.gpus and tuple(visible) != task.gpus:  # a slice (slurm.gpu_share), by local index
        if placement == "cuda_visible_devices":
            variables["CUDA_VISIBLE_DEVICES"] = ",".join(task.gpus)
        else:
            start = task.local_index * len(task.gpus)
            positions = range(start, start + len(task.gpus))
            variables[WORKER_GPUS] = ",".join(map(str, positions))
    share = environ.get(WORKER_GPUS)
    if share is not None and share != variables.get(WORKER_GPUS):
        raise UserError(
            f"{WORKER_GPUS}={share!r} is set under srun, where Slurm hands out the GPUs: "
            "unset it (it is `--workers N`'s share of a node's GPUs for one worker)"
        )
    return variables


def check_hosts_resolve(cluster_spec: dict, found: str) -> None:
    """Refuse a cluster (a ClusterSpec's `as_dict()`) one of whose hosts does not resolve, in
    one line naming it, before any worker waits for it (`slurm.check_hosts_resolve`)."""
    addresses = [
        address
        for job in cluster_spec.values()
        for address in (job.values() if isinstance(job, dict) else job)
    ]
    hosts = [address.rpartition(":")[0].strip("[]") for address in addresses]
    where = "the Slurm step's node list" if found == "Slurm" else found
    slurm.check_hosts_resolve(hosts, where)


def cluster_plan(environ: Mapping[str, str] | None = None, node_gpus: int | None = None) -> dict:
    """The cluster this process would join, found as `cluster_resolver` finds it, without
    TensorFlow and without waiting: every worker's address, this one's index, host, GPUs,
    CPUs, port and the collective `communication.collective=auto` would run."""
    environ = os.environ if environ is None else environ
    node_gpus = gpus_on_node(environ) if node_gpus is None else node_gpus
    if under_slurm(environ) and not environ.get("TF_CONFIG"):
        plan = {"found": "Slurm", **slurm_cluster(environ, node_gpus).to_json()}
    else:
        plan = dict.fromkeys(SlurmCluster.json_keys())
        plan |= {
            "found": SINGLE_WORKER,
            "workers": [],
            "index": 0,
            "host": socket.gethostname(),
            "gpus": visible_gpus(environ, node_gpus),
            "cpus": len(os.sched_getaffinity(0)),
            "cpus_from": "this process's CPU affinity",
            "ports": {"source": None, "this_task": "none: a single worker opens no port"},
        }
    if environ.get("TF_CONFIG"):
        config = parse_tf_config(environ["TF_CONFIG"])
        chiefs, workers = config["cluster"].get("chief", []), config["cluster"].get("worker", [])
        kind, number = config["task"]["type"], config["task"]["index"]
        address = own_address(config)
        plan |= {
            "found": "TF_CONFIG",
            "workers": [*chiefs, *workers],
            "index": number + (len(chiefs) if kind == "worker" else 0),  # chief first
            "address": address,
            "host": address.rpartition(":")[0],
            "ports": {"source": "TF_CONFIG", "this_task": f"TF_CONFIG's {kind} {number}"},
        }
    plan["collective"] = resolve_collective("auto", plan["gpus"])
    address = plan["address"]
    plan["port_free"] = None if address is None else port_free(int(address.rpartition(":")[2]))
    return plan


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
