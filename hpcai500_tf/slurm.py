"""The cluster of a Slurm step, read from Slurm's environment in Slurm's own order.

TensorFlow's SlurmClusterResolver sorts host names as strings (gpu10 before gpu8) while a
task's index is SLURM_PROCID in the node list's own order, so its workers disagree on who is
who. Here the node list is expanded as Slurm writes it, tasks are laid out as Slurm's default
block distribution places them, and whatever Slurm says about this task (SLURMD_NODENAME,
SLURM_LOCALID) is checked against that layout, in one line, before anything waits. This
task's GPUs, CPUs and port are worked out here too. No TensorFlow here.
"""

from __future__ import annotations

import itertools
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from hpcai500_tf.errors import UserError

# Ports from SLURM_JOB_ID: PORT_FIRST + (job_id % PORT_SLOTS) * PORT_STRIDE + SLURM_LOCALID.
# Two jobs sharing a node take different slots unless their ids differ by a multiple of
# PORT_SLOTS, and up to PORT_STRIDE tasks per node stay inside their job's slot; the highest
# base port, 20000 + 767 * 16 = 32272, keeps 16 tasks below 32768, where Linux's ephemeral
# ports (outgoing connections) start.
PORT_FIRST = 20000
PORT_STRIDE = 16
PORT_SLOTS = 768

# The project's ImageNet pipeline decodes about 416 images/s per core at 224x224
# (benchmarks/input_pipeline.py); a GPU training a few thousand images/s needs several cores.
MIN_CPUS_PER_GPU = 4

_BLOCK_ADVICE = "run srun with the default block distribution (srun -m block)"
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_TASKS = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def expand_nodelist(text: str, variable: str = "SLURM_STEP_NODELIST") -> list[str]:
    """The host names of a Slurm host list (`gpu[08-11],m1`) in Slurm's order: items as
    written, ranges ascending with their zero padding, the first bracket varying slowest."""
    hosts: list[str] = []
    for item in _top_level_items(text, variable):
        pieces = re.split(r"(\[[^\]]*\])", item)  # literal, [group], literal, ...
        choices = [
            _expand_group(piece[1:-1], text, variable) if piece.startswith("[") else [piece]
            for piece in pieces
        ]
        hosts += ["".join(parts) for parts in itertools.product(*choices)]
    seen: set[str] = set()
    for host in hosts:
        if host in seen:
            raise _not_a_host_list(text, variable, f"it names {host} twice")
        seen.add(host)
    return hosts


def _top_level_items(text: str, variable: str) -> list[str]:
    """The comma-separated items of a host list, commas inside brackets kept; brackets
    checked to be balanced and unnested."""
    items, current, depth = [], "", 0
    for char in text.strip():
        if char == "[":
            if depth:
                raise _not_a_host_list(text, variable, "a '[' inside brackets")
            depth = 1
        elif char == "]":
            if not depth:
                raise _not_a_host_list(text, variable, "a ']' without its '['")
            depth = 0
        elif char == "," and not depth:
            items.append(current)
            current = ""
            continue
        current += char
    if depth:
        raise _not_a_host_list(text, variable, "a '[' is not closed")
    items.append(current)
    for item in items:
        if not item.strip() or item != item.strip():
            raise _not_a_host_list(text, variable, "an empty item or a space")
        if item.startswith("["):
            raise _not_a_host_list(text, variable, f"'{item}' has no host name before '['")
    return items


def _expand_group(body: str, text: str, variable: str) -> list[str]:
    """The numbers of one bracket group (`1,3,5-7`, `08-11`), each as wide as its start."""
    numbers: list[str] = []
    for part in body.split(","):
        match = _RANGE.fullmatch(part)
        if match is None:
            raise _not_a_host_list(text, variable, f"'[{body}]' is not numbers and ranges")
        first, last = match.group(1), match.group(2) or match.group(1)
        if int(last) < int(first):
            raise _not_a_host_list(text, variable, f"the range {part} ends before it starts")
        numbers += [f"{n:0{len(first)}d}" for n in range(int(first), int(last) + 1)]
    return numbers


def _not_a_host_list(text: str, variable: str, why: str) -> UserError:
    return UserError(
        f"{variable}={text!r} is not a Slurm host list ({why}): run the tasks with srun, "
        "which sets it, or correct it"
    )


