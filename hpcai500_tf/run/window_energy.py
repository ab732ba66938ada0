"""The machine's energy over a throughput window under srun: each node's own block over it,
else (below first) the sum of its members' own records.

Under srun the instances run on disjoint groups of whole nodes (`cluster.instances`), and
each instance's record already holds its nodes' energy, gathered by the rules of one
multi-worker run (run/energy.py: CPU packages and DRAM once per host, a GPU board once
however many workers see it, a node meter for worker 0's node). The window's energy is
their sum: each member's sources are put through the same block (`energy.sampler.
energy_block`) again, over the window, and the blocks are added, no node being in two
members. A member's readings cover its own timed run only: where that is shorter than the
window, its coverage of the window says so and a note names the instance and the seconds its
nodes were not measured (nothing is made up for them). A member with no record or no energy
measured leaves the machine's energy not measured, naming it.

Where power is sampled (`--power-hz` above 0), each node is also sampled over the whole
window by its first task (SLURM_LOCALID 0), from before its instance starts until every
instance's member note is there (`node_sampling`, `write_node`): a node whose instance ended
first, or started last, is so measured over the window, as the local form's machine is. Each
writes PARENT/node-energy-HOST.json, its block over the window, and the chief that assembles
the throughput record adds them (`nodes_energy`), every node once; where one is missing it
falls back to the members' records above, saying so. A node waits for the others' notes at
most as long again as its own instance's timed run (at least NODE_WAIT_MIN_S), so that an
instance whose task was lost cannot keep the step's other tasks alive: past that, its block
ends where it stopped and the window's coverage says so.

On one machine (the local form) the process that starts the instances samples the machine
over the window, and reads the machine's node meter log (--meter-log) over it (`sampled`).
Under srun a meter log is refused for more than one instance: it is one node's, and each
instance's record would count it as its own nodes'.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

from hpcai500_tf import record as record_io
from hpcai500_tf.energy import sampler as power
from hpcai500_tf.run import throughput

METHOD = (
    "the instances' own records (each instance's nodes by the rules of one run), added over "
    "instances that share no node; each instance's readings cover its own timed run"
)
FULL_COVER = 0.999  # of the window: an instance's timed run shorter than this is named
NODE_METHOD = (
    "each node sampled over the window by its first task (its sources as one run's), "
    "added over the nodes"
)
NODE_FILE = "node-energy-{host}.json"
NODE_WAIT_MIN_S = 60.0  # a node waits for the other instances at least this long
NODES_WAIT_S = 30.0  # the assembling chief waits this long for the other nodes' files
POLL_S = 0.2


def members_energy(members: list[dict], start, stop) -> tuple[dict, list[str]]:
    """The energy block over the window [start, stop] of `members` (as
    `throughput.read_member` gives them: each with its record or None), and its warnings."""
    if start is None or stop is None or not stop > start:
        return record_io.energy_not_measured("no window: no instance ran"), []
    window_s = stop - start
    shared = _shared_host(members)
    if shared:
        return record_io.energy_not_measured(shared, interval_s=window_s), []
    blocks, missing = [], []
    for member in members:
        energy = member["record"]["energy"] if member["record"] is not None else None
        where = f"instance {member['index']} ({', '.join(member['hosts'])})"
        if energy is None:
            missing.append(f"{where}: no record ({member['ended']})")
        elif not energy["measured"]:
            missing.append(f"{where}: not measured ({energy['reason']})")
        else:
            sources = [{**source, "instance": member["index"]} for source in energy["sources"]]
            block, _ = power.energy_block(
                sources, list(energy["notes"]), window_s, energy.get("requested_hz")
            )  # its own warnings are in its record already
            blocks.append((f"instance {member['index']}", where, energy["interval_s"], block))
    if missing:
        why = "; ".join(missing) + ": the machine's energy over the window is not complete"
        return record_io.energy_not_measured(why, interval_s=window_s), []
    return _added(blocks, window_s)


def _shared_host(members: list[dict]) -> str | None:
    """Where two members ran on one node (their energy would count it twice), in one line."""
    seen: dict[str, int] = {}
    for member in members:
        for host in member["hosts"]:
            if host in seen and seen[host] != member["index"]:
                return (
                    f"instances {seen[host]} and {member['index']} both ran on {host}: its "
                    "energy would be counted twice (not summed)"
                )
            seen[host] = member["index"]
    return None


def _added(blocks: list[tuple], window_s: float, method: str = METHOD) -> tuple[dict, list[str]]:
    """Window blocks (label, where, its own seconds or None, block) added: energy and average
    power summed over disjoint nodes; coverage and reading rate the lowest; notes, parts and
    flags each named by its label."""
    notes, parts, lacking, flags, sources, scopes = [], [], [], [], [], []
    for label, where, own_s, block in blocks:
        if own_s is not None and own_s < FULL_COVER * window_s:
            notes.append(
                f"{where}: its readings cover its own timed run, {own_s:.3g} s of the "
                f"{window_s:.3g} s window; its nodes' energy outside it is not measured"
            )
        notes += [f"{note} ({label})" for note in block["notes"]]
        parts += [f"{label}: {part}" for part in block["parts_measured"]]
        # suffixed, not prefixed: scoring.workers_lacking_energy reads a note's start
        lacking += [f"{part} ({label})" for part in block["parts_not_measured"]]
        flags += [f"{label}: {flag}" for flag in block["quality_flags"]]
        sources += block["sources"]
        scopes.append(f"{where}: {block['scope']}")
    rates = [b[3]["sample_hz"] for b in blocks]
    energy = {
        "interval_s": window_s,
        "requested_hz": next((b[3]["requested_hz"] for b in blocks if b[3]["requested_hz"]), None),
        "method": method,
        "sources": sources,
        "notes": notes,
        "measured": True,
        "reason": None,
        "joules": sum(b[3]["joules"] for b in blocks),
        "scope": "; ".join(scopes),
        "average_watts": sum(b[3]["average_watts"] for b in blocks),
        "coverage": min(b[3]["coverage"] for b in blocks),
        "sample_hz": min(rates),
        "parts_measured": parts,
        "parts_not_measured": lacking,
        "quality_flags": flags,
    }
    return energy, list(flags)


# ----------------------------------------------------------------------------- sampled


def sampled(parent: Path, members: list[dict], sampler, notes: list[str], hz: float,
            meter_log: str | None = None):  # fmt: skip
    """The window from the members' MLPerf logs, and the energy `sampler` (of this machine or
    node, running since before the window) measured over it, with this machine's node meter
    log (`meter_log`) read over it where one was given: ((start, stop), block, warnings)."""
    seen = [throughput.read_member(parent, m) for m in members]
    start, stop = throughput.member_window(seen)
    if start is None or stop is None or not stop > start:
        return (start, stop), record_io.energy_not_measured("no window: no instance ran"), []
    measurements = sampler.measure([(start, stop)]) if sampler is not None else []
    warnings = []
    if meter_log:
        meter_measurement, warnings = power.meter_log_over(meter_log, [(start, stop)])
        if meter_measurement is not None:
            measurements.append(meter_measurement)
    if not measurements:
        why = "; ".join([*notes, *warnings]) or "no power source here"
        return (start, stop), record_io.energy_not_measured(why, interval_s=stop - start), []
    block, more = power.energy_block(measurements, notes, stop - start, hz or None)
    if meter_log:
        block["meter_log"] = str(meter_log)
    return (start, stop), block, warnings + more


NODE_VIEW_HIDES = ("CUDA_VISIBLE_DEVICES", "HPCAI500_WORKER_GPUS")  # a task's own GPUs


def node_sampling(hz: float):
    """(sampler, notes) of this node, started, on its first task under srun (SLURM_LOCALID 0)
    where power is sampled; None on any other task. It samples every GPU of the node it can
    open, not only its task's (srun --gpus-per-task=1 leaves it one), and of those the job's
    alone where the node holds more (a node shared with other jobs, whose boards a site
    without device cgroups lets every task open): Slurm's list of the job's GPUs, read as
    NVML's indices. Where it can open fewer than Slurm gave the node (a cgroup keeps each task
    to its own), or more without a list that says which, (None, why): the node's energy is
    then not measured, rather than one board counted for all or other jobs' counted too."""
    if not hz or os.environ.get("SLURM_LOCALID", "0") != "0":
        return None
    from hpcai500_tf.cluster.slurm import slurm_node_gpu_ids, slurm_node_gpus

    node_gpus = slurm_node_gpus(os.environ)
    node_view = {k: v for k, v in os.environ.items() if k not in NODE_VIEW_HIDES}
    sampler, notes = _started(hz, node_view)
    boards = _boards(sampler)
    if node_gpus is None or boards == node_gpus:
        return sampler, notes
    listed = slurm_node_gpu_ids(os.environ)
    if boards > node_gpus and listed is not None and len(listed) == node_gpus:
        sampler.stop()
        node_view["CUDA_VISIBLE_DEVICES"] = ",".join(listed)
        sampler, notes = _started(hz, node_view)
        if _boards(sampler) == node_gpus:
            return sampler, notes
    if sampler is not None:
        sampler.stop()
    if boards < node_gpus:
        why = f"this task reads {boards} of the {node_gpus} GPU boards Slurm gave the node"
    else:
        why = (f"this task reads {boards} GPU boards, more than the {node_gpus} Slurm gave "
               "the job here, and Slurm's list of them does not single them out")  # fmt: skip
    return None, [*notes, f"{why}: its energy is not measured"]


