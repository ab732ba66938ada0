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
import threading
import time
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

# A cluster larger than any real one (tasks, hosts): refused, counted before any list is built.
MAX_TASKS = 1_000_000
MAX_NODE_GPUS = 4096  # GPUs one node may report (SLURM_GPUS_ON_NODE)
MAX_DIGITS = 18  # the longest number read from the environment

_BLOCK_ADVICE = "run srun with the default block distribution (srun -m block)"
_DIGITS = f"[0-9]{{1,{MAX_DIGITS}}}"
_RANGE = re.compile(f"({_DIGITS})(?:-({_DIGITS}))?")
_TASKS = re.compile(rf"({_DIGITS})(?:\(x({_DIGITS})\))?")


def shown(text: str, limit: int = 60) -> str:
    """`text` quoted for a one-line message, cut to `limit` characters."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def whole_number(text: str, name: str, low: int, high: int, fix: str) -> int:
    """The number `text` of variable `name`: ASCII digits only (str.isdigit takes '²'), at
    most MAX_DIGITS of them, from `low` to `high`; anything else is one line naming it."""
    text = text.strip()
    if re.fullmatch(_DIGITS, text) is None or not low <= int(text) <= high:
        raise UserError(f"{name}={shown(text)} is not a whole number from {low} to {high}: {fix}")
    return int(text)


def _fix(name: str) -> str:
    return "run the tasks with srun, which sets it" if name.startswith("SLURM") else "unset it"


def step_tasks(environ: Mapping[str, str]) -> int:
    """The tasks of this Slurm step: SLURM_STEP_NUM_TASKS, which srun sets for a step; 1 for a
    process that is no Slurm task (no SLURM_PROCID). In a batch script (SLURM_PROCID and
    SLURM_NTASKS set, no step) `train` would wait for tasks that never start: refused, with
    the srun that starts them. Every count present is read strictly."""
    if "SLURM_PROCID" not in environ:
        return 1
    counts = {
        name: whole_number(environ[name], name, 1, MAX_TASKS, _fix(name))
        for name in ("SLURM_NTASKS", "SLURM_STEP_NUM_TASKS")
        if name in environ
    }
    whole_number(environ["SLURM_PROCID"], "SLURM_PROCID", 0, MAX_TASKS - 1, _fix("SLURM"))
    if "SLURM_STEP_NUM_TASKS" in counts:
        return counts["SLURM_STEP_NUM_TASKS"]
    if counts.get("SLURM_NTASKS", 1) > 1:
        raise UserError(
            f"SLURM_NTASKS={counts['SLURM_NTASKS']} but SLURM_STEP_NUM_TASKS is not set: this "
            "is a Slurm batch script, not a step of srun, and its other tasks never start; "
            "start every task with srun (srun hpcai500-tf train ...), or one worker with srun -n1"
        )
    return 1


def expand_nodelist(text: str, variable: str = "SLURM_STEP_NODELIST") -> list[str]:
    """The host names of a Slurm host list (`gpu[08-11],m1`) in Slurm's order: items as
    written, ranges ascending with their zero padding, the first bracket varying slowest. The
    number of hosts is counted before any is built: more than MAX_TASKS is one line."""
    items = []
    for item in _top_level_items(text, variable):
        pieces = re.split(r"(\[[^\]]*\])", item)  # literal, [group], literal, ...
        items.append(
            [_group_ranges(p[1:-1], text, variable) if p.startswith("[") else p for p in pieces]
        )
    total = 0
    for pieces in items:
        size = 1
        for piece in pieces:
            size *= (
                1 if isinstance(piece, str) else sum(last - int(first) + 1 for first, last in piece)
            )
            if total + size > MAX_TASKS:
                raise _not_a_host_list(text, variable, f"it names more than {MAX_TASKS:,} hosts")
        total += size
    hosts: list[str] = []
    for pieces in items:
        choices = [[p] if isinstance(p, str) else _group_numbers(p) for p in pieces]
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


def _group_ranges(body: str, text: str, variable: str) -> list[tuple[str, int]]:
    """The ranges of one bracket group (`1,3,5-7`, `08-11`) as (first as written, last)."""
    ranges = []
    for part in body.split(","):
        match = _RANGE.fullmatch(part)
        if match is None:
            raise _not_a_host_list(
                text, variable, f"'[{shown(body)[1:-1]}]' is not numbers and ranges"
            )
        first, last = match.group(1), int(match.group(2) or match.group(1))
        if last < int(first):
            raise _not_a_host_list(text, variable, f"the range {part} ends before it starts")
        ranges.append((first, last))
    return ranges


def _group_numbers(ranges: list[tuple[str, int]]) -> list[str]:
    """The numbers of a group's ranges, each as wide as its range's start."""
    return [f"{n:0{len(first)}d}" for first, last in ranges for n in range(int(first), last + 1)]


def _not_a_host_list(text: str, variable: str, why: str) -> UserError:
    return UserError(
        f"{variable}={shown(text)} is not a Slurm host list ({why}): run the tasks with srun, "
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
    pairs = []
    for item in text.strip().split(","):
        match = _TASKS.fullmatch(item.strip())
        if match is None or int(match.group(1)) < 1 or int(match.group(2) or 1) < 1:
            raise UserError(
                f"{variable}={shown(text)} is not Slurm's tasks per node (counts of at least 1, "
                "as in 2(x3),1): run the tasks with srun, which sets it, or correct it"
            )
        pairs.append((int(match.group(1)), int(match.group(2) or 1)))
    listed = sum(repeat for _, repeat in pairs)
    if listed != nodes:
        raise UserError(
            f"{variable}={shown(text)} counts tasks on {listed} node(s) but {nodes_variable} "
            f"names {nodes}: run the tasks with one srun, which sets both"
        )
    if sum(count * repeat for count, repeat in pairs) > MAX_TASKS:
        raise UserError(
            f"{variable}={shown(text)} places more than {MAX_TASKS:,} tasks, more than any "
            "real cluster: run the tasks with srun, which sets it, or correct it"
        )
    return [count for count, repeat in pairs for _ in range(repeat)]


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


def port_plan(
    environ: Mapping[str, str], tasks_on_node: int, listening: int | None = None
) -> PortPlan:
    """The ports of a node's `tasks_on_node` tasks: from HPCAI500_SLURM_PORT_BASE where the user
    sets it, else Slurm's reserved ports (SLURM_STEP_RESV_PORTS), else from SLURM_JOB_ID.
    `listening`: how many of them listen on theirs (None: all, TensorFlow's gRPC servers;
    PyTorch's workers dial local task 0's alone), which must fit in a job id's slot."""
    base_text = environ.get("HPCAI500_SLURM_PORT_BASE") or None
    reserved = environ.get("SLURM_STEP_RESV_PORTS")
    if base_text is None and reserved:
        ranges = _reserved_ranges(reserved)
        count = sum(last - first + 1 for first, last in ranges)  # counted, not listed
        if count < tasks_on_node:
            raise UserError(
                f"SLURM_STEP_RESV_PORTS={shown(reserved)} reserves {count} port(s) but a node "
                f"runs {tasks_on_node} tasks: ask srun for --resv-ports={tasks_on_node}, or set "
                "HPCAI500_SLURM_PORT_BASE"
            )
        ports = itertools.chain.from_iterable(range(a, b + 1) for a, b in ranges)
        return PortPlan(
            "SLURM_STEP_RESV_PORTS", reserved, tuple(itertools.islice(ports, tasks_on_node))
        )
    if base_text is not None:
        source, setting = "HPCAI500_SLURM_PORT_BASE", base_text
        base = whole_number(base_text, source, 1, 65535, "set it to a port from 1024 to 65535")
    else:
        source, setting = "SLURM_JOB_ID", _required(environ, "SLURM_JOB_ID")
        job = whole_number(setting, source, 0, 2**32 - 1, "run the tasks with srun, which sets it")
        listening = tasks_on_node if listening is None else listening
        if listening > PORT_STRIDE:  # would take the next job id's ports on a shared node
            raise UserError(
                f"a node runs {tasks_on_node} tasks, more than the {PORT_STRIDE} ports a job's "
                f"slot from SLURM_JOB_ID holds: ask srun for --resv-ports={tasks_on_node}, or "
                "set HPCAI500_SLURM_PORT_BASE to the first of that many free ports"
            )
        base = PORT_FIRST + (job % PORT_SLOTS) * PORT_STRIDE
    if not 1024 <= base <= 65536 - tasks_on_node:
        raise UserError(
            f"{source}={setting} gives ports {base} to {base + tasks_on_node - 1}, outside "
            f"1024-65535: set HPCAI500_SLURM_PORT_BASE to a port from 1024 to "
            f"{65536 - tasks_on_node}"
        )
    return PortPlan(source, setting, tuple(range(base, base + tasks_on_node)))