def expand_tasks_per_node(
    text: str,
    nodes: int,
    variable: str = "SLURM_STEP_TASKS_PER_NODE",
    nodes_variable: str = "SLURM_STEP_NODELIST",
) -> list[int]:
    """Tasks on each node from Slurm's compressed form: `2(x3),1` -> [2, 2, 2, 1]; one count of
    at least 1 per node of the node list."""
    counts: list[int] = []
    for item in text.strip().split(","):
        match = _TASKS.fullmatch(item.strip())
        if match is None or int(match.group(1)) < 1 or int(match.group(2) or 1) < 1:
            raise UserError(
                f"{variable}={text!r} is not Slurm's tasks per node (counts of at least 1, "
                "as in 2(x3),1): run the tasks with srun, which sets it, or correct it"
            )
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    if len(counts) != nodes:
        raise UserError(
            f"{variable}={text!r} counts tasks on {len(counts)} node(s) but {nodes_variable} "
            f"names {nodes}: run the tasks with one srun, which sets both"
        )
    return counts


@dataclass(frozen=True)
class PortPlan:
    """Where the workers' ports come from: `ports[i]` is local task i's port on every node."""

    source: str  # the variable the ports come from
    setting: str  # its value
    ports: tuple[int, ...]

    def origin(self, local: int) -> str:
        """How local task `local`'s port was found, in words."""
        if self.source == "SLURM_STEP_RESV_PORTS":
            return f"{self.source}={self.setting}, Slurm's reserved ports: local task {local}"
        if self.source == "SLURM_JOB_ID":
            return (
                f"{self.source}={self.setting}: {PORT_FIRST} + ({self.setting} % {PORT_SLOTS})"
                f" * {PORT_STRIDE} + SLURM_LOCALID {local}"
            )
        return f"{self.source}={self.setting} + SLURM_LOCALID {local}"


def port_plan(environ: Mapping[str, str], tasks_on_node: int) -> PortPlan:
    """The ports of a node's `tasks_on_node` tasks: from HPCAI500_SLURM_PORT_BASE where the user
    sets it, else Slurm's reserved ports (SLURM_STEP_RESV_PORTS), else from SLURM_JOB_ID."""
    base_text = environ.get("HPCAI500_SLURM_PORT_BASE") or None
    reserved = environ.get("SLURM_STEP_RESV_PORTS")
    if base_text is None and reserved:
        ports = _reserved_ports(reserved)
        if len(ports) < tasks_on_node:
            raise UserError(
                f"SLURM_STEP_RESV_PORTS={reserved} reserves {len(ports)} port(s) but a node "
                f"runs {tasks_on_node} tasks: ask srun for --resv-ports={tasks_on_node}, or set "
                "HPCAI500_SLURM_PORT_BASE"
            )
        return PortPlan("SLURM_STEP_RESV_PORTS", reserved, tuple(ports[:tasks_on_node]))
    if base_text is not None:
        source, base = "HPCAI500_SLURM_PORT_BASE", _integer(environ, "HPCAI500_SLURM_PORT_BASE")
        setting = base_text
    else:
        source, setting = "SLURM_JOB_ID", _required(environ, "SLURM_JOB_ID")
        base = PORT_FIRST + (_integer(environ, "SLURM_JOB_ID") % PORT_SLOTS) * PORT_STRIDE
    if not 1024 <= base <= 65536 - tasks_on_node:
        raise UserError(
            f"{source}={setting} gives ports {base} to {base + tasks_on_node - 1}, outside "
            f"1024-65535: set HPCAI500_SLURM_PORT_BASE to a port from 1024 to "
            f"{65536 - tasks_on_node}"
        )
    return PortPlan(source, setting, tuple(range(base, base + tasks_on_node)))


def _reserved_ports(text: str) -> list[int]:
    """The ports of SLURM_STEP_RESV_PORTS (`12000-12007`, `12000,12002`), in order."""
    ports: list[int] = []
    for part in text.split(","):
        match = _RANGE.fullmatch(part.strip())
        if match is None or int(match.group(2) or match.group(1)) < int(match.group(1)):
            raise UserError(
                f"SLURM_STEP_RESV_PORTS={text!r} is not a list of ports and ranges: unset it "
                "or set HPCAI500_SLURM_PORT_BASE"
            )
        ports += range(int(match.group(1)), int(match.group(2) or match.group(1)) + 1)
    return ports


