"""Scores derived from a record: FLOPS, Valid FLOPS, Valid FLOPS per watt; ranking of submissions.

FLOPS = total FLOPs / time-to-quality. Valid FLOPS = FLOPS x (achieved / target)^n, as
published (no cap unless asked). The reading is SPEC section 3's: the run timed to the end of
its last required epoch and scored by the quality it ends with (the record's `quality` block);
the first evaluation at or above target is shown beside it. A convention (config: stated, or
e.g. published-2020) names the exponent and the FLOP basis. Valid FLOPS per watt = Valid
FLOPS / average measured power over the measured scope (see `energy`); absent, with the reason,
when nothing was measured.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from hpcai500_tf.config import LAYER_IDS, Benchmark, Level, Repeatability
from hpcai500_tf.errors import UserError
from hpcai500_tf.record import LAYER_KEYS, PLACEMENT_FIELDS


@dataclass(frozen=True)
class Score:
    quality: float
    target: float
    penalty_exponent: float
    quality_factor: float
    capped: bool
    time_to_quality_s: float
    total_flops: float
    flops: float
    valid_flops: float
    average_watts: float | None
    valid_flops_per_watt: float | None
    energy_note: str
    convention: str = "stated"
    flop_basis: str = ""
    reading: str = ""
    first_crossing_s: float | None = None  # MLPerf's reading: the first evaluation on target


def quality_factor(quality: float, target: float, exponent: float, cap: bool = False) -> float:
    """(quality / target)^n; with `cap`, never above 1 (the published formula has no cap)."""
    if not 0 < quality <= 1 or not 0 < target <= 1:
        raise ValueError(f"quality {quality} and target {target} must be in (0, 1]")
    factor = (quality / target) ** exponent
    return min(factor, 1.0) if cap else factor


def valid_flops(
    total_flops: float,
    seconds: float,
    quality: float,
    target: float,
    exponent: float,
    cap: bool = False,
) -> float:
    if seconds <= 0:
        raise ValueError(f"time must be > 0 seconds, got {seconds}")
    return total_flops / seconds * quality_factor(quality, target, exponent, cap)


def score(
    record: dict, benchmark: Benchmark, cap: bool = False, convention: str = "stated"
) -> Score:
    """Recompute a record's scores; the target is the problem's (L9, which the validator holds
    equal to quality.target), n and the FLOP basis the convention's."""
    rule = benchmark.convention(convention)
    quality = record["quality"]
    if record["status"] not in ("completed", "imported"):
        raise UserError(f"cannot score a run whose status is '{record['status']}'")
    if not quality["measured"]:
        raise UserError("cannot score a throughput-only run: its quality was not measured")
    target = quality["target"]
    seconds = quality["time_to_quality_s"]
    if rule.flops_per_example is None:
        total, basis = record["flops"]["total"], record["flops"]["basis"]
        kernels = record["layers"]["L7"].get("kernels")
        if basis == "tensorflow-profiler" and kernels:
            # The profiler counts the ops that ran: the CPU workarounds' fused batch norm has
            # no count, stock Keras batch norm's ops do (a few % of the step).
            basis = f"{basis} ({kernels} kernels)"
    else:
        total = rule.flops_per_example * quality["examples_to_quality"]
        basis = rule.flop_basis
    energy = record["energy"]
    watts = energy["average_watts"] if energy["measured"] else None
    try:
        factor = quality_factor(quality["achieved"], target, rule.penalty_exponent, cap)
        flops = total / seconds
        valid = flops * factor
        per_watt = None if watts is None else valid / watts
    except (OverflowError, ZeroDivisionError):
        factor = flops = valid = per_watt = math.inf
    if not all(math.isfinite(x) for x in (factor, flops, valid, per_watt or 0.0)):
        raise UserError(
            f"the score is not a finite number (time {seconds:.3g} s, quality {quality['achieved']}"
            f", target {target:.3g}, FLOPs {total:.3g}, watts {watts}): a record that cannot "
            "be scored"
        )
    if energy["measured"]:
        rate = energy["sample_hz"]
        note = (
            f"measured: {energy['scope']}; readings cover {energy['coverage']:.1%} of the run"
            + ("" if rate is None else f" at {rate:.3g} samples/s")
        )
        if energy["quality_flags"]:
            note += " (" + "; ".join(energy["quality_flags"]) + ")"
    else:
        note = f"not measured: {energy['reason']}"
    return Score(
        quality=quality["achieved"],
        target=target,
        penalty_exponent=rule.penalty_exponent,
        quality_factor=factor,
        capped=cap and rule.penalty_exponent > 0 and quality["achieved"] > target,
        time_to_quality_s=seconds,
        total_flops=total,
        flops=flops,
        valid_flops=valid,
        average_watts=watts,
        valid_flops_per_watt=per_watt,
        energy_note=note,
        convention=rule.name,
        flop_basis=basis,
        reading=quality["reading"],
        first_crossing_s=(quality["first_crossing"] or {}).get("elapsed_s"),
    )


