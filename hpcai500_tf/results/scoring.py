"""Scores derived from a record: FLOPS, Valid FLOPS, Valid FLOPS per watt; ranking of submissions.

FLOPS = total FLOPs / time-to-quality. Valid FLOPS = FLOPS x (achieved / target)^n, as
published (no cap unless asked). The reading is SPEC section 3's: the run timed to the end of
its last required epoch and scored by the quality it ends with (the record's `quality` block);
the first evaluation at or above target is shown beside it. A convention (config: stated, or
e.g. published-2020) names the exponent and the FLOP basis. A convention with its own FLOP count
per example is a published table's reading, and reads every record at the benchmark's problem:
the FLOPs of the problem's epochs (e.g. the fixed 90-epoch count), quality against the
benchmark's target, whatever target and epochs the run itself had. Valid FLOPS per watt =
Valid FLOPS / average measured power over the measured scope (see `energy`); absent, with the
reason, when nothing was measured.

An MLPerf result (a record `import-mlperf` made from a results tree: config.mlperf) is timed
as MLPerf times it, run_stop - run_start, and the results of one system are one submission
scored by MLPerf's rule: the mean of the runs' times after dropping the fastest and the
slowest, a run that did not converge counting as the slowest, more than one refusing it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from hpcai500_tf.config import (
    LAYER_IDS,
    Benchmark,
    Convention,
    Level,
    Repeatability,
    reference_allows,
    reference_text,
)
from hpcai500_tf.errors import UserError
from hpcai500_tf.models.kernel_choices import COUNTED_AS
from hpcai500_tf.record import LAYER_KEYS, METHOD_FIELDS, PLACEMENT_FIELDS
from hpcai500_tf.results.record_builder import not_rankable_reasons
from hpcai500_tf.validation import is_finite_number

MLPERF_READING = "MLPerf's: run_stop - run_start of the log, scored by its last evaluation"
# MLPerf Training's rule for ResNet in every round it ran (v0.5 to v4.0): 5 result files
# (mlperf_logging.benchmark_meta), the fastest and the slowest dropped, at most one that did not
# converge, which is then the slowest dropped (result_summarizer's max_dropped_scores).
MLPERF_RUNS = 5
MLPERF_MAX_NOT_CONVERGED = 1
# The range of a scaling.json factor (MLPerf's review committee's normalisation of a time):
# (0, 100] leaves room for any normalisation and keeps every time and score finite.
MAX_SCALING_FACTOR = 100.0


def scaling_factor_problem(factor) -> str | None:
    """Why `factor` is not a scaling factor (a finite number in (0, MAX_SCALING_FACTOR]), or
    None where it is one."""
    if isinstance(factor, bool) or not is_finite_number(factor):
        return f"not a finite number: {factor!r:.40}"
    if not 0 < factor <= MAX_SCALING_FACTOR:
        return f"{factor!r:.40} is not in (0, {MAX_SCALING_FACTOR:g}]"
    return None


def workers_lacking_energy(energy: dict) -> list[str]:
    """What a measured energy block says it lacks of the other workers of a multi-worker run
    (energy.sampler.not_gathered's notes, "workers 1-7: energy not gathered (...)", and a
    worker's boards beyond the slots): the power is then some workers' alone."""
    return [
        note
        for note in energy.get("parts_not_measured") or []
        if note.startswith("worker") and " not gathered " in note
    ]


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
    equal to quality.target; the benchmark's under a convention that reads records at its
    problem), n and the FLOP basis the convention's; an MLPerf result timed as MLPerf does."""
    rule = benchmark.convention(convention)
    quality = record["quality"]
    if record["status"] not in ("completed", "imported"):
        raise UserError(f"cannot score a run whose status is '{record['status']}'")
    if not quality["measured"]:
        raise UserError("cannot score a throughput-only run: its quality was not measured")
    target = benchmark.target_quality if reads_at_problem(rule) else quality["target"]
    seconds, reading = quality["time_to_quality_s"], quality["reading"]
    identity = mlperf_result(record)
    if identity is not None:
        timeline = record["timeline"]
        seconds, reading = timeline["run_stop"] - timeline["run_start"], MLPERF_READING
        factor = identity.get("scaling_factor")
        if factor is not None:  # the review committee's normalisation (scaling.json)
            problem = scaling_factor_problem(factor)
            if problem:
                raise UserError(f"config.mlperf.scaling_factor is not a factor ({problem})")
            seconds, reading = seconds * factor, f"{reading}, x {factor:g} (MLPerf's scaling)"
    if rule.flops_per_example is None:
        total, basis = record["flops"]["total"], record["flops"]["basis"]
        kernels = record["layers"]["L7"].get("kernels")
        if basis == "tensorflow-profiler" and kernels:
            # The profiler counts the ops that ran: the CPU workarounds' fused batch norm has
            # no count, stock Keras batch norm's ops do (a few % of the step).
            basis = f"{basis} ({COUNTED_AS.get(kernels, kernels)} kernels)"
    else:
        total = rule.flops_per_example * benchmark.epochs * _examples_per_epoch(quality)
        basis = rule.flop_basis
    energy = record["energy"]
    watts, note = scored_power(energy)
    try:
        factor = quality_factor(quality["achieved"], target, rule.penalty_exponent, cap)
        flops = total / seconds
        valid = flops * factor
        per_watt = None if watts is None else valid / watts
    except (OverflowError, ZeroDivisionError):
        factor = flops = valid = per_watt = math.inf
    if not all(math.isfinite(x) for x in (seconds, factor, flops, valid, per_watt or 0.0)):
        raise UserError(
            f"the score is not a finite number (time {seconds:.3g} s, quality {quality['achieved']}"
            f", target {target:.3g}, FLOPs {total:.3g}, watts {watts}): a record that cannot "
            "be scored"
        )
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
        reading=reading,
        first_crossing_s=(quality["first_crossing"] or {}).get("elapsed_s"),
    )


