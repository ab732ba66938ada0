"""A run's energy: power sampled on every worker's node, and the record's energy block
(`record_energy`, the one entry point `finish` calls); post-processing, never a lost run."""

from __future__ import annotations

from collections.abc import Callable

from hpcai500_tf import record as record_io
from hpcai500_tf.energy import sampler as power
from hpcai500_tf.energy.sources import discover
from hpcai500_tf.errors import UserError
from hpcai500_tf.run.progress import Progress
from hpcai500_tf.run.status import Terminated

MIN_AVERAGE_WATTS = 1e-3  # an average power below this is a sensor or a log out of range


def start_power_sampling(
    hz: float, view=None, environ=None
) -> tuple[power.PowerSampler | None, list[str]]:
    """Every power source here, sampled at `hz` (0: off), its GPUs those `environ` (default
    this process's) chooses; notes say what is missing and why."""
    if hz == 0:
        return None, ["power sampling was switched off (--power-hz 0)"]
    sources, notes = discover(environ=environ)
    if view:
        names = ", ".join(s.name for s in sources) or "none"
        view.message(f"power sources: {names}" + (f" at {hz:g} Hz" if sources else ""))
    return power.PowerSampler(sources, hz).start(), notes


def stop_sampling(one, sampler) -> None:
    """Stop the sampler, add the last segment's energy to `one` (the lifecycle's `Run`), keep
    the readings (never fatal)."""
    if not sampler:
        return
    sampler.stop()
    if one.progress.segments:
        last = one.progress.segments[-1]
        one.progress.energy.append(sampler.measure([(last["start"], last["stop"])]))
    if sampler.sources and one.samples_path:
        try:
            sampler.write_samples(one.samples_path)
        except (OSError, UserError) as error:  # post-processing: never lose the run
            one.warnings.append(f"power samples not written: {error}")


def record_energy(
    one, outcome, power_hz: float, meter_log: str | None, layers: Callable[[], dict]
) -> tuple[dict, list[str]] | None:
    """The record's energy block and its warnings, on the chief; None on the other workers.
    Called on every worker: the other workers' energy is gathered first (a collective where
    every peer is there). `layers`: the run's L1-L9, asked for on the chief only, after."""
    others, others_notes, nodes = gather_energy(one, outcome)
    if not one.chief:
        return None
    if nodes is None:  # not gathered: the cluster's hosts where the run's L3 names them
        nodes = len(layers()["L3"].get("nodes") or []) or None
    notes = outcome.notes + others_notes
    return energy_result(one.progress, notes, power_hz, meter_log, others, nodes)


def gather_energy(one, outcome) -> tuple[list[dict], list[str], int | None]:
    """The other workers' energy over this segment, gathered on all workers (a collective),
    notes naming the workers whose energy the record lacks (all of them where the run ended
    without the collective: a lost peer, SIGTERM, a failure; or the collective failed), and
    how many hosts the workers ran on (None where nothing was gathered)."""
    if one.workers == 1:
        return [], [], 1
    if outcome.peer_lost or outcome.status == "failed":
        if outcome.exit_code == Terminated.exit_code:
            why = "the run was stopped by SIGTERM: no collective after it"
        elif outcome.interrupted:
            why = "the run was interrupted (Ctrl-C): no collective after it"
        elif outcome.peer_lost:
            why = "a peer worker was lost: no collective after it"
        else:
            why = "the run failed: a peer may never join a collective"
        return [], [power.not_gathered(one.workers, "energy", why)], None
    if one.finished:  # every worker restored the chief's state: its readings, not theirs
        why = "the record was rebuilt from the saved state, which holds worker 0's readings"
        return [], [power.not_gathered(one.workers, "energy", why)], None
    own = one.progress.energy[-1] if one.progress.energy else []
    try:
        rows = one.trainer.gather_rows(power.worker_vector(own))
    except Exception as error:  # noqa: BLE001 - a failed collective costs the energy, not the run
        why = f"the collective gathering them failed: {error.__class__.__name__}"
        one.warnings.append(f"the other workers' energy could not be gathered ({why})")
        return [], [power.not_gathered(one.workers, "energy", why)], None
    vectors = [list(row) for row in rows]
    others, notes = power.other_workers(vectors)
    if len(one.progress.segments) > 1:
        why = "only their last segment's readings are counted"
        notes.append(power.not_gathered(one.workers, "energy before the last resume", why))
    return others, notes, power.node_count(vectors)


def energy_result(
    progress: Progress,
    notes: list[str],
    hz: float,
    meter_log: str | None,
    other_workers: list[dict] = (),
    nodes: int | None = 1,
) -> tuple[dict, list[str]]:
    """The record's energy block over all timed segments, with a node meter log if given and
    the other workers' nodes (their current segment) if any. `nodes`: how many nodes the
    workers ran on (None: unknown), for what a meter log on worker 0's node leaves out.
    Energy is post-processing: what fails here (or gives no finite number) is a warning and
    "not measured", never a lost run."""
    intervals = [(s["start"], s["stop"]) for s in progress.segments]
    interval_s = sum(stop - start for start, stop in intervals)
    try:
        block, warnings = _energy_block(
            progress, notes, hz, (meter_log, nodes), other_workers, intervals, interval_s
        )
    except Exception as error:  # noqa: BLE001 - any failure here must not lose the run
        why, warnings = f"energy could not be computed ({error.__class__.__name__}: {error})", []
    else:
        watts = block.get("average_watts")
        try:
            record_io.dumps(block)  # the record's own writer refuses numbers that are not finite
        except ValueError:
            why = "the readings give a number that is not finite (a sensor or log out of range)"
        else:
            if not (block["measured"] and watts is not None and watts < MIN_AVERAGE_WATTS):
                return block, warnings
            why = (
                f"the readings average {watts:.3g} W, below {MIN_AVERAGE_WATTS:g} W: no machine "
                "that trains draws that (a sensor or log out of range; the score per watt "
                "would not be finite)"
            )
    notes = [*notes, why]
    block = record_io.energy_not_measured(
        "; ".join(notes), interval_s=interval_s, requested_hz=hz or None, notes=notes
    )
    return block, [*warnings, f"energy not measured: {why}"]


def meter_log_scope(nodes: int | None) -> str:
    """What a meter log on worker 0's node leaves out of a run on `nodes` nodes (None: the
    workers' hosts are not known). It starts "worker": a note the meter does not cover."""
    if nodes is None:
        return (
            "workers other than 0: not in the meter log (worker 0's node) where they ran on "
            "other nodes; their hosts were not gathered"
        )
    other = "the other node" if nodes == 2 else f"the other {nodes - 1} nodes"
    return f"workers on {other}: not in the meter log (worker 0's node)"


def _energy_block(progress, notes, hz, meter, other_workers, intervals, interval_s):
    """`meter`: (the meter log or None, the number of nodes the workers ran on or None)."""
    (meter_log, nodes), warnings = meter, []
    measurements = power.combine_segments(progress.energy) + list(other_workers)
    if meter_log:
        meter_measurement, warnings = power.meter_log_over(meter_log, intervals)
        if meter_measurement is not None:
            measurements.append(meter_measurement)
            notes = notes if nodes == 1 else [*notes, meter_log_scope(nodes)]
    block, more = power.energy_block(measurements, notes, interval_s, hz or None)
    if meter_log:
        block["meter_log"] = str(meter_log)
    return block, warnings + more