def _reserved_ranges(text: str) -> list[tuple[int, int]]:
    """The port ranges of SLURM_STEP_RESV_PORTS (`12000-12007`, `12000,12002`), in order, each
    port from 1 to 65535."""
    ranges = []
    for part in text.split(","):
        match = _RANGE.fullmatch(part.strip())
        first, last = (
            (0, 0)
            if match is None
            else (int(match.group(1)), int(match.group(2) or match.group(1)))
        )
        if match is None or not 1 <= first <= last <= 65535:
            raise UserError(
                f"SLURM_STEP_RESV_PORTS={shown(text)} is not a list of ports (1 to 65535) and "
                "ranges: unset it or set HPCAI500_SLURM_PORT_BASE"
            )
        ranges.append((first, last))
    return ranges


def port_free(port: int) -> bool:
    """Whether `port` can be bound on this host now (nothing listens on it). Bound as the
    frameworks' servers bind (gRPC, the PyTorch store: SO_REUSEADDR), so that connections a
    step before this one left in TIME_WAIT do not count as taken."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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


RESOLVE_SECONDS = 10.0  # every host of a cluster must resolve within this, all together


def check_hosts_resolve(hosts: list[str], where: str, seconds: float = RESOLVE_SECONDS) -> None:
    """Refuse a cluster one of whose hosts does not resolve (socket.getaddrinfo), or not within
    `seconds`, naming the first such host in the cluster's order and `where` the hosts come
    from: every worker would otherwise wait for it until its join timeout. Distinct hosts are
    resolved by up to 16 daemon threads, so a resolver that hangs is left behind, not waited
    for."""
    pending = list(dict.fromkeys(hosts))
    answers: dict[str, str | None] = {}  # host -> None (resolved) or why not
    lock = threading.Lock()

    def resolve() -> None:
        while True:
            with lock:
                if not pending:
                    return
                host = pending.pop()
            try:
                socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
                answers[host] = None
            except (OSError, UnicodeError) as error:
                answers[host] = getattr(error, "strerror", None) or str(error)

    threads = [threading.Thread(target=resolve, daemon=True) for _ in range(min(16, len(pending)))]
    deadline = time.monotonic() + seconds
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    for host in dict.fromkeys(hosts):
        if host not in answers:
            why = f"did not resolve within {seconds:g} s"
        elif answers[host] is not None:
            why = f"does not resolve ({answers[host]})"
        else:
            continue
        raise UserError(
            f"host {shown(host)} of {where} {why}: every worker must reach it; check the "
            "host names (DNS, /etc/hosts) or the cluster's description"
        )


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
        _refuse_shared_binding(visible, node_gpus, tasks_on_node)
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
    --gpu-bind), as Slurm says it: a GPU binding other than `none` (SLURM_TRES_BIND, or
    SLURMD_TRES_BIND as 22.05 gives it), or a count of GPUs per task (SLURM_TRES_PER_TASK from
    Slurm 23.11, SLURM_GPUS_PER_TASK where a version passes it) that the task sees no more
    than. Where Slurm says neither, a task is bound where it sees fewer GPUs than Slurm gave
    its node (SLURM_GPUS_ON_NODE, `node_gpus`) and no more than the node has tasks."""
    binding = gpu_binding(environ)
    if binding is not None and "none" in binding.split(","):
        return False
    per_task = gpus_per_task(environ)
    if per_task is not None:
        return 0 < len(visible) <= per_task[0]
    if binding is not None:
        return True
    return len(visible) < node_gpus and len(visible) <= tasks_on_node