def scored_power(energy: dict) -> tuple[float | None, str]:
    """The average power a score divides by, and the energy note beside it: None where energy
    was not measured, or was measured without some workers of a multi-worker run (their
    power left out, a per-watt figure would be inflated: `workers_lacking_energy`)."""
    if not energy["measured"]:
        return None, f"not measured: {energy['reason']}"
    lacking = workers_lacking_energy(energy)
    if lacking:
        return None, (
            f"not measured in full: {'; '.join(lacking)}; no Valid FLOPS per watt (the "
            f"{energy['average_watts']:.4g} W measured, {energy['scope']}, leaves them out)"
        )
    rate = energy["sample_hz"]
    note = f"measured: {energy['scope']}; readings cover {energy['coverage']:.1%} of the run"
    if rate is not None:
        note += f" at {rate:.3g} samples/s"
    if energy["quality_flags"]:
        note += " (" + "; ".join(energy["quality_flags"]) + ")"
    return energy["average_watts"], note


def reads_at_problem(rule: Convention) -> bool:
    """Whether a convention reads every record at the benchmark's problem (see the module's
    doc): those that bring their own FLOP count per example."""
    return rule.flops_per_example is not None


def _examples_per_epoch(quality: dict) -> float:
    """The run's epoch size: its examples to the last evaluation over that evaluation's epoch."""
    end = quality["curve"][-1]
    if not end["epoch"] > 0:
        raise UserError("cannot count the problem's FLOPs: the last evaluation is at epoch 0")
    return end["examples"] / end["epoch"]


def mlperf_result(record: dict) -> dict | None:
    """Which result of which MLPerf system a record is (config.mlperf of a record imported
    from a results tree), or None for any other record."""
    identity = record["config"].get("mlperf")
    if isinstance(identity, dict) and isinstance(identity.get("system_folder"), str):
        return identity
    return None


def result_file(record: dict) -> str:
    """Which result file of which system folder (resolved) an MLPerf record was made from."""
    identity = record["config"]["mlperf"]
    return json.dumps(
        [identity["system_folder"], identity.get("benchmark"), identity.get("result")]
    )


def converged(record: dict) -> bool:
    """MLPerf's reading of a run: it ended in success and an evaluation reached its target."""
    return record["status"] == "imported" and record["quality"]["first_crossing"] is not None


def mixed_bases(scores: list[Score]) -> str | None:
    """A warning when scores count FLOPs on different bases (their FLOPS are not alike)."""
    bases = sorted({s.flop_basis for s in scores})
    if len(bases) < 2:
        return None
    return (
        f"FLOPs counted on different bases ({', '.join(bases)}): FLOPS and Valid FLOPS of "
        "these records are not counted alike; --convention published-2020 puts them on one"
    )


