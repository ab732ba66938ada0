"""The ensemble form of `train BENCHMARK --instances M --ensemble` (HPC AI500 V3.0's scalable
form, as this project reads it): M members, each trained on its own bootstrap sample of the
training data, scored together by the quality of their ensemble.

Every member runs with the run's seed (so procedural data, drawn from it, is the same split
for all, and the evaluation set is one) and its own `data.bootstrap_member` (its index): its
sample is N draws with replacement from the N training examples, seeded by (seed, index),
recorded in its L9 (data/bootstrap.py). Each member saves its evaluation outputs at every
evaluation (run/predictions.py): the classifier its probabilities, the detector its
detections. The ensemble's evaluation, derived on every read from those files, at each
member's final evaluation, by the benchmark's merging rule (MERGING, named in the record):
for image_classification the mean of the members' probabilities, top-1 against the labels;
for extreme_weather the members' detections fused per image and class (measure/box_fusion.py),
the benchmark's mAP at IoU 0.5 against the ground truth. Its time is the window of the
weak-scaling form (earliest run_start to latest run_stop, from the members' MLPerf logs); its
FLOPs are the sum of its members'; its Valid FLOPS is that sum over the window times the
quality factor (q / target)^n of the ensemble's quality (results/scoring.py's rule, n of the
benchmark's stated convention).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hpcai500_tf.errors import UserError
from hpcai500_tf.measure import box_fusion, detection_lists
from hpcai500_tf.measure.mean_average_precision import EWA_THRESHOLD, mean_average_precision
from hpcai500_tf.run import predictions

FORM = "ensemble"
RULE = {
    "name": "HPC AI500 V3.0 ensemble (bootstrap members), as this project reads it",
    "version": "ensemble quality from the members' merged evaluations (the rule's merging); "
    "Valid FLOPS",
    "window": "from the earliest run_start of any member to the latest run_stop of any "
    "member, both read from the members' MLPerf logs",
    "counted": "every member that completed with its final evaluation's outputs saved is in "
    "the ensemble; one that failed, diverged or was stopped is left out, named, and stays "
    "in the window",
    "pruning": "none: every member that completed is in the ensemble",
}
# How each benchmark's members make one ensemble's evaluation: the record's `rule.merging`.
MERGING = {
    "image_classification": "the mean of the members' probabilities, example by example; "
    "quality: the top-1 accuracy of the mean against the labels",
    "extreme_weather": box_fusion.RULE + "; quality: the benchmark's mAP at IoU "
    f"{EWA_THRESHOLD:g} of the fused detections against the ground truth",
}
SAMPLE_FIELD = ("L9", "training_sample")  # each member's own draw: not a layer difference


def check_arguments(args, backend) -> None:
    """What `--ensemble` cannot go with, in one line before anything starts."""
    from hpcai500_tf import config
    from hpcai500_tf.workload_config import bootstrap_problem, data_and_model

    if args.instances is None:
        raise UserError("--ensemble trains M members at once: give --instances M with it")
    if args.resume or args.run_dir:
        return  # --instances refuses them next, in its own words
    if not backend.saves_predictions:
        raise UserError(
            f"--ensemble is not built for --framework {backend.name}: its evaluation does not "
            "save its outputs"
        )
    setup = config.run_setup(args.benchmark, args.preset, args.set, args.config)
    if setup.benchmark.name not in MERGING:
        raise UserError(f"--ensemble is not built for {setup.benchmark.name}: no merging rule")
    data, _ = data_and_model(setup.benchmark.name, setup.config)
    if data.bootstrap_member != -1:
        raise UserError("data.bootstrap_member is set by --ensemble for each member: drop it")
    problem = bootstrap_problem(setup.benchmark.name, data.source)
    if problem:
        raise UserError("--ensemble: " + problem)
    if data.source == "imagenet" and _workers_per_member(args) > 1:
        raise UserError(
            "--ensemble on ImageNet TFRecords trains each member on one worker: on several, "
            "each reads whole evaluation files, and its rows have no evaluation-set order to "
            "merge (give as many workers or srun tasks as --instances)"
        )


def _workers_per_member(args) -> int:
    """Each member's workers: the srun step's tasks where this is one of several (the job's
    SLURM_NTASKS under salloc or a batch shell is no step: the members run here), else
    --workers, shared by --instances."""
    from hpcai500_tf.cluster import slurm

    tasks = slurm.step_tasks(os.environ)  # a batch shell with several tasks, no step: one line
    total = tasks if tasks > 1 else args.workers or args.instances
    return max(1, total // args.instances)


def member_arguments(args, index: int) -> list[str]:
    """What member `index`'s `train` adds: its bootstrap sample (none outside an ensemble)."""
    return ["--set", f"data.bootstrap_member={index}"] if getattr(args, "ensemble", False) else []


