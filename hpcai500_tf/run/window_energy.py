"""The machine's energy over a throughput window under srun, from its members' own records.

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
"""

from __future__ import annotations

from hpcai500_tf import record as record_io
from hpcai500_tf.energy import sampler as power

METHOD = (
    "the instances' own records (each instance's nodes by the rules of one run), added over "
    "instances that share no node; each instance's readings cover its own timed run"
)
FULL_COVER = 0.999  # of the window: an instance's timed run shorter than this is named


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
            blocks.append((member, where, energy["interval_s"], block))
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


def _added(blocks: list[tuple], window_s: float) -> tuple[dict, list[str]]:
    """The members' window blocks added: energy and average power summed over disjoint nodes;
    coverage and reading rate the lowest; notes, parts and flags each named by instance."""
    notes, parts, lacking, flags, sources, scopes = [], [], [], [], [], []
    for member, where, own_s, block in blocks:
        index = member["index"]
        if own_s is not None and own_s < FULL_COVER * window_s:
            notes.append(
                f"{where}: its readings cover its own timed run, {own_s:.3g} s of the "
                f"{window_s:.3g} s window; its nodes' energy outside it is not measured"
            )
        notes += [f"{note} (instance {index})" for note in block["notes"]]
        parts += [f"instance {index}: {part}" for part in block["parts_measured"]]
        # suffixed, not prefixed: scoring.workers_lacking_energy reads a note's start
        lacking += [f"{part} (instance {index})" for part in block["parts_not_measured"]]
        flags += [f"instance {index}: {flag}" for flag in block["quality_flags"]]
        sources += block["sources"]
        scopes.append(f"{where}: {block['scope']}")
    rates = [b[3]["sample_hz"] for b in blocks]
    energy = {
        "interval_s": window_s,
        "requested_hz": next((b[3]["requested_hz"] for b in blocks if b[3]["requested_hz"]), None),
        "method": METHOD,
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