def refusal(
    record: dict,
    benchmark: Benchmark,
    level: Level,
    convention: str = "stated",
    result_needed: bool = True,
    sample_allowed: bool = False,
) -> list[str]:
    """Every rule of the level this record breaks; empty when it may be ranked. A convention
    that reads records at the benchmark's problem leaves their own target and epochs free;
    without `result_needed` (an MLPerf run that did not converge) the run's status and result
    are not asked for. An ensemble member (trained on its bootstrap sample) is ranked only
    as one of its ensemble's (`sample_allowed`)."""
    reasons = []
    if record["benchmark"] != benchmark.name:
        return [f"benchmark '{record['benchmark']}', not '{benchmark.name}'"]
    if result_needed and record["status"] not in ("completed", "imported"):
        reasons.append(f"run status is '{record['status']}'")
    if not record["quality"]["measured"]:
        reasons.append("quality not measured")
    problem = record["layers"]["L9"]
    required = benchmark.problem()
    free = ("target_quality", "epochs")
    if reads_at_problem(benchmark.convention(convention)):
        # what is left of the record's reasons when its problem is the benchmark's
        own = not_rankable_reasons(benchmark, {**problem, **{k: required[k] for k in free}})
        required = {key: value for key, value in required.items() if key not in free}
    else:  # the L9 differences are said below, once
        listed = not_rankable_reasons(benchmark, {key: problem.get(key) for key in required})
        own = [reason for reason in record["not_rankable_reasons"] if reason not in listed]
        if not record["rankable"] and not own and not listed:
            own = ["the record says so without a reason"]
    if own:
        reasons.append("not rankable: " + "; ".join(own))
    for key, expected in required.items():
        if problem.get(key) != expected:
            reasons.append(f"L9 problem: {key} {problem.get(key)!r} is not {expected!r}")
    if problem.get("training_sample") and not sample_allowed:
        reasons.append(
            "L9 problem: trained on its bootstrap sample of the training data (an ensemble "
            "member): its ensemble's record is ranked, not it"
        )
    for layer in LAYER_IDS[:-1]:
        if layer in level.may_differ:
            continue
        actual = record["layers"][layer]
        for key, expected in benchmark.reference_layers.get(layer, {}).items():
            if not reference_allows(expected, actual.get(key)):
                # a record made before the field existed does not say what it trained
                shown = repr(actual[key]) if key in actual else "(not recorded)"
                reasons.append(
                    f"{layer} {LAYER_KEYS[layer]}: {key} {shown} differs from the "
                    f"reference {reference_text(expected)} (fixed at the {level.name} level)"
                )
    return reasons


