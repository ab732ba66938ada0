"""Several PyTorch workers through torch.distributed and DistributedDataParallel.

Who the workers are comes from the environment of whatever started them:
- `torchrun` (and the project's own launcher, `--workers N`, cluster/local_workers.py
  `torch_environments`): RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT;
- Slurm's `srun`: the step read as the TensorFlow side reads it (cluster/workers.py
  `slurm_cluster`: SLURM_PROCID, SLURM_STEP_NUM_TASKS, never the job's SLURM_NTASKS,
  SLURM_LOCALID, the node list and tasks per node, each task's GPUs from Slurm's), rank 0 on
  the first host of the step's node list (Slurm's default block distribution), and a port
  every task works out alone: MASTER_PORT, else the TensorFlow side's Slurm port plan
  (hpcai500_tf/cluster/slurm.py `port_plan`: HPCAI500_SLURM_PORT_BASE, srun --resv-ports, else
  from SLURM_JOB_ID). A task with several GPUs is refused (a worker trains on one);
- neither: one worker, and nothing here talks to anyone.

Gradients are averaged by DistributedDataParallel (NCCL on GPUs, gloo on the CPU), each
worker reading its own shard of the data (pytorch/feeder.py, `shard`). torch only, imported
by the caller (`build.import_torch`); no TensorFlow here.

    workers = workers_from_environment()
    device = init_process_group(torch, workers, device, timeout_s=300)
    model = wrap_model(torch, model, workers, device)
    ...
    shutdown(torch)
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from hpcai500_tf.cluster import slurm
from hpcai500_tf.cluster.devices import WORKER_GPUS
from hpcai500_tf.errors import UserError

TORCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

# What gloo and NCCL say when a peer died or stopped answering (torch 2.3 to 2.13): gloo's
# "Read error ...: Connection reset by peer", "Connection closed by peer", "Timed out waiting
# Nms for recv operation to complete", a broken pipe on send; NCCL's remote errors and aborted
# communicators. NCCL's watchdog usually ends the process itself on a timeout (SIGABRT, with
# TORCH_NCCL_ASYNC_ERROR_HANDLING's default), which no exception handler sees.
_PEER_LOST = re.compile(
    r"connection (closed|reset) by peer|broken pipe|timed out|collective operation timeout|"
    r"remote process exited|network error|ncclRemoteError|communicator was aborted",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Workers:
    """This process among the run's workers. `master_addr:master_port` is where rank 0 waits
    for the others (unused for one worker)."""

    world_size: int
    rank: int
    local_rank: int  # among the workers of this node: which GPU it takes when it sees several
    master_addr: str
    master_port: int
    # "single", "torchrun", "slurm", "launcher" (--workers N), or "environment" (RANK and the
    # others set by hand or by another launcher)
    source: str

    @property
    def several(self) -> bool:
        return self.world_size > 1

    @property
    def chief(self) -> bool:
        """Rank 0: the worker that prints and writes the record."""
        return self.rank == 0


SINGLE = Workers(1, 0, 0, "127.0.0.1", 0, "single")


def workers_from_environment(env: Mapping[str, str] = os.environ) -> Workers:
    """The workers as torchrun, the launcher or Slurm describe them; one worker when none
    does. A value that is missing or malformed is refused in one line naming the variable."""
    if "RANK" in env or "WORLD_SIZE" in env:
        return _from_torch_variables(env)
    if "SLURM_PROCID" in env:
        return _from_slurm(env)
    return SINGLE


def _from_torch_variables(env: Mapping[str, str]) -> Workers:
    if env.get("HPCAI500_LAUNCHER") == "1":
        source, fix = "launcher", "the launcher sets it; do not override it"
    elif env.get("TORCHELASTIC_RUN_ID"):
        source, fix = "torchrun", "torchrun sets it; do not override it"
    else:
        source, fix = "environment", "set it, or start the workers with torchrun"
    for name in TORCH_VARIABLES:
        if not env.get(name, "").strip():
            raise UserError(
                f"{name} is not set but {'RANK' if 'RANK' in env else 'WORLD_SIZE'} is: "
                "several PyTorch workers need RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and "
                f"MASTER_PORT ({fix})"
            )
    world = _whole(env, "WORLD_SIZE", fix)
    rank = _whole(env, "RANK", fix)
    local = _whole(env, "LOCAL_RANK", fix)
    _check_rank(rank, "RANK", world, "WORLD_SIZE")
    return Workers(world, rank, local, env["MASTER_ADDR"].strip(), _port(env, fix), source)


def _from_slurm(env: Mapping[str, str]) -> Workers:
    """A Slurm task's place among the step's workers, read as the TensorFlow side reads it
    (cluster/workers.py `slurm_cluster`: the step's own task count, node list and tasks per node,
    bounded and checked, this task's GPUs from Slurm's), before anything waits."""
    fix = "run the tasks with srun, which sets it"
    world = slurm.step_tasks(env)  # SLURM_STEP_NUM_TASKS; a batch script's job is refused
    if world == 1:  # one task (as cluster/workers.py `under_slurm` counts it): nothing to join
        return SINGLE
    if not env.get("SLURM_LOCALID"):
        raise UserError(f"SLURM_LOCALID is not set: {fix}")
    from hpcai500_tf.cluster import workers as cluster_workers  # no framework there

    task = cluster_workers.slurm_cluster(env, listening=1)  # rank 0's store: one port
    if len(task.gpus) > 1:  # the devices this worker takes: one (init_process_group)
        raise UserError(
            f"this Slurm task has {len(task.gpus)} GPUs ({task.gpu_layout}) but a PyTorch "
            "worker trains on one, which would leave the others idle: start one task per GPU "
            f"(srun --ntasks-per-node={task.tasks_on_node * len(task.gpus)}, or TASK_PER=gpu "
            "with tools/slurm_train.sbatch)"
        )
    if env.get("MASTER_ADDR", "").strip():
        address = env["MASTER_ADDR"].strip()
    else:
        address = task.addresses[0].rpartition(":")[0]  # task 0's node, by block or cyclic
    if env.get("MASTER_PORT", "").strip():
        port = _port(env, "set it to a free port, or unset it")
    else:
        port = task.ports.ports[0]  # local task 0's port of the TensorFlow side's plan
    return Workers(world, task.index, task.local_index, address, port, "slurm")


def _whole(env: Mapping[str, str], name: str, fix: str) -> int:
    return slurm.whole_number(env[name], name, 0, slurm.MAX_TASKS, fix)


def _check_rank(rank: int, rank_var: str, world: int, world_var: str) -> None:
    if world < 1:
        raise UserError(f"{world_var}={world} must be at least 1")
    if rank >= world:
        raise UserError(
            f"{rank_var}={rank} is out of range for {world_var}={world} (0 to {world - 1})"
        )


def _port(env: Mapping[str, str], fix: str) -> int:
    text = env["MASTER_PORT"].strip()
    if re.fullmatch("[0-9]{1,5}", text) is None or not 1 <= int(text) <= 65535:
        raise UserError(f"MASTER_PORT={slurm.shown(text)} is not a port from 1 to 65535: {fix}")
    return int(text)


def _first_line(error: BaseException) -> str:
    """An exception's first line without torch's `[file.cpp:N] ` prefix, at most 300 characters."""
    lines = str(error).strip().splitlines() or [error.__class__.__name__]
    return re.sub(r"^\[[^\]]*:\d+\]\s*", "", lines[0])[:300]


def mark_computing_gpu(environ, torch, device) -> None:
    """Name the one GPU this process computes on as its share (HPCAI500_WORKER_GPUS: its
    position in CUDA's list, torch's device index), so that L1 and the energy count it alone,
    as they count a TensorFlow worker's share: a task that sees all of its node's GPUs
    (srun --gpu-bind=none, --workers N) computes on one of them. Nothing on the CPU."""
    if device.type != "cuda":
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    environ[WORKER_GPUS] = str(index)


def init_process_group(torch, workers: Workers, device, timeout_s: float):
    """Join the other workers (NCCL on CUDA, gloo on the CPU) and return the device this worker
    computes on: on a node where it sees several GPUs, GPU `local_rank`, made current. For one
    worker, nothing and `device` unchanged. `timeout_s` bounds the rendezvous and every
    collective afterwards; not reaching the others within it is one line."""
    if not workers.several:
        return device
    dist = torch.distributed
    if not dist.is_available():
        raise UserError(f"this torch ({torch.__version__}) was built without torch.distributed")
    if device.type == "cuda":
        backend = "nccl"
        if not dist.is_nccl_available():
            raise UserError(f"this torch ({torch.__version__}) has no NCCL for several GPU workers")
        count = torch.cuda.device_count()
        if count > 1 and workers.local_rank >= count:
            raise UserError(
                f"worker {workers.rank} is local worker {workers.local_rank} but sees only "
                f"{count} GPUs: start at most {count} workers per node, or give each its own GPU"
            )
        device = torch.device("cuda", workers.local_rank if count > 1 else (device.index or 0))
        torch.cuda.set_device(device)
    else:
        backend = "gloo"
    where = f"{workers.master_addr}:{workers.master_port}"
    # c10d would retry a name that does not resolve past its timeout, warning at each try
    slurm.check_hosts_resolve([workers.master_addr], f"this {workers.source} run (rank 0's)")
    try:
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{where}",
            rank=workers.rank,
            world_size=workers.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    except (RuntimeError, OSError) as error:  # torch's DistError is a RuntimeError
        text = _first_line(error)
        if workers.rank == 0 and re.search(r"EADDRINUSE|address already in use", str(error)):
            raise UserError(
                f"worker 0 could not wait for the others on {where}: the port is in use "
                "(set MASTER_PORT to a free port)"
            ) from None
        raise UserError(
            f"worker {workers.rank} could not reach the others at {where} within "
            f"{timeout_s:g}s: {text}"
        ) from None
    return device


def wrap_model(torch, model, workers: Workers, device):
    """`model` in DistributedDataParallel (its gradients averaged over the workers in the
    backward pass, its parameters broadcast from rank 0 here, the first collective); for one
    worker, `model` unchanged.

    Buffers (batch-norm running statistics) are not broadcast at each forward
    (broadcast_buffers=False): each worker keeps its own, from its own shard, and
    `average_buffers` makes them the mean over the workers before an evaluation or a
    checkpoint, as a Keras batch norm's moving statistics are the mean over its replicas
    under a tf.distribute strategy. It also keeps the forward pass free of collectives, so
    workers whose evaluation shards differ in batch count cannot wait on each other there."""
    if not workers.several:
        return model
    return torch.nn.parallel.DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        broadcast_buffers=False,
    )


def average_buffers(torch, workers: Workers, model) -> None:
    """Make every floating-point buffer of `model` (or of the module DDP wraps) the mean over
    the workers, in place; integer buffers (batch norm's batch count) are the same everywhere
    and left alone. One all-reduce per dtype; nothing for one worker."""
    if not workers.several:
        return
    module = getattr(model, "module", model)
    by_dtype: dict = {}
    for buffer in module.buffers():
        if buffer.is_floating_point():
            by_dtype.setdefault((buffer.dtype, buffer.device), []).append(buffer)
    with torch.no_grad():
        for buffers in by_dtype.values():
            flat = torch.cat([b.reshape(-1) for b in buffers])
            torch.distributed.all_reduce(flat)
            flat /= workers.world_size
            offset = 0
            for b in buffers:
                b.copy_(flat[offset : offset + b.numel()].view_as(b))
                offset += b.numel()


def _collective_device(torch):
    """Where a collective's tensors live: the current GPU for NCCL, the CPU for gloo."""
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_gather(torch, workers: Workers, tensor) -> list:
    parts = [torch.empty_like(tensor) for _ in range(workers.world_size)]
    torch.distributed.all_gather(parts, tensor)
    return parts


def all_gather_rows(torch, workers: Workers, row: list[float]) -> list[list[float]]:
    """Every worker's `row` (floats, the same length on every worker), by rank, as float64."""
    if not workers.several:
        return [[float(x) for x in row]]
    tensor = torch.tensor(row, dtype=torch.float64, device=_collective_device(torch))
    return [part.cpu().tolist() for part in _all_gather(torch, workers, tensor)]


def all_gather_tensors(torch, workers: Workers, tensor) -> list:
    """Every worker's `tensor`, by rank, on the CPU: the same dtype and trailing shape on
    every worker, the first dimension its own (each is padded to the longest for the
    all-gather, then cut back)."""
    if not workers.several:
        return [tensor.cpu()]
    sizes = [int(row[0]) for row in all_gather_rows(torch, workers, [len(tensor)])]
    padded = torch.zeros(
        (max(sizes), *tensor.shape[1:]), dtype=tensor.dtype, device=_collective_device(torch)
    )
    padded[: len(tensor)] = tensor
    parts = _all_gather(torch, workers, padded)
    return [part[:size].cpu() for part, size in zip(parts, sizes, strict=True)]


def same_on_all_workers(torch, workers: Workers, text: str) -> bool:
    """Whether every worker passed the same `text` (a config's fingerprint, say), by its
    SHA-256; every worker gets the same answer."""
    if not workers.several:
        return True
    digest = hashlib.sha256(text.encode()).digest()
    words = [int.from_bytes(digest[i : i + 8], "little", signed=True) for i in range(0, 32, 8)]
    tensor = torch.tensor(words, dtype=torch.int64, device=_collective_device(torch))
    parts = _all_gather(torch, workers, tensor)
    return all(torch.equal(part, parts[0]) for part in parts)


def barrier(torch, workers: Workers) -> None:
    """Wait until every worker is here; nothing for one worker."""
    if not workers.several:
        return
    if torch.distributed.get_backend() == "nccl":
        torch.distributed.barrier(device_ids=[torch.cuda.current_device()])
    else:
        torch.distributed.barrier()


def shutdown(torch) -> None:
    """Leave the process group, where this process joined one."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def peer_lost(error: BaseException) -> bool:
    """Whether `error` is what torch.distributed raises when another worker died or stopped
    answering, so that this one should end as a run stopped by its peers rather than as a
    bug: torch's network and store errors (DistNetworkError, DistStoreError: the rendezvous
    store or its socket gone), and a backend error or RuntimeError whose message is a lost
    connection or a timeout (gloo raises plain RuntimeErrors for both, NCCL DistBackendErrors).
    Judged by class names and messages, so it needs no torch to answer, and an error it does
    not know says False. A NCCL timeout usually aborts the process instead (see _PEER_LOST)."""
    names = {cls.__name__ for cls in type(error).__mro__}
    if names & {"DistNetworkError", "DistStoreError"}:
        return True
    if not isinstance(error, RuntimeError):
        return False
    return bool(_PEER_LOST.search(str(error)))