def _refuse_shared_binding(visible: list[str], node_gpus: int, tasks_on_node: int) -> None:
    """A binding is a task's own only where the node's tasks, each seeing as many GPUs as this
    one, need no more GPUs than Slurm gave the node: `--ntasks-per-gpu`, `--gpu-bind=single:N`
    or `closest` bind several tasks to one GPU, and two workers on one GPU contend for its
    memory and time (TensorFlow's first takes nearly all of its memory)."""
    if node_gpus and tasks_on_node * len(visible) > node_gpus:
        raise UserError(
            f"Slurm bound {len(visible)} GPU(s) to each of this node's {tasks_on_node} tasks "
            f"but gave the node {node_gpus}, so tasks share a GPU (--ntasks-per-gpu, "
            "--gpu-bind=single or closest): run one task per GPU (--gpus-per-task=1) or one "
            "task per node"
        )


# A GPU count in Slurm's TRES strings, as the versions write them: gres/gpu=1 (23.11 on, as in
# cpu=4,gres/gpu=1), gres/gpu:1, gres:gpu:1, with a type: gres/gpu:h100:1 or gres/gpu:h100=1.
_TRES_GPUS = re.compile(r"(?:^|,)gres[/:]gpu(?::[A-Za-z0-9_.-]{1,64})?[:=]([0-9]{1,6})(?=,|$)")
_TRES_BIND = re.compile(r"(?:^|[+;])(?:gres[/:])?gpu:([^+;]*)")