def port_free(port: int) -> bool:
    """Whether `port` can be bound on this host now (nothing listens on it)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.bind(("", port))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def check_port_free(address: str, origin: str | None = None, fix: str | None = None) -> None:
    """Refuse a worker whose own port is taken (on this host) before TensorFlow binds it; the
    message says where the port came from and what to change, where given."""
    port = address.rpartition(":")[2]
    if not port_free(int(port)):
        where = f" ({origin})" if origin else ""
        advice = f": {fix}" if fix else ""
        raise UserError(f"port {port} of this worker ({address}) is already in use{where}{advice}")


def gpu_share(
    environ: Mapping[str, str], visible: list[str], node_gpus: int, local: int, tasks_on_node: int
) -> tuple[list[str], str]:
    """(this task's GPUs, how they were chosen), from the GPUs it sees (`visible`, as
    CUDA_VISIBLE_DEVICES entries) and the node's GPU count: all of them where it is alone on the
    node or Slurm bound GPUs to it, else its slice of the node's GPUs, by SLURM_LOCALID."""
    if not visible:
        return [], "no GPU visible: CPU only"
    if tasks_on_node == 1:
        return list(visible), "the only task on its node: every visible GPU"
    if _bound_by_slurm(environ, visible, node_gpus, tasks_on_node):
        return list(visible), "bound to this task by Slurm: every visible GPU"
    fix = "run one task per node (srun --ntasks-per-node=1) or one per GPU (--gpus-per-task=1)"
    if len(visible) < tasks_on_node:
        raise UserError(
            f"{tasks_on_node} Slurm tasks on this node share its {len(visible)} visible GPUs, "
            f"unbound, so some task gets none: {fix}"
        )
    if len(visible) % tasks_on_node:
        raise UserError(
            f"{tasks_on_node} Slurm tasks on this node do not divide its {len(visible)} "
            f"visible GPUs evenly: {fix}"
        )
    size = len(visible) // tasks_on_node
    share = list(visible[local * size : (local + 1) * size])
    return share, f"slice {local} of the {len(visible)} GPUs its node's {tasks_on_node} tasks share"


def _bound_by_slurm(
    environ: Mapping[str, str], visible: list[str], node_gpus: int, tasks_on_node: int
) -> bool:
    """Whether Slurm gave this task GPUs of its own (--gpus-per-task, --ntasks-per-gpu,
    --gpu-bind): it then sees only those, fewer than the node has and no more than its tasks."""
    per_task = environ.get("SLURM_GPUS_PER_TASK", "").rpartition(":")[2]  # e.g. a100:1
    if per_task.isdigit() and 0 < len(visible) <= int(per_task):
        return True
    return len(visible) < node_gpus and len(visible) <= tasks_on_node


def cpu_warning(cpus: int, gpus: int, origin: str) -> str | None:
    """A note where a GPU task has fewer CPUs than its input pipeline needs; refused outright
    where it has one (one core decodes far fewer images than one GPU trains on)."""
    if not gpus or cpus >= MIN_CPUS_PER_GPU * gpus:
        return None
    wanted = MIN_CPUS_PER_GPU * gpus
    if cpus <= 1:
        raise UserError(
            f"Slurm gave this task {cpus} CPU ({origin}) for {gpus} GPU(s): its input "
            f"pipeline cannot feed them (about 416 images/s per core); ask for "
            f"--cpus-per-task={wanted}"
        )
    return (
        f"Slurm gave this task {cpus} CPUs ({origin}) for {gpus} GPU(s), fewer than "
        f"{MIN_CPUS_PER_GPU} per GPU: the input pipeline (about 416 images/s per core) may "
        f"starve the GPUs; ask for --cpus-per-task={wanted}"
    )


