"""Two records side by side: which of the nine layers differ, whether the pair is a fair
single-layer comparison, and their results with B/A ratios.

The methodology changes one layer and holds the rest: a pair is a valid single-layer
comparison when both solve the same problem (L9 equal) and exactly one of L1-L8 differs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from dataclasses import field as dataclass_field

from hpcai500_tf import config
from hpcai500_tf.errors import UserError
from hpcai500_tf.record import LAYER_KEYS, METHOD_FIELDS, PLACEMENT_FIELDS, training_throughput
from hpcai500_tf.results import scoring

_MISSING = "(absent)"


@dataclass(frozen=True)
class FieldDifference:
    layer: str
    field: str
    a: object
    b: object


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    a: float | None
    b: float | None

    @property
    def ratio(self) -> float | None:
        if self.a is None or self.b is None or self.a == 0:
            return None
        ratio = self.b / self.a
        return ratio if math.isfinite(ratio) else None  # never printed as inf or Infinity


@dataclass(frozen=True)
class Comparison:
    differing_layers: list[str]
    differences: list[FieldDifference]  # fields both records give, with different values
    unknown: list[FieldDifference]  # fields only one record gives: equality unknown
    valid: bool
    verdict: str
    metrics: list[Metric]
    flop_bases: tuple[str, str] = ("", "")
    warnings: list[str] = dataclass_field(default_factory=list)


def layer_differences(a: dict, b: dict) -> tuple[list[FieldDifference], list[FieldDifference]]:
    """(fields that differ, fields only one record gives). A field one side lacks (e.g.
    keras_version beside PyTorch) counts as a difference when its layer differs elsewhere;
    alone, whether the layer is equal is unknown."""
    differences, unknown = [], []
    for layer in LAYER_KEYS:
        fields_a, fields_b = a["layers"][layer], b["layers"][layer]
        for field in list({**fields_a, **fields_b}):
            if (layer, field) in PLACEMENT_FIELDS | METHOD_FIELDS:  # not what each ran on
                continue
            value_a, value_b = fields_a.get(field, _MISSING), fields_b.get(field, _MISSING)
            if value_a == value_b:
                continue
            item = FieldDifference(layer, field, value_a, value_b)
            (unknown if _MISSING in (value_a, value_b) else differences).append(item)
    differing = {d.layer for d in differences}
    differences += [u for u in unknown if u.layer in differing]
    unknown = [u for u in unknown if u.layer not in differing]
    order = list(LAYER_KEYS)
    differences.sort(key=lambda d: order.index(d.layer))
    return differences, unknown


def _verdict(a: dict, b: dict, differing: list[str], unknown: list[str]) -> tuple[bool, str]:
    if a["benchmark"] != b["benchmark"]:
        return False, f"not comparable: different benchmarks ({a['benchmark']}, {b['benchmark']})"
    if "L9" in differing:
        return False, "not comparable: the problem (L9: dataset, target, epochs) differs"
    named = [f"{layer} ({LAYER_KEYS[layer]})" for layer in differing]
    if len(differing) > 1:
        return False, f"not a single-layer comparison: {', '.join(named)} differ"
    if unknown:
        return False, (
            f"cannot confirm a single-layer comparison: {', '.join(unknown)} are recorded by "
            "only one side (give them in the import sidecar)"
        )
    if not differing:
        return False, "no layer differs: these are repeat runs of one system, not a comparison"
    return True, f"valid single-layer comparison: only {named[0]} differs"


def _score(record: dict, cap: bool) -> scoring.Score | None:
    try:
        return scoring.score(record, config.load_benchmark(record["benchmark"]), cap=cap)
    except UserError:
        return None  # diverged, stopped or throughput-only: no score to compare


def metrics(a: dict, b: dict, cap: bool = False) -> list[Metric]:
    score_a, score_b = _score(a, cap), _score(b, cap)

    def from_score(field):
        return (
            None if score_a is None else getattr(score_a, field),
            None if score_b is None else getattr(score_b, field),
        )

    quality_a, quality_b = a["quality"], b["quality"]
    return [
        Metric(
            "Training throughput",
            "examples/s",
            training_throughput(a),
            training_throughput(b),
        ),
        Metric("Time to quality", "s", *from_score("time_to_quality_s")),
        Metric("Quality at time to quality", quality_a["metric"], *from_score("quality")),
        Metric("Final quality", quality_a["metric"], quality_a["final"], quality_b["final"]),
        Metric(
            "Training FLOPs per example",
            "FLOPs",
            a["flops"]["per_example_training"],
            b["flops"]["per_example_training"],
        ),
        Metric("FLOPS", "FLOPS", *from_score("flops")),
        Metric("Valid FLOPS", "FLOPS", *from_score("valid_flops")),
        # the power a score divides by: none where some workers' energy is missing
        Metric(
            "Average power",
            "W",
            scoring.scored_power(a["energy"])[0],
            scoring.scored_power(b["energy"])[0],
        ),
        Metric("Valid FLOPS per watt", "FLOPS/W", *from_score("valid_flops_per_watt")),
    ]


def compare(a: dict, b: dict, cap: bool = False) -> Comparison:
    differences, unknown = layer_differences(a, b)
    order = list(LAYER_KEYS)
    differing = sorted({d.layer for d in differences}, key=order.index)
    unknown_layers = sorted({u.layer for u in unknown}, key=order.index)
    valid, verdict = _verdict(a, b, differing, unknown_layers)
    bases = (a["flops"]["basis"], b["flops"]["basis"])
    warnings = []
    if bases[0] != bases[1]:
        warnings.append(
            f"FLOPs counted on different bases ({bases[0]} vs {bases[1]}): the FLOPs, FLOPS "
            "and Valid FLOPS ratios compare counts made differently"
        )
    return Comparison(
        differing, differences, unknown, valid, verdict, metrics(a, b, cap), bases, warnings
    )


def to_json(comparison: Comparison, path_a: str, path_b: str) -> dict:
    return {
        "a": path_a,
        "b": path_b,
        "valid_single_layer_comparison": comparison.valid,
        "verdict": comparison.verdict,
        "flop_basis": {"a": comparison.flop_bases[0], "b": comparison.flop_bases[1]},
        "warnings": comparison.warnings,
        "differing_layers": comparison.differing_layers,
        "differences": [_shallow(d) for d in comparison.differences],
        "recorded_by_one_side_only": [_shallow(u) for u in comparison.unknown],
        "metrics": [{**_shallow(m), "ratio_b_over_a": m.ratio} for m in comparison.metrics],
    }


def _shallow(item) -> dict:
    """A dataclass's fields as a dict, its values as they are: `asdict` copies them level by
    level, recursively, so that a value nested a few hundred deep overflows Python's stack."""
    return {f.name: getattr(item, f.name) for f in fields(item)}