def _cv(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean else None


@dataclass
class Submission:
    """The runs of one system, scored by the mean of its runs: records equal on all nine
    layers but the seed (`rule` "hpcai500"), or the results of one MLPerf system ("mlperf")."""

    label: str
    paths: list[str] = field(default_factory=list)  # the runs scored
    scores: list[Score] = field(default_factory=list)
    valid_flops: float = 0.0
    time_to_quality_s: float = 0.0
    cv_time_to_quality: float | None = None
    cv_valid_flops: float | None = None
    flagged: bool = False
    notes: list[str] = field(default_factory=list)  # why it is flagged
    quality: float = 0.0  # the mean quality of the runs the mean counts
    system: dict = field(default_factory=dict)  # system_facts of its first run
    rule: str = "hpcai500"
    not_converged: list[str] = field(default_factory=list)  # MLPerf runs that did not
    dropped: list[str] = field(default_factory=list)  # runs the olympic mean leaves out


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
    submission with several seeds); the results of one MLPerf system are one submission."""
    identity = mlperf_result(record)
    if identity is not None:
        return json.dumps(["mlperf", identity["system_folder"], identity.get("benchmark")])
    layers = {name: dict(values) for name, values in record["layers"].items()}
    layers["L8"].pop("seed", None)
    # Neither the nodes a run was given nor how a fact was found makes another submission.
    for layer, name in PLACEMENT_FIELDS | METHOD_FIELDS:
        layers[layer].pop(name, None)
    return json.dumps(layers, sort_keys=True)


def _label(record: dict) -> str:
    hardware = record["layers"]["L1"]
    framework = record["layers"]["L5"]
    identity = mlperf_result(record)
    if identity is not None:  # as MLPerf's tables name it
        return (
            f"{identity.get('submitter')} {hardware.get('system_name') or identity.get('system')}"
        )
    system = hardware.get("summary") or hardware.get("cpu_model") or "unknown system"
    stack = " ".join(
        str(framework[k]) for k in ("framework", "framework_version") if framework.get(k)
    )
    return f"{system} | {stack}" if stack else system


def system_facts(record: dict) -> dict:
    """What a ranking shows of a record's system: accelerator model and count, nodes and
    framework; None where the record does not say."""
    hardware, stack = record["layers"]["L1"], record["layers"]["L5"]
    accelerator, count = hardware.get("accelerator_model"), hardware.get("accelerator_count")
    nodes, devices = hardware.get("nodes"), hardware.get("accelerators")
    if accelerator is None and isinstance(devices, list):  # a run of this project's
        # L1 is worker 0's: the GPUs it computed on, its share; every worker has an equal one
        used = [d for d in devices if isinstance(d, dict) and d.get("visible") is not False]
        accelerator = ", ".join(sorted({str(d.get("model")) for d in used})) or None
        workers = _fact_count(hardware.get("workers")) or 1
        placed = record["layers"]["L3"].get("nodes")
        nodes = len(placed) if isinstance(placed, list) and placed else None
        nodes = 1 if nodes is None and workers == 1 else nodes  # else not recorded (PyTorch)
        count = len(used) * workers
    framework = " ".join(str(stack[k]) for k in ("framework", "framework_version") if stack.get(k))
    return {
        "accelerator": _fact_text(accelerator),
        "accelerators": _fact_count(count),
        "nodes": _fact_count(nodes),
        "framework": framework or None,
    }


def _fact_text(value) -> str | None:
    """A system fact as the text a ranking shows: a list (an imported sidecar's L1 may hold
    one) as its distinct entries, anything else as written; None where empty."""
    if isinstance(value, list):
        value = ", ".join(sorted({str(v) for v in value}))
    if value is None:
        return None
    return str(value).strip() or None


def _fact_count(value) -> int | None:
    """A count a ranking shows: a whole number, else None (not recorded, or not a count)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    whole = isinstance(value, int) or (math.isfinite(value) and value.is_integer())
    return int(value) if whole and value >= 0 else None


def _hpcai500_rule(submission: Submission, repeatability: Repeatability) -> str | None:
    """The project's repeatability rule (levels.toml): why the submission is refused, or None
    with its means set."""
    missed = sum(not x.quality >= x.target for x in submission.scores)
    if missed > repeatability.max_runs_missing_target:
        return (
            f"runs of one submission: {missed} of {len(submission.paths)} missed the target; "
            f"at most {repeatability.max_runs_missing_target} may"
        )
    # One set of runs for every mean: with enough runs, the fastest and slowest dropped
    scores = submission.scores
    kept = sorted(range(len(scores)), key=lambda i: scores[i].time_to_quality_s)
    if len(kept) >= repeatability.olympic_min_runs:
        kept = kept[1:-1]
    submission.dropped = [path for i, path in enumerate(submission.paths) if i not in kept]
    submission.valid_flops = statistics.fmean(scores[i].valid_flops for i in kept)
    submission.time_to_quality_s = statistics.fmean(scores[i].time_to_quality_s for i in kept)
    submission.quality = statistics.fmean(scores[i].quality for i in kept)
    if len(submission.paths) < repeatability.min_runs:
        submission.notes.append(
            f"{len(submission.paths)} run(s): fewer than the {repeatability.min_runs} a "
            "result needs (MLPerf's rule)"
        )
    return None