def tres_gpus(text: str) -> int | None:
    """The GPU count a TRES list (SLURM_TRES_PER_TASK, SLURM_TRES_PER_NODE) names, if any."""
    match = _TRES_GPUS.search(text.strip())
    return int(match.group(1)) if match else None


def gpus_per_task(environ: Mapping[str, str]) -> tuple[int, str] | None:
    """(GPUs per task, the variable that says so) where Slurm says it: SLURM_TRES_PER_TASK, else
    SLURM_GPUS_PER_TASK (`1`, `h100:1`)."""
    tres = environ.get("SLURM_TRES_PER_TASK", "")
    if tres_gpus(tres):
        return tres_gpus(tres), f"SLURM_TRES_PER_TASK={tres}"
    per_task = environ.get("SLURM_GPUS_PER_TASK", "").rpartition(":")[2]
    if per_task:
        count = whole_number(per_task, "SLURM_GPUS_PER_TASK", 0, MAX_NODE_GPUS, _fix("SLURM"))
        return (count, f"SLURM_GPUS_PER_TASK={environ['SLURM_GPUS_PER_TASK']}") if count else None
    return None


def gpu_binding(environ: Mapping[str, str]) -> str | None:
    """The GPU part of SLURM_TRES_BIND (`gres/gpu:closest` -> `closest`, also `gpu:` and
    `gres:gpu:`), else of SLURMD_TRES_BIND, which Slurm 22.05 gives every task of a step
    (`gpu:per_task:1` under --gpus-per-task, `gpu:none` under --gpu-bind=none); None where
    neither names a GPU binding."""
    for name in ("SLURM_TRES_BIND", "SLURMD_TRES_BIND"):
        match = _TRES_BIND.search(environ.get(name, "").strip())
        if match:
            return match.group(1)
    return None


def slurm_node_gpus(environ: Mapping[str, str]) -> int | None:
    """The GPUs Slurm gave this job on this node: SLURM_GPUS_ON_NODE, else the length of
    its list (`slurm_node_gpu_ids`); None where Slurm says nothing. A task that
    Slurm's cgroup keeps to its own GPU cannot count the node's through NVML, which then lists
    the node's GPUs but opens only its own."""
    if environ.get("SLURM_GPUS_ON_NODE", "").strip():
        return _integer(environ, "SLURM_GPUS_ON_NODE", 0, MAX_NODE_GPUS)
    listed = slurm_node_gpu_ids(environ)
    return None if listed is None else len(listed)


def slurm_node_gpu_ids(environ: Mapping[str, str]) -> list[str] | None:
    """The IDs of the GPUs Slurm gave this job on this node: SLURM_JOB_GPUS, else
    SLURM_STEP_GPUS (`4,5,6,7`; the job's first: a task of srun --gpus-per-task=1 has only
    its own GPU in SLURM_STEP_GPUS, Slurm 22.05 on tests/test_real_slurm.py); None where
    Slurm lists none."""
    for name in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS"):
        listed = environ.get(name, "").strip()
        if listed:
            entries = listed.split(",", MAX_NODE_GPUS)
            if len(entries) > MAX_NODE_GPUS or not all(entry.strip() for entry in entries):
                raise UserError(
                    f"{name}={shown(listed)} is not a list of at most {MAX_NODE_GPUS} GPUs: "
                    "run the tasks with srun, which sets it"
                )
            return [entry.strip() for entry in entries]
    return None


def _gpus_per_node(environ: Mapping[str, str]) -> int | None:
    """The GPUs per node the job asked for, where Slurm exports it (SLURM_GPUS_PER_NODE,
    SLURM_TRES_PER_NODE)."""
    per_node = environ.get("SLURM_GPUS_PER_NODE", "").rpartition(":")[2]
    if per_node:
        return whole_number(per_node, "SLURM_GPUS_PER_NODE", 0, MAX_NODE_GPUS, _fix("SLURM"))
    return tres_gpus(environ.get("SLURM_TRES_PER_NODE", ""))


_EQUAL_FIX = (
    "give every worker the same number of GPUs (the same --ntasks-per-node on every node with "
    "--gpus-per-node=N, or --gpus-per-task)"
)