def seeds(args, base: int, instances: int) -> list[int] | None:
    """An ensemble's members' seeds: the run's, each (they differ by their samples); None
    outside an ensemble (the weak-scaling form's own seeds)."""
    return [base] * instances if getattr(args, "ensemble", False) else None


def mark(data: dict, args) -> None:
    """A throughput record made the ensemble's: its form and rule, with its benchmark's
    merging."""
    if getattr(args, "ensemble", False):
        data["form"] = FORM
        data["rule"] = {**RULE, "merging": MERGING[data["benchmark"]]}


# ----------------------------------------------------------------------------- the merging


@dataclass(frozen=True)
class Merging:
    """How one benchmark's members' saved evaluations make the ensemble's: what a member's
    file holds (`load`: its outputs and the truth they are scored against), why another
    member's cannot join the first's (`problem`), one set of outputs' quality, and the
    members' outputs merged into the ensemble's (`merge`)."""

    saved: str  # what a member's file holds, in words
    quality_name: str  # the quality, in words
    load: Callable[[Path, int], tuple]
    problem: Callable[[tuple, tuple], str | None]
    quality: Callable[[object, object], float]
    merge: Callable[[list], object]
    examples: Callable[[object], int]


def _labels_problem(first: tuple, other: tuple) -> str | None:
    (probabilities, labels), (own, own_labels) = first, other
    if not np.array_equal(own_labels, labels):
        return "evaluation examples are not the other members' (their labels differ)"
    if own.shape != probabilities.shape:
        return f"probabilities {own.shape} are not the shape of the others' {probabilities.shape}"
    return None


def _truth_problem(first: tuple, other: tuple) -> str | None:
    (_, truth), (_, own_truth) = first, other
    if not np.array_equal(own_truth[0], truth[0]) or own_truth[1] != truth[1]:
        return "evaluation images are not the other members' (their ground-truth boxes differ)"
    return None


def _load_detections(run_dir: Path, epoch: int) -> tuple:
    detections, rows, num_classes = predictions.load_detections(run_dir, epoch)
    return detections, (rows, num_classes)


def _map(detections: list, truth: tuple) -> float:
    """The benchmark's own quality (workloads/extreme_weather.py): mAP at IoU 0.5."""
    rows, num_classes = truth
    try:
        value, _ = mean_average_precision(
            detections, detection_lists.ground_truth(rows), num_classes, EWA_THRESHOLD
        )
    except ValueError as error:
        raise UserError(f"mAP of the saved detections: {error}") from None
    return value


MERGINGS = {
    "image_classification": Merging(
        "probabilities", "top-1", predictions.load, _labels_problem, predictions.top1,
        lambda held: np.mean(np.stack(held), axis=0), lambda labels: int(labels.size),
    ),
    "extreme_weather": Merging(
        "detections", "mAP@0.5", _load_detections, _truth_problem, _map, box_fusion.fuse,
        lambda truth: len(truth[0]),
    ),
}  # fmt: skip


# ----------------------------------------------------------------------------- the score


@dataclass
class EnsembleScore:
    form: str
    benchmark: str
    instances: int
    members_in: int  # the members in the ensemble
    window_s: float
    quality: float  # the ensemble's, by its benchmark's metric (quality_name)
    target: float
    quality_factor: float
    reached_target: bool
    total_flops: float  # every member in the ensemble's, summed
    flops: float  # total_flops over the window
    valid_flops: float
    average_watts: float | None
    valid_flops_per_watt: float | None
    energy_note: str
    evaluated_examples: int  # examples (images, for the detector) evaluated
    members: list[dict] = field(default_factory=list)  # index, status, quality, in, why
    rule: str = ""
    merging: str = ""  # the record's merging rule, in words
    quality_name: str = "top-1"
    saved: str = "probabilities"  # what each member saved

    @property
    def rank_value(self) -> float:
        return self.valid_flops

    def summary(self) -> str:
        return (
            f"ensemble of {self.members_in} of {self.instances} member(s): {self.quality_name} "
            f"{self.quality:.4f} (target {self.target:g}) in {self.window_s:.1f} s, "
            f"{self.valid_flops:.4g} Valid FLOPS"
        )


