"""The record of one run, assembled from its progress on any framework (the file's format and
checks are hpcai500_tf/record.py and results/record_builder.py)."""

from __future__ import annotations

from hpcai500_tf.config import Setup
from hpcai500_tf.results.record_builder import build_record
from hpcai500_tf.run.progress import Progress


def make_record(
    setup: Setup,
    layer_values: dict,
    workload,
    progress: Progress,
    flops: dict,
    status: str,
    warnings: list[str],
    artifacts: dict,
    energy: dict,
    framework: str = "tensorflow",
) -> dict:
    """The record of a finished (or stopped) run, from any framework's runner."""
    run_start, run_stop = progress.timed_span()
    return build_record(
        setup.benchmark,
        preset=setup.preset,
        status=status,
        tool="hpcai500-tf",
        framework=framework,
        layers=layer_values,
        config=setup.config,
        timeline={
            "init_start": progress.init_start,
            "run_start": run_start,
            "run_stop": run_stop,
            "segments": progress.segments,
            "epochs": progress.epochs,
        },
        curve=progress.curve,
        metric=workload.quality_metric,
        target=setup.training.target_quality,
        measured=workload.measures_quality,
        flops=flops,
        energy=energy,
        warnings=warnings,
        artifacts=artifacts,
    )