def mixed_bases(scores: list[Score]) -> str | None:
    """A warning when scores count FLOPs on different bases (their FLOPS are not alike)."""
    bases = sorted({s.flop_basis for s in scores})
    if len(bases) < 2:
        return None
    return (
        f"FLOPs counted on different bases ({', '.join(bases)}): FLOPS and Valid FLOPS of "
        "these records are not counted alike; --convention published-2020 puts them on one"
    )


def refusal(record: dict, benchmark: Benchmark, level: Level) -> list[str]:
    """Every rule of the level this record breaks; empty when it may be ranked."""
    reasons = []
    if record["benchmark"] != benchmark.name:
        return [f"benchmark '{record['benchmark']}', not '{benchmark.name}'"]
    if record["status"] not in ("completed", "imported"):
        reasons.append(f"run status is '{record['status']}'")
    if not record["quality"]["measured"]:
        reasons.append("quality not measured")
    if not record["rankable"]:
        reasons.append("not rankable: " + "; ".join(record["not_rankable_reasons"]))
    problem = record["layers"]["L9"]
    for key, expected in benchmark.problem().items():
        if problem.get(key) != expected:
            reasons.append(f"L9 problem: {key} {problem.get(key)!r} is not {expected!r}")
    for layer in LAYER_IDS[:-1]:
        if layer in level.may_differ:
            continue
        actual = record["layers"][layer]
        for key, expected in benchmark.reference_layers.get(layer, {}).items():
            if actual.get(key) != expected:
                reasons.append(
                    f"{layer} {LAYER_KEYS[layer]}: {key} {actual.get(key)!r} differs from the "
                    f"reference {expected!r} (fixed at the {level.name} level)"
                )
    return reasons