def _member_outputs(parent: Path, member: dict, merging: Merging):
    """(outputs, truth) of a member's final evaluation, or the reason it is not in the
    ensemble (a string)."""
    rec = member["record"]
    if rec is None:
        return member["problem"] or "no record"
    if rec["status"] != "completed":
        return f"status {rec['status']}"
    curve = rec["quality"]["curve"]
    if not curve:
        return "never evaluated"
    try:
        return merging.load(parent / member["run_dir"], curve[-1]["epoch"])
    except UserError as error:
        return str(error)


def _shown(member: dict, quality_here: float | None, why: str | None) -> dict:
    rec = member["record"]
    return {
        "index": member["index"], "seed": member["seed"],
        "status": rec["status"] if rec else "no record",
        "quality": rec["quality"]["achieved"] if rec else None,
        "quality_from_predictions": quality_here, "in_ensemble": why is None, "why": why,
        "sample": (rec["layers"]["L9"].get("training_sample") or {}).get("digest") if rec else None,
        "run_start": member["run_start"], "run_stop": member["run_stop"],
    }  # fmt: skip


def evaluate(path: Path, members: list[dict], benchmark_name: str):
    """The ensemble's quality over the members in it (by `benchmark_name`'s merging), each
    member as shown, and the examples evaluated; one line where no member can be in it or
    their evaluations are not of the same examples."""
    merging = MERGINGS.get(benchmark_name)
    if merging is None:
        raise UserError(f"{path}: no merging rule for benchmark '{benchmark_name}'")
    shown, held = [], []
    for member in members:
        found = _member_outputs(path.parent, member, merging)
        if isinstance(found, str):
            shown.append(_shown(member, None, found))
            continue
        problem = merging.problem(held[0], found) if held else None
        if problem:
            raise UserError(f"{path}: member {member['index']}'s {problem}: not one ensemble")
        held.append(found)
        shown.append(_shown(member, merging.quality(*found), None))
    if not held:
        raise UserError(f"{path}: no member completed with its {merging.saved}: no ensemble")
    truth = held[0][1]
    merged = merging.merge([outputs for outputs, _ in held])
    return merging.quality(merged, truth), shown, merging.examples(truth)


def score(path: Path, data: dict, members: list[dict], window: tuple[float, float], benchmark):
    """The ensemble record at `path` scored from its members' files (members as
    throughput.read_member reads them; the window their MLPerf logs give)."""
    from hpcai500_tf.results import scoring

    quality, shown, examples = evaluate(path, members, data["benchmark"])
    records = [m["record"] for m, s in zip(members, shown, strict=True) if s["in_ensemble"]]
    target = records[0]["quality"]["target"]
    exponent = benchmark.convention("stated").penalty_exponent
    factor = 0.0 if quality == 0 else scoring.quality_factor(quality, target, exponent)
    total = float(sum(rec["flops"]["total"] for rec in records))
    window_s = window[1] - window[0]
    flops = total / window_s
    watts, note = scoring.scored_power(data["energy"])
    valid = flops * factor
    per_watt = None if watts is None else valid / watts
    if not all(math.isfinite(v) for v in (flops, valid, per_watt or 0.0)):
        raise UserError(f"{path}: the score is not a finite number (window {window_s:.3g} s)")
    merging = MERGINGS[data["benchmark"]]
    return EnsembleScore(
        data["form"], data["benchmark"], data["instances"], len(records), window_s, quality,
        target, factor, quality >= target, total, flops, valid, watts, per_watt, note,
        examples, shown, data["rule"]["version"],
        # a record made before `merging` was recorded: the classifier's, the only one then
        data["rule"].get("merging", MERGING[data["benchmark"]]), merging.quality_name,
        merging.saved,
    )  # fmt: skip