def check_equal_gpus(
    environ: Mapping[str, str], nodes: list[str], counts: list[int], node: int, gpus: int,
    bound: bool,
) -> None:  # fmt: skip
    """Refuse, before anything waits, a step whose workers would compute on unequal numbers of
    GPUs: TensorFlow's collectives assume the same count on every worker and fail at the first
    all-reduce. `gpus` is this node's GPUs (Slurm's), `bound` whether Slurm bound them to tasks.

    One task sees its own node's GPUs (SLURM_GPUS_ON_NODE), the step's tasks per node, and the
    job's request where Slurm exports it. Detected here: nodes running different numbers of
    tasks that share their GPUs unbound, where this node's tasks share them, or the job asked
    for the same GPUs on every node (SLURM_GPUS_PER_NODE, SLURM_TRES_PER_NODE); and a job total
    (SLURM_GPUS, from --gpus) that this node's count times the step's nodes does not make, the
    step spanning the job's nodes (SLURM_JOB_NUM_NODES): Slurm spread them unevenly. Not
    detectable: another node's count where the job asked for neither (--gres=gpu:N gives N on
    every node) and this task is alone on its node; that node's own task refuses there, where
    the counts do not divide (`gpu_share`). Tasks bound to GPUs get the same count each."""
    if not gpus or bound:
        return
    if len(set(counts)) > 1 and (counts[node] > 1 or _gpus_per_node(environ)):
        firsts = {count: nodes[i] for i, count in reversed(list(enumerate(counts)))}
        example = ", ".join(f"{host}: {count}" for count, host in sorted(firsts.items()))
        raise UserError(
            f"the step's nodes run different numbers of tasks ({example}, by "
            "SLURM_STEP_TASKS_PER_NODE) that share their GPUs unbound, so its workers would "
            f"compute on unequal numbers of GPUs: {_EQUAL_FIX}"
        )
    total = environ.get("SLURM_GPUS", "").rpartition(":")[2]
    job_nodes = environ.get("SLURM_JOB_NUM_NODES", "")
    if not total or not job_nodes:
        return
    total_gpus = whole_number(total, "SLURM_GPUS", 0, MAX_TASKS, _fix("SLURM"))
    if _integer(environ, "SLURM_JOB_NUM_NODES", 1) == len(nodes) != 0 and (
        total_gpus != gpus * len(nodes)
    ):
        raise UserError(
            f"{nodes[node]} has {gpus} of the job's SLURM_GPUS={total_gpus} GPUs over "
            f"{len(nodes)} nodes: Slurm spread them unevenly, so its workers would compute on "
            f"unequal numbers of GPUs: {_EQUAL_FIX}"
        )


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
        listening: int | None = None,
    ) -> SlurmCluster:
        """The cluster of the step this task belongs to, checked before anything waits.
        `visible_gpus` are the GPUs this process may use (cluster.visible_gpus), `node_gpus`
        the node's GPU count, `listening` how many of a node's tasks listen on a port
        (`port_plan`)."""
        nodes_var = _first_set(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST")
        counts_var = _first_set(environ, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
        total_var = "SLURM_STEP_NUM_TASKS"  # the tasks of this step: never the job's
        total = step_tasks(environ)
        _first_set(environ, total_var)
        nodes = expand_nodelist(environ[nodes_var], nodes_var)
        counts = expand_tasks_per_node(environ[counts_var], len(nodes), counts_var, nodes_var)
        index = _integer(environ, "SLURM_PROCID")
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
        ports = port_plan(environ, max(counts), listening)
        addresses = tuple(
            f"{name}:{ports.ports[i]}"
            for name, count in zip(nodes, counts, strict=True)
            for i in range(count)
        )
        bound = _bound_by_slurm(environ, visible_gpus, node_gpus, counts[node])
        check_equal_gpus(environ, nodes, counts, node, node_gpus if visible_gpus else 0, bound)
        gpus, layout = gpu_share(environ, visible_gpus, node_gpus, local, counts[node])
        if environ.get("SLURM_CPUS_PER_TASK"):
            cpus = _integer(environ, "SLURM_CPUS_PER_TASK", 1)
            cpus_from = "SLURM_CPUS_PER_TASK"
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
    if environ.get("SLURM_LOCALID") and _integer(environ, "SLURM_LOCALID") != local:
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


def _integer(environ: Mapping[str, str], name: str, low: int = 0, high: int = MAX_TASKS) -> int:
    """A whole-number variable, refused by name where it is missing or is not one in range."""
    return whole_number(_required(environ, name), name, low, high, _fix(name))
