"""The one place a record is assembled, whoever made the run: `hpcai500-tf train`, the PyTorch
runner (through run/record.py), `hpcai500-tf import-mlperf` and the published-ranking
tool. Each caller says what it knows (the layers, the timeline, the curve, the FLOP count, the
energy); this module fills what every record states the same way: the schema and kind, the
level, the source, the quality reading (SPEC section 3), the FLOP total and why the record
is not rankable.

Nothing here imports TensorFlow: the PyTorch runner's process must never load it.
"""

from __future__ import annotations

from hpcai500_tf import __version__
from hpcai500_tf import record as record_io
from hpcai500_tf.config import Benchmark

LEVEL = "free"  # every record is made at the free level; `verdict` judges the others


def not_rankable_reasons(
    benchmark: Benchmark,
    problem: dict,
    *,
    measured: bool = True,
    trained_epochs: float | None = None,
) -> list[str]:
    """Why a result cannot be ranked: no quality measured (random data), data that differ from
    the benchmark's, a problem (L9) other than the benchmark's, or fewer epochs trained than
    the problem asks for (`trained_epochs`, where the caller counts them: an imported log)."""
    reasons = []
    if not measured:
        reasons.append("random data: quality not measured (throughput only)")
    reasons += [f"data: {difference}" for difference in problem.get("data_differences", [])]
    for key, expected in benchmark.problem().items():
        if problem.get(key) != expected:
            reasons.append(f"{key} is {problem.get(key)!r}, the benchmark's is {expected!r}")
    required = problem.get("epochs")
    if trained_epochs is not None and isinstance(required, int | float):
        if trained_epochs < required:
            reasons.append(
                f"the log trained {trained_epochs:g} epochs, fewer than the problem's "
                f"{required:g}: scored at the end of the last required epoch, it has no such epoch"
            )
    return reasons


def build_record(
    benchmark: Benchmark,
    *,
    preset: str,
    status: str,
    tool: str,
    framework: str | None,
    layers: dict,
    config: dict,
    timeline: dict,
    curve: list[dict],
    metric: str,
    target: float,
    measured: bool,
    flops: dict,
    energy: dict,
    warnings: list[str],
    artifacts: dict,
    imported_from: str | None = None,
    tool_version: str = __version__,
    trained_epochs: float | None = None,
) -> dict:
    """A record from what the caller knows.

    `timeline` holds init_start, run_start, run_stop, segments and epochs; `curve` the
    evaluations; `flops` the count without its total. A completed run that measured quality
    and whose last evaluation is 0 is recorded as stopped (it has no result to score), with a
    warning appended to `warnings`. The record is not validated here: saving it does that.
    """
    quality = record_io.quality_result(curve, target, measured)
    if quality["measured"] and quality["achieved"] is None and status == "completed":
        status = "stopped"
        warnings.append(  # the score reads the quality a run ends with (record.quality_result)
            f"the last evaluation's quality is 0 ({metric}): no result to score"
        )
    reasons = not_rankable_reasons(
        benchmark, layers["L9"], measured=measured, trained_epochs=trained_epochs
    )
    examples = quality["examples_to_quality"]
    return {
        "schema_version": record_io.SCHEMA_VERSION,
        "kind": record_io.KIND,
        "benchmark": benchmark.name,
        "preset": preset,
        "level": LEVEL,
        "status": status,
        "rankable": not reasons,
        "not_rankable_reasons": reasons,
        "source": {
            "tool": tool,
            "tool_version": tool_version,
            "framework": framework,
            "imported_from": imported_from,
        },
        "layers": layers,
        "config": config,
        "timeline": {
            "init_start": timeline["init_start"],
            "run_start": timeline["run_start"],
            "run_stop": timeline["run_stop"],
            "segments": timeline["segments"],
            "epochs": timeline["epochs"],
        },
        "quality": {"metric": metric, "target": target, **quality, "curve": curve},
        "flops": {
            **flops,
            "total": None if examples is None else flops["per_example_training"] * examples,
        },
        "energy": energy,
        "warnings": warnings,
        "artifacts": artifacts,
    }