def _mlperf_rule(submission: Submission) -> str | None:
    """MLPerf's rule (result_summarizer's): sorted by time, the fastest and the slowest run
    dropped, a run that did not converge being the slowest; why it is refused, or None with
    the means of the runs left set."""
    failed, runs = len(submission.not_converged), len(submission.paths + submission.not_converged)
    if failed > MLPERF_MAX_NOT_CONVERGED:
        return (
            f"MLPerf's rule: {failed} of the system's {runs} runs did not converge; at most "
            f"{MLPERF_MAX_NOT_CONVERGED} may (it counts as the slowest)"
        )
    scores = submission.scores
    order = sorted(range(len(scores)), key=lambda i: scores[i].time_to_quality_s)
    kept = order[1 : len(order) - (MLPERF_MAX_NOT_CONVERGED - failed)]
    if not kept:
        return f"MLPerf's rule: {runs} run(s) leave none once the fastest and slowest are dropped"
    submission.dropped = [submission.paths[i] for i in order if i not in kept]
    submission.dropped += submission.not_converged
    submission.time_to_quality_s = statistics.fmean(scores[i].time_to_quality_s for i in kept)
    submission.valid_flops = statistics.fmean(scores[i].valid_flops for i in kept)
    submission.quality = statistics.fmean(scores[i].quality for i in kept)
    if runs < MLPERF_RUNS:
        submission.notes.append(f"{runs} run(s): fewer than the {MLPERF_RUNS} MLPerf asks")
    return None


def rank(
    records: list[tuple[str, dict]],
    benchmark: Benchmark,
    level: Level,
    repeatability: Repeatability,
    cap: bool = False,
    convention: str = "stated",
) -> Ranking:
    """Rank records by Valid FLOPS at a level, grouping the runs of one system into
    submissions (equal-layer records; the results of an MLPerf system)."""
    groups: dict[str, Submission] = {}
    refused = []
    files: dict[str, str] = {}  # each MLPerf result file and the first record of it
    seen: dict[str, str] = {}  # each record's content and the first path given for it
    for path, record in records:
        mlperf = mlperf_result(record) is not None
        counted = not mlperf or converged(record)  # an MLPerf run that did not is kept apart
        reasons = refusal(record, benchmark, level, convention, result_needed=counted)
        content = json.dumps(record, sort_keys=True)
        if content in seen:  # one run given twice (or a copy) is not two runs of a submission
            reasons = [f"the same record as {seen[content]}: a submission counts a run once"]
        elif mlperf and result_file(record) in files:
            first = files[result_file(record)]
            reasons = [f"the same MLPerf result file as {first}: a submission counts it once"]
        elif mlperf:
            files[result_file(record)] = path
        seen.setdefault(content, path)
        if not reasons and counted:
            try:
                run_score = score(record, benchmark, cap, convention)
            except UserError as error:
                reasons = [str(error)]
        if reasons:
            refused.append((path, reasons))
            continue
        key = submission_key(record)
        if key not in groups:
            groups[key] = Submission(
                _label(record), system=system_facts(record), rule="mlperf" if mlperf else "hpcai500"
            )
        submission = groups[key]
        if counted:
            submission.paths.append(path)
            submission.scores.append(run_score)
        else:
            submission.not_converged.append(path)
    for key, submission in list(groups.items()):
        if submission.rule == "mlperf":
            why = _mlperf_rule(submission)
        else:
            why = _hpcai500_rule(submission, repeatability)
        if why:
            del groups[key]
            refused += [(path, [why]) for path in submission.paths + submission.not_converged]
            continue
        valid = [s.valid_flops for s in submission.scores]
        times = [s.time_to_quality_s for s in submission.scores]
        submission.cv_valid_flops = _cv(valid)
        submission.cv_time_to_quality = _cv(times)
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
                **s.system,
                "rule": s.rule,
                "runs": len(s.paths) + len(s.not_converged),
                "records": [str(Path(p)) for p in s.paths],
                "not_converged": s.not_converged,
                "dropped": s.dropped,
                "valid_flops": s.valid_flops,
                "time_to_quality_s": s.time_to_quality_s,
                "time_reading": sorted({x.reading for x in s.scores}),
                "quality": s.quality,
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


PUBLISHED_DIR = Path(__file__).resolve().parents[2] / "examples" / "published_2020"
PUBLISHED = "published-2020"  # the convention under which that table's figures come back


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

    if with_published or convention == PUBLISHED:  # that table's reading: beside its entries
        given = {Path(path).resolve() for path, _ in records}
        records = records + [x for x in published_records() if Path(x[0]).resolve() not in given]
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
    if with_published and convention == "stated" and PUBLISHED in benchmark.conventions:
        conventions.append("published-2020")  # the ranking's own reading beside the stated one
    return [rank(records, benchmark, level, repeatability, cap, name) for name in conventions]
