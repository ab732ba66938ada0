"""The ensemble form of `train BENCHMARK --instances M --ensemble` (HPC AI500 V3.0's scalable
form, as this project reads it): M members, each trained on its own bootstrap sample of the
training data, scored together by the quality of their ensemble.

Every member runs with the run's seed (so procedural data, drawn from it, is the same split
for all, and the evaluation set is one) and its own `data.bootstrap_member` (its index): its
sample is N draws with replacement from the N training examples, seeded by (seed, index),
recorded in its L9 (data/bootstrap.py). Each member saves its evaluation probabilities at
every evaluation (run/predictions.py). The ensemble's evaluation, derived on every read from
those files: the mean of the members' probabilities at each one's final evaluation, top-1
against the labels; its time is the window of the weak-scaling form (earliest run_start to
latest run_stop, from the members' MLPerf logs); its FLOPs are the sum of its members'; its
Valid FLOPS is that sum over the window times the quality factor (q / target)^n of the
ensemble's quality (results/scoring.py's rule, n of the benchmark's stated convention).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hpcai500_tf.errors import UserError
from hpcai500_tf.run import predictions

FORM = "ensemble"
RULE = {
    "name": "HPC AI500 V3.0 ensemble (bootstrap members), as this project reads it",
    "version": "ensemble quality from the mean of the members' probabilities; Valid FLOPS",
    "window": "from the earliest run_start of any member to the latest run_stop of any "
    "member, both read from the members' MLPerf logs",
    "counted": "every member that completed with its final evaluation's probabilities saved "
    "is in the ensemble; one that failed, diverged or was stopped is left out, named, and "
    "stays in the window",
    "pruning": "none: every member that completed is in the ensemble",
}
SAMPLE_FIELD = ("L9", "training_sample")  # each member's own draw: not a layer difference


def check_arguments(args, backend) -> None:
    """What `--ensemble` cannot go with, in one line before anything starts."""
    from hpcai500_tf import config
    from hpcai500_tf.cluster import workers
    from hpcai500_tf.workload_config import BOOTSTRAP_SOURCES, data_and_model

    if args.instances is None:
        raise UserError("--ensemble trains M members at once: give --instances M with it")
    if args.resume or args.run_dir:
        return  # --instances refuses them next, in its own words
    if not backend.saves_predictions:
        raise UserError(
            f"--ensemble is not built for --framework {backend.name}: its evaluation does not "
            "save its probabilities"
        )
    if workers.under_slurm():
        raise UserError("--ensemble under srun is not built: run its members on one machine")
    setup = config.run_setup(args.benchmark, args.preset, args.set, args.config)
    if setup.benchmark.name != "image_classification":
        raise UserError(
            f"--ensemble is not built for {setup.benchmark.name}: the detector has no "
            "box-merging rule for its members' boxes here"
        )
    data, _ = data_and_model(setup.benchmark.name, setup.config)
    if data.bootstrap_member != -1:
        raise UserError("data.bootstrap_member is set by --ensemble for each member: drop it")
    if data.source != "procedural":
        raise UserError("--ensemble: " + BOOTSTRAP_SOURCES.format(source=data.source))


def member_arguments(args, index: int) -> list[str]:
    """What member `index`'s `train` adds: its bootstrap sample (none outside an ensemble)."""
    return ["--set", f"data.bootstrap_member={index}"] if getattr(args, "ensemble", False) else []


def seeds(args, base: int, instances: int) -> list[int] | None:
    """An ensemble's members' seeds: the run's, each (they differ by their samples); None
    outside an ensemble (the weak-scaling form's own seeds)."""
    return [base] * instances if getattr(args, "ensemble", False) else None


def mark(data: dict, args) -> None:
    """A throughput record made the ensemble's: its form and rule."""
    if getattr(args, "ensemble", False):
        data["form"], data["rule"] = FORM, dict(RULE)


# ----------------------------------------------------------------------------- the score


@dataclass
class EnsembleScore:
    form: str
    benchmark: str
    instances: int
    members_in: int  # the members in the ensemble
    window_s: float
    quality: float  # the ensemble's top-1 accuracy
    target: float
    quality_factor: float
    reached_target: bool
    total_flops: float  # every member in the ensemble's, summed
    flops: float  # total_flops over the window
    valid_flops: float
    average_watts: float | None
    valid_flops_per_watt: float | None
    energy_note: str
    evaluated_examples: int
    members: list[dict] = field(default_factory=list)  # index, status, quality, in, why
    rule: str = ""

    @property
    def rank_value(self) -> float:
        return self.valid_flops

    def summary(self) -> str:
        return (
            f"ensemble of {self.members_in} of {self.instances} member(s): top-1 "
            f"{self.quality:.4f} (target {self.target:g}) in {self.window_s:.1f} s, "
            f"{self.valid_flops:.4g} Valid FLOPS"
        )


def _member_predictions(parent: Path, member: dict):
    """(probabilities, labels, epoch) of a member's final evaluation, or the reason it is not
    in the ensemble (a string)."""
    rec = member["record"]
    if rec is None:
        return member["problem"] or "no record"
    if rec["status"] != "completed":
        return f"status {rec['status']}"
    curve = rec["quality"]["curve"]
    if not curve:
        return "never evaluated"
    epoch = curve[-1]["epoch"]
    try:
        probabilities, labels = predictions.load(parent / member["run_dir"], epoch)
    except UserError as error:
        return str(error)
    return probabilities, labels, epoch


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


def evaluate(path: Path, members: list[dict]) -> tuple[float, list[dict], int]:
    """The ensemble's top-1 accuracy over the members in it, each member as shown, and the
    examples evaluated; one line where no member can be in it or their examples differ."""
    shown, held, labels = [], [], None
    for member in members:
        found = _member_predictions(path.parent, member)
        if isinstance(found, str):
            shown.append(_shown(member, None, found))
            continue
        probabilities, own_labels, _ = found
        if labels is not None and not np.array_equal(own_labels, labels):
            raise UserError(
                f"{path}: member {member['index']}'s evaluation examples are not the other "
                "members' (their labels differ): not one ensemble"
            )
        if held and probabilities.shape != held[0].shape:
            raise UserError(
                f"{path}: member {member['index']}'s probabilities {probabilities.shape} are "
                f"not the shape of the others' {held[0].shape}: not one ensemble"
            )
        labels = own_labels
        held.append(probabilities)
        shown.append(_shown(member, predictions.top1(probabilities, own_labels), None))
    if not held:
        raise UserError(f"{path}: no member completed with its probabilities: no ensemble")
    mean = np.mean(np.stack(held), axis=0)
    return predictions.top1(mean, labels), shown, int(labels.size)


def score(path: Path, data: dict, members: list[dict], window: tuple[float, float], benchmark):
    """The ensemble record at `path` scored from its members' files (members as
    throughput.read_member reads them; the window their MLPerf logs give)."""
    from hpcai500_tf.results import scoring

    quality, shown, examples = evaluate(path, members)
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
    return EnsembleScore(
        data["form"], data["benchmark"], data["instances"], len(records), window_s, quality,
        target, factor, quality >= target, total, flops, valid, watts, per_watt, note,
        examples, shown, data["rule"]["version"],
    )  # fmt: skip
