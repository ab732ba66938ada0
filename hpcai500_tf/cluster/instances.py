"""`train BENCHMARK --instances M`: how M independent training instances share an allocation.

Locally, `--workers N` (default M) is the whole machine's worker count, split into M
instances of N/M workers each: each instance is its own run (its own TF_CONFIG and ports
under `--workers`, or one process), with its share of this machine's GPUs (as
CUDA_VISIBLE_DEVICES) and of its cores (as thread counts). Under srun, the step's tasks are
split by node into M groups of whole nodes, and each task is given the environment of its
group alone (node list, task counts, its index in the group), so that every instance forms
its own cluster and no collective ever spans two instances. Everything here is checked, in
one line, before any instance starts. Pure Python: no TensorFlow, no processes.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass

from hpcai500_tf.cluster import slurm
from hpcai500_tf.errors import UserError

MAX_INSTANCES = 1024
THREAD_VARIABLES = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")
# The Slurm variables that describe a step: each task of an instance gets its group's.
STEP_NODES, STEP_COUNTS, STEP_TASKS = (
    "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NUM_TASKS",
)  # fmt: skip


@dataclass(frozen=True)
class LocalPlan:
    """M instances on this machine: each one's worker count and environment additions."""

    instances: int
    workers_per_instance: int
    environments: tuple[dict[str, str], ...]  # what each instance adds to this environment
    gpus: tuple[str, ...]  # every GPU split between the instances (CUDA_VISIBLE_DEVICES entries)


def check_count(instances: int, workers: int | None) -> int:
    """The workers each instance gets: `workers` (default one per instance) split evenly into
    `instances`; one line where that cannot be."""
    if not 1 <= instances <= MAX_INSTANCES:
        raise UserError(f"--instances must be in [1, {MAX_INSTANCES}], got {instances}")
    total = instances if workers is None else workers
    if total < 1:
        raise UserError(f"--workers must be at least 1, got {total}")
    if instances > total:
        raise UserError(
            f"--instances {instances} is more than the {total} worker(s) of --workers {total}: "
            "each instance needs at least one worker"
        )
    if total % instances:
        fits = ", ".join(str(instances * n) for n in (1, 2, 3))
        raise UserError(
            f"--instances {instances} does not divide --workers {total}: every instance gets "
            f"the same share; use --workers {fits} ..."
        )
    return total // instances


def local_plan(
    instances: int,
    workers: int | None,
    gpus: list[str],
    environ: Mapping[str, str],
    cpus: int | None = None,
) -> LocalPlan:
    """M instances here: `gpus` (the CUDA_VISIBLE_DEVICES entries CUDA makes visible) in M
    contiguous shares, and the cores' threads split over every worker of every instance
    (a thread count the user set is kept)."""
    per_instance = check_count(instances, workers)
    if gpus and len(gpus) % instances:
        raise UserError(
            f"--instances {instances} does not divide this machine's {len(gpus)} GPU(s): "
            "every instance gets the same share of them"
        )
    usable = cpus or len(os.sched_getaffinity(0))
    threads = str(max(1, usable // (instances * per_instance)))
    shares = {name: threads for name in THREAD_VARIABLES if name not in environ}
    each = len(gpus) // instances
    environments = []
    for index in range(instances):
        env = dict(shares)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[index * each : (index + 1) * each])
        environments.append(env)
    return LocalPlan(instances, per_instance, tuple(environments), tuple(gpus))


@dataclass(frozen=True)
class SlurmGroup:
    """This task's instance under srun: which one, and the step variables of its group."""

    instance: int
    instances: int
    index_in_group: int  # the task's index in its instance (0: the instance's chief)
    tasks_per_instance: int
    nodes: tuple[str, ...]  # the group's nodes
    environment: dict[str, str]  # what this task's instance sees instead of the whole step

    @property
    def chief(self) -> bool:
        return self.index_in_group == 0


def slurm_group(instances: int, environ: Mapping[str, str]) -> SlurmGroup:
    """This Slurm task's instance: the step's nodes split, in Slurm's order, into `instances`
    groups of whole nodes, each node with the same task count; one line where the step's
    layout cannot be split so."""
    if not 1 <= instances <= MAX_INSTANCES:
        raise UserError(f"--instances must be in [1, {MAX_INSTANCES}], got {instances}")
    total = slurm.step_tasks(environ)
    if STEP_NODES not in environ or STEP_COUNTS not in environ:
        raise UserError(
            f"{STEP_NODES} and {STEP_COUNTS} are not set: start the tasks of --instances "
            "with one srun, which sets them"
        )
    nodes = slurm.expand_nodelist(environ[STEP_NODES], STEP_NODES)
    counts = slurm.expand_tasks_per_node(environ[STEP_COUNTS], len(nodes), STEP_COUNTS)
    if instances > total:
        raise UserError(
            f"--instances {instances} is more than the Slurm step's {total} task(s): each "
            "instance needs at least one"
        )
    if len(nodes) % instances:
        raise UserError(
            f"--instances {instances} does not match the Slurm step: its {len(nodes)} node(s) "
            f"({environ[STEP_NODES]}) cannot be split into {instances} groups of whole nodes; "
            f"use srun -N {instances * max(1, len(nodes) // instances)} or another --instances"
        )
    if len(set(counts)) > 1:
        raise UserError(
            f"--instances {instances} does not match the Slurm step: its nodes run different "
            f"task counts ({STEP_COUNTS}={environ[STEP_COUNTS]}); every instance needs the "
            "same share (srun --ntasks-per-node)"
        )
    index = int(environ["SLURM_PROCID"])
    per_node, per_group = counts[0], len(nodes) // instances
    tasks_per_instance = per_node * per_group
    instance, index_in_group = divmod(index, tasks_per_instance)
    own = nodes[instance * per_group : (instance + 1) * per_group]
    environment = {
        STEP_NODES: slurm_nodelist(own),
        STEP_COUNTS: f"{per_node}(x{per_group})" if per_group > 1 else str(per_node),
        STEP_TASKS: str(tasks_per_instance),
        "SLURM_PROCID": str(index_in_group),
        "SLURM_NNODES": str(per_group),
        "SLURM_STEP_NUM_NODES": str(per_group),
    }
    return SlurmGroup(
        instance, instances, index_in_group, tasks_per_instance, tuple(own), environment
    )


def slurm_nodelist(nodes: list[str] | tuple[str, ...]) -> str:
    """A node list Slurm (and `slurm.expand_nodelist`) reads: the names, comma-separated."""
    return ",".join(nodes)


# PyTorch's rendezvous for the whole step, as a batch script may export it: each instance's is
# its group's, made from the group's step variables (its first task's node and port).
# (TF_CONFIG with --instances is refused before this.)
WHOLE_STEP_CLUSTER = ("MASTER_ADDR", "MASTER_PORT")


def apply_group(environ: dict[str, str], group: SlurmGroup) -> dict[str, str]:
    """`environ` as this task's instance sees it: its group's step variables, without a
    cluster named for the whole step (`WHOLE_STEP_CLUSTER`: every instance would join the one
    it names); without the step variables where the instance is one task (it then runs as a
    single worker)."""
    seen = {k: v for k, v in environ.items() if k not in WHOLE_STEP_CLUSTER}
    seen.update(group.environment)
    if group.tasks_per_instance == 1:  # one task alone: a single worker, not a Slurm cluster
        for name in ("SLURM_PROCID", STEP_TASKS):
            seen.pop(name, None)
    return seen


def seeds(base: int, instances: int) -> list[int]:
    """Each instance's seed: the config's, then the next ones (independent models)."""
    return list(itertools.islice(itertools.count(base), instances))