@dataclass(frozen=True)
class SlurmCluster:
    """This Slurm task and the step's workers, as Slurm laid them out."""

    addresses: tuple[str, ...]  # host:port of every task, by SLURM_PROCID
    index: int  # SLURM_PROCID
    host: str
    local_index: int  # SLURM_LOCALID
    tasks_on_node: int
    job_id: str | None
    ports: PortPlan
    gpus: tuple[str, ...]  # CUDA_VISIBLE_DEVICES entries this task uses
    gpu_layout: str
    cpus: int
    cpus_from: str
    warning: str | None

    @property
    def address(self) -> str:
        return self.addresses[self.index]

    @classmethod
    def from_environment(
        cls,
        environ: Mapping[str, str],
        visible_gpus: list[str],
        node_gpus: int,
    ) -> SlurmCluster:
        """The cluster of the step this task belongs to, checked before anything waits.
        `visible_gpus` are the GPUs this process may use (cluster.visible_gpus), `node_gpus`
        the node's GPU count."""
        nodes_var = _first_set(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST")
        counts_var = _first_set(environ, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
        total_var = _first_set(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
        nodes = expand_nodelist(environ[nodes_var], nodes_var)
        counts = expand_tasks_per_node(environ[counts_var], len(nodes), counts_var, nodes_var)
        total, index = _integer(environ, total_var), _integer(environ, "SLURM_PROCID")
        if sum(counts) != total:
            raise UserError(
                f"{counts_var}={environ[counts_var]} places {sum(counts)} tasks but "
                f"{total_var} is {total}: run the tasks with one srun, which sets both"
            )
        if not 0 <= index < total:
            raise UserError(
                f"SLURM_PROCID={index} is out of range for {total_var}={total}: run the tasks "
                "with one srun, which sets both"
            )
        _check_distribution(environ, counts)
        # Block distribution: task k is on the first node whose running total exceeds k.
        node = next(n for n, end in enumerate(itertools.accumulate(counts)) if index < end)
        local = index - sum(counts[:node])
        host = nodes[node]
        _check_placement(environ, index, host, local, nodes_var, counts_var)
        ports = port_plan(environ, max(counts))
        addresses = tuple(
            f"{name}:{ports.ports[i]}"
            for name, count in zip(nodes, counts, strict=True)
            for i in range(count)
        )
        gpus, layout = gpu_share(environ, visible_gpus, node_gpus, local, counts[node])
        if environ.get("SLURM_CPUS_PER_TASK"):
            cpus, cpus_from = _integer(environ, "SLURM_CPUS_PER_TASK"), "SLURM_CPUS_PER_TASK"
        else:
            cpus, cpus_from = len(os.sched_getaffinity(0)), "this process's CPU affinity"
        return cls(
            addresses, index, host, local, counts[node], environ.get("SLURM_JOB_ID"), ports,
            tuple(gpus), layout, cpus, cpus_from, cpu_warning(cpus, len(gpus), cpus_from),
        )  # fmt: skip

    def check_port(self) -> None:
        """Refuse this task if its own port is taken on its host, naming where it came from."""
        check_port_free(
            self.address,
            self.ports.origin(self.local_index),
            "set HPCAI500_SLURM_PORT_BASE to the first of a free range of ports "
            f"(one per task on a node, {self.tasks_on_node} here)",
        )

    @staticmethod
    def json_keys() -> tuple[str, ...]:
        """The keys of `to_json`, in its order."""
        return (
            "workers", "index", "address", "host", "local_index", "tasks_on_node", "job_id",
            "gpus", "gpu_layout", "cpus", "cpus_from", "warning", "ports",
        )  # fmt: skip

    def to_json(self) -> dict:
        return {
            "workers": list(self.addresses),
            "index": self.index,
            "address": self.address,
            "host": self.host,
            "local_index": self.local_index,
            "tasks_on_node": self.tasks_on_node,
            "job_id": self.job_id,
            "gpus": list(self.gpus),
            "gpu_layout": self.gpu_layout,
            "cpus": self.cpus,
            "cpus_from": self.cpus_from,
            "warning": self.warning,
            "ports": {
                "source": self.ports.source,
                "setting": self.ports.setting,
                "this_task": self.ports.origin(self.local_index),
            },
        }


def _check_distribution(environ: Mapping[str, str], counts: list[int]) -> None:
    """Refuse a step laid out other than by block where that changes who is where (with one
    task per node, cyclic and block place the tasks alike)."""
    distribution = environ.get("SLURM_DISTRIBUTION", "")
    across_nodes = distribution.split(",")[0].split(":")[0]  # e.g. cyclic:block,Pack
    if across_nodes not in ("", "*", "block") and max(counts) > 1:
        raise UserError(
            f"SLURM_DISTRIBUTION={distribution} places tasks on the nodes other than in blocks, "
            f"and Slurm does not say which node each one is on: {_BLOCK_ADVICE}"
        )


def _check_placement(
    environ: Mapping[str, str], index: int, host: str, local: int, nodes_var: str, counts_var: str
) -> None:
    """Refuse a task that Slurm placed elsewhere than the block layout says."""
    distribution = environ.get("SLURM_DISTRIBUTION", "")
    why = f" (SLURM_DISTRIBUTION={distribution})" if distribution not in ("", "block") else ""
    node_name = environ.get("SLURMD_NODENAME")
    if node_name and node_name != host:
        raise UserError(
            f"Slurm task {index} should be on {host} by {nodes_var}={environ[nodes_var]} "
            f"but SLURMD_NODENAME is {node_name}{why}: {_BLOCK_ADVICE}"
        )
    if "SLURM_LOCALID" in environ and _integer(environ, "SLURM_LOCALID") != local:
        raise UserError(
            f"Slurm task {index} should be local task {local} on {host} by "
            f"{counts_var}={environ[counts_var]} but SLURM_LOCALID is "
            f"{environ['SLURM_LOCALID']}{why}: {_BLOCK_ADVICE}"
        )


def _first_set(environ: Mapping[str, str], *names: str) -> str:
    """The first of `names` set in `environ`; a missing variable is refused by name."""
    for name in names:
        if environ.get(name):
            return name
    raise UserError(
        f"{' (or '.join(names)}{')' * (len(names) - 1)} is not set: run each task with srun, "
        "which sets it"
    )


def _required(environ: Mapping[str, str], name: str) -> str:
    return environ[_first_set(environ, name)]


def _integer(environ: Mapping[str, str], name: str) -> int:
    """A whole-number variable, refused by name where it is missing or is not one."""
    text = _required(environ, name).strip()
    if not text.isdigit():
        fix = "run the tasks with srun, which sets it" if name.startswith("SLURM") else "unset it"
        raise UserError(f"{name}={text!r} is not a whole number: correct it or {fix}")
    return int(text)
