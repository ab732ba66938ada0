"""The environments of N workers started on this machine (`train --workers N`): each
worker's share of the cores as thread counts, of the GPUs, and what its framework reads to
find its peers (TensorFlow: TF_CONFIG on loopback ports; PyTorch: torch.distributed's
variables). The launcher (run/launch.py) starts them; backends.py says which a framework uses.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping

from hpcai500_tf.cluster import workers as cluster_workers
from hpcai500_tf.cluster.devices import WORKER_GPUS, gpu_placement, worker_gpu_positions
from hpcai500_tf.errors import UserError

MAX_WORKERS = 128
THREAD_VARIABLES = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on loopback now (held open together, then released)."""
    sockets = []
    try:
        for _ in range(count):
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            probe.bind(("127.0.0.1", 0))
            sockets.append(probe)
        return [probe.getsockname()[1] for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


def tf_configs(ports: list[int]) -> list[str]:
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    return [
        json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        for index in range(len(ports))
    ]


def _gpu_split_error(workers: int, count: int, base_env: Mapping[str, str]) -> str:
    """The one line refusing a worker count that does not divide the `count` GPUs, with the
    counts that do."""
    plural = "s" if count > 1 else ""
    if WORKER_GPUS in base_env:
        where = f"the {count} GPU{plural} of {WORKER_GPUS}"
    elif "CUDA_VISIBLE_DEVICES" in base_env:
        where = f"the {count} GPU{plural} of CUDA_VISIBLE_DEVICES"
    else:
        where = f"this node's {count} GPU{plural}"
    fits = [str(n) for n in range(2, min(count, MAX_WORKERS) + 1) if count % n == 0]
    refusal = f"--workers {workers} does not divide {where}"
    if not fits:
        return f"{refusal}: leave out --workers to run one worker"
    choices = fits[0] if len(fits) == 1 else f"{', '.join(fits[:-1])} or {fits[-1]}"
    return f"{refusal}: use --workers {choices}, or leave it out for one worker"


def worker_environments(
    workers: int, gpus: list[str], base_env: Mapping[str, str], cpus: int | None = None
) -> list[dict[str, str]]:
    """Each local worker's environment: `base_env`, its share of the `cpus` cores as thread
    counts (variables already set are kept), and on a GPU node its contiguous share of `gpus`
    (the CUDA_VISIBLE_DEVICES entries CUDA makes visible here, or those of a share already in
    WORKER_GPUS), so the workers do not all take every GPU: as positions in WORKER_GPUS, the
    list CUDA sees left whole, or with GPU_PLACEMENT=cuda_visible_devices (the default for
    MIG instances) as its own CUDA_VISIBLE_DEVICES. A worker count that does not divide the
    GPUs is refused: the workers would get unequal shares, and the strategy needs the same
    replicas on every worker."""
    placement = gpu_placement(base_env, gpus)
    positions = list(range(len(gpus)))
    if gpus and base_env.get(WORKER_GPUS) is not None:  # a share already: it is split
        positions, problem = worker_gpu_positions(base_env[WORKER_GPUS], len(gpus))
        if positions is None:
            raise UserError(problem)
    if positions and len(positions) % workers:
        raise UserError(_gpu_split_error(workers, len(positions), base_env))
    usable = cpus or len(os.sched_getaffinity(0))  # the cores this process may run on
    threads = str(max(1, usable // workers))
    shares = {name: base_env.get(name, threads) for name in THREAD_VARIABLES}
    per_worker = len(positions) // workers
    environments = []
    for index in range(workers):
        env = {**base_env, **shares}
        env.pop(WORKER_GPUS, None)
        own = positions[index * per_worker : (index + 1) * per_worker]
        if own and placement == "cuda_visible_devices":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[position] for position in own)
        elif own:
            env[WORKER_GPUS] = ",".join(map(str, own))
        environments.append(env)
    return environments


def torch_environments(
    workers: int, port: int, base_env: Mapping[str, str], cpus: int | None = None
) -> list[dict[str, str]]:
    """Each local PyTorch worker's environment (`--framework pytorch --workers N`): what
    torch.distributed reads (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, rank 0 waiting on
    127.0.0.1:`port`), HPCAI500_LAUNCHER=1 (pytorch/distributed.py names the launcher as the
    source), and its share of the `cpus` cores as thread counts, as `worker_environments`
    gives TensorFlow workers (torch obeys OMP_NUM_THREADS). GPUs are not split here: each
    worker sees those CUDA makes visible and takes GPU LOCAL_RANK itself. A torchrun agent's
    variables are left out, which would make rank 0 a client of a store that is not there."""
    environments = []
    for rank, env in enumerate(worker_environments(workers, [], base_env, cpus)):
        env = {k: v for k, v in env.items() if not k.startswith("TORCHELASTIC_")}
        env.update(
            RANK=str(rank), WORLD_SIZE=str(workers), LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(workers), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
            HPCAI500_LAUNCHER="1",
        )  # fmt: skip
        environments.append(env)
    return environments


def tensorflow_workers(
    collective: str, workers: int, environ: Mapping[str, str]
) -> tuple[list[dict[str, str]], list[int], list[str]]:
    """(environments, ports, GPUs shared out) of `workers` TensorFlow workers: each its
    TF_CONFIG on a port of its own and its share of the GPUs; refused here, before a run
    directory or a worker exists, when the GPUs cannot be split or `collective`
    (communication.collective) cannot run on them."""
    gpus = cluster_workers.visible_gpus()
    environments = worker_environments(workers, gpus, environ)
    cluster_workers.resolve_collective(collective, gpus)
    ports = free_ports(workers)
    for env, tf_config in zip(environments, tf_configs(ports), strict=True):
        env["TF_CONFIG"] = tf_config
    return environments, ports, gpus


def pytorch_workers(
    workers: int, environ: Mapping[str, str]
) -> tuple[list[dict[str, str]], list[int], list[str]]:
    """(environments, the one port rank 0 waits on, no GPUs shared out) of `workers` PyTorch
    workers: each takes GPU LOCAL_RANK itself, so there may be no more than the GPUs seen."""
    seen = cluster_workers.visible_gpus()
    if seen and workers > len(seen):  # each PyTorch worker takes GPU LOCAL_RANK itself
        raise UserError(
            f"--workers {workers}: this machine shows {len(seen)} GPU(s) and each PyTorch "
            f"worker computes on one of its own: start at most {len(seen)}"
        )
    ports = free_ports(1)
    return torch_environments(workers, ports[0], environ), ports, []