def _started(hz: float, environ: dict):
    from hpcai500_tf.run.energy import start_power_sampling

    return start_power_sampling(hz, environ=environ)


def _boards(sampler) -> int:
    return len([s for s in (sampler.sources if sampler else []) if s.part == power.GPU])


def write_node(parent: Path, sampling, note_paths: list[Path], own_s: float, hz: float) -> None:
    """This node's block over the window, once every instance's note is there (or its wait
    has ended, `NODE_WAIT_MIN_S`), for the assembling chief (`nodes_energy`)."""
    sampler, notes = sampling
    deadline = time.monotonic() + max(own_s, NODE_WAIT_MIN_S)
    while not all(p.exists() for p in note_paths) and _waiting(deadline):
        time.sleep(POLL_S)
    if sampler is not None:
        sampler.stop()
    present = [p for p in note_paths if p.exists()]
    if len(present) < len(note_paths):
        notes = [*notes, f"sampled until {len(present)} of {len(note_paths)} instances had "
                 "ended (its wait for the others ran out)"]  # fmt: skip
    members = [record_io.parse_json(p.read_text(), p, "member note") for p in present]
    window, block, _ = sampled(parent, members, sampler, notes, hz)
    host = node_name()
    data = {"host": host, "window": list(window), "energy": block}
    record_io.write_atomic(parent / NODE_FILE.format(host=host), data, overwrite=True)