def _cv(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean else None


def olympic(values: list[float], min_runs: int) -> list[float]:
    """Drop the lowest and highest value when there are at least `min_runs` values."""
    if len(values) >= min_runs:
        return sorted(values)[1:-1]
    return list(values)


@dataclass
class Submission:
    """Runs that agree on all nine layers: one system, scored by the mean of its runs."""

    label: str
    paths: list[str] = field(default_factory=list)
    scores: list[Score] = field(default_factory=list)
    valid_flops: float = 0.0
    time_to_quality_s: float = 0.0
    cv_time_to_quality: float | None = None
    cv_valid_flops: float | None = None
    flagged: bool = False
    notes: list[str] = field(default_factory=list)  # why it is flagged


@dataclass
class Ranking:
    benchmark: str
    level: str
    submissions: list[Submission]
    refused: list[tuple[str, list[str]]]
    convention: str = "stated"
    warnings: list[str] = field(default_factory=list)


def submission_key(record: dict) -> str:
    """Runs of one submission agree on all nine layers except the seed (MLPerf runs one
    submission with several seeds)."""
    layers = {name: dict(values) for name, values in record["layers"].items()}
    layers["L8"].pop("seed", None)
    for layer, name in PLACEMENT_FIELDS:  # the nodes a run was given
        layers[layer].pop(name, None)
    return json.dumps(layers, sort_keys=True)


def _label(record: dict) -> str:
    hardware = record["layers"]["L1"]
    framework = record["layers"]["L5"]
    system = hardware.get("summary") or hardware.get("cpu_model") or "unknown system"
    stack = " ".join(
        str(framework[k]) for k in ("framework", "framework_version") if framework.get(k)
    )
    return f"{system} | {stack}" if stack else system


def rank(
    records: list[tuple[str, dict]],
    benchmark: Benchmark,
    level: Level,
    repeatability: Repeatability,
    cap: bool = False,
    convention: str = "stated",
) -> Ranking:
    """Rank records by Valid FLOPS at a level, grouping equal-layer records into submissions."""
    groups: dict[str, Submission] = {}
    refused = []
    for path, record in records:
        reasons = refusal(record, benchmark, level)
        if not reasons:
            try:
                run_score = score(record, benchmark, cap, convention)
            except UserError as error:
                reasons = [str(error)]
        if reasons:
            refused.append((path, reasons))
            continue
        submission = groups.setdefault(submission_key(record), Submission(label=_label(record)))
        submission.paths.append(path)
        submission.scores.append(run_score)
    for key, submission in list(groups.items()):
        missed = sum(not x.quality >= x.target for x in submission.scores)
        if missed > repeatability.max_runs_missing_target:
            del groups[key]
            reason = (
                f"runs of one submission: {missed} of {len(submission.paths)} missed the target; "
                f"at most {repeatability.max_runs_missing_target} may"
            )
            refused += [(path, [reason]) for path in submission.paths]
            continue
        valid = [s.valid_flops for s in submission.scores]
        times = [s.time_to_quality_s for s in submission.scores]
        submission.valid_flops = statistics.fmean(olympic(valid, repeatability.olympic_min_runs))
        submission.time_to_quality_s = statistics.fmean(
            olympic(times, repeatability.olympic_min_runs)
        )
        submission.cv_valid_flops = _cv(valid)
        submission.cv_time_to_quality = _cv(times)
        if len(submission.paths) < repeatability.min_runs:
            submission.notes.append(
                f"{len(submission.paths)} run(s): fewer than the {repeatability.min_runs} a "
                "result needs (MLPerf's rule)"
            )
        for name, cv in (
            ("Valid FLOPS", submission.cv_valid_flops),
            ("time-to-quality", submission.cv_time_to_quality),
        ):
            if cv is not None and cv > repeatability.max_cv:
                submission.notes.append(
                    f"{name} varies {cv:.1%} between runs (above {repeatability.max_cv:.0%})"
                )
        submission.flagged = bool(submission.notes)
    ordered = sorted(groups.values(), key=lambda s: s.valid_flops, reverse=True)
    warning = mixed_bases([x for s in ordered for x in s.scores])
    return Ranking(
        benchmark.name, level.name, ordered, refused, convention, [warning] if warning else []
    )


def ranking_to_json(ranking: Ranking) -> dict:
    return {
        "benchmark": ranking.benchmark,
        "level": ranking.level,
        "convention": ranking.convention,
        "warnings": ranking.warnings,
        "submissions": [
            {
                "rank": position,
                "label": s.label,
                "runs": len(s.paths),
                "records": [str(Path(p)) for p in s.paths],
                "valid_flops": s.valid_flops,
                "time_to_quality_s": s.time_to_quality_s,
                "flop_basis": sorted({x.flop_basis for x in s.scores}),
                "cv_valid_flops": s.cv_valid_flops,
                "cv_time_to_quality": s.cv_time_to_quality,
                "flagged": s.flagged,
                "notes": s.notes,
            }
            for position, s in enumerate(ranking.submissions, start=1)
        ],
        "refused": [{"record": p, "reasons": r} for p, r in ranking.refused],
    }


PUBLISHED_DIR = Path(__file__).resolve().parents[1] / "examples" / "published_2020"


def published_records() -> list[tuple[str, dict]]:
    """The nine entries of the July 2020 image-classification ranking, as records."""
    from hpcai500_tf import record as record_io

    paths = sorted(PUBLISHED_DIR.glob("*.json"))
    if not paths:
        raise UserError(
            f"{PUBLISHED_DIR}: the published records ship with a clone of the repository "
            "(examples/published_2020/); this install has none"
        )
    return [(str(path), record_io.load(path)) for path in paths]


def rank_records(
    records: list[tuple[str, dict]],
    benchmark_name: str | None,
    level_name: str,
    cap: bool = False,
    convention: str = "stated",
    max_cv: float | None = None,
    with_published: bool = False,
) -> list[Ranking]:
    """What `hpcai500-tf rank` shows: the records' ranking under `convention`; beside the
    published 2020 ranking, also under that ranking's own convention."""
    from hpcai500_tf import config

    if with_published:
        records = [*records, *published_records()]
    if benchmark_name is None:
        names = sorted({rec["benchmark"] for _, rec in records})
        if len(names) > 1:
            raise UserError(
                f"records of several benchmarks ({', '.join(names)}): choose one with --benchmark"
            )
        benchmark_name = names[0]
    benchmark = config.load_benchmark(benchmark_name)
    level = config.load_level(level_name)
    _, repeatability = config.load_levels()
    if max_cv is not None:
        if not 0 < max_cv <= 1:
            raise UserError(f"--max-cv must be in (0, 1], got {max_cv}")
        repeatability = dataclasses.replace(repeatability, max_cv=max_cv)
    conventions = [convention]
    if with_published and convention == "stated" and "published-2020" in benchmark.conventions:
        conventions.append("published-2020")  # the ranking's own reading beside the stated one
    return [rank(records, benchmark, level, repeatability, cap, name) for name in conventions]