def _waiting(deadline: float) -> bool:
    """Whether a wait for the other tasks goes on: before `deadline`, and no stop signal
    pending (run/slurm_task.py holds them blocked once the instance has ended: a scancel
    then ends the wait, and the task writes what it has and exits)."""
    pending = signal.sigpending() & {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    return not pending and time.monotonic() < deadline


def node_name() -> str:
    """This node as Slurm names it (the members' `hosts`), else its host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def nodes_energy(parent: Path, hosts: list[str], start, stop) -> tuple[dict | None, list[str]]:
    """The window's energy from every node's own block (`write_node`), waiting up to
    NODES_WAIT_S for them; (None, why) where one is missing or sampled another window, and
    (None, []) where there is no window (the members' records say so)."""
    if start is None or stop is None or not stop > start:
        return None, []
    paths = {host: parent / NODE_FILE.format(host=host) for host in hosts}
    deadline = time.monotonic() + NODES_WAIT_S
    while not all(p.exists() for p in paths.values()) and _waiting(deadline):
        time.sleep(POLL_S)
    blocks = []
    for host, path in paths.items():
        if not path.exists():
            return None, [f"node {host} wrote no energy over the window: the members' own used"]
        node = record_io.parse_json(path.read_text(), path, "node energy")
        if node["window"] != [start, stop]:
            return None, [f"node {host} sampled another window: the members' own used"]
        energy = node["energy"]
        if not energy["measured"]:
            why = f"node {host}: not measured ({energy['reason']})"
            return record_io.energy_not_measured(why, interval_s=stop - start), []
        blocks.append((host, f"node {host}", None, energy))
    return _added(blocks, stop - start, NODE_METHOD)
