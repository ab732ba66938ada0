"""How to run a benchmark beyond its config (`train`'s options): what a backend's trainer
and the lifecycle read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpcai500_tf.run.resume import Plan


@dataclass(frozen=True)
class RunOptions:
    """How to run a benchmark, beyond its config: what `train`'s options say."""

    data_dir: str | None = None
    out_dir: str | Path = "runs"
    resume: Plan | str | None = None  # a stopped run: the CLI's plan, or its directory
    power_hz: float = 10.0  # 0: no power sampling
    meter_log: str | None = None  # a node meter's log, read when the run ends
    run_dir: str | Path | None = None  # an empty directory the launcher made for the run
    start_over_unsaved: bool = False  # --resume-or-start: set aside a start that saved nothing
    profile_steps: tuple[int, int] | None = None  # global train steps to trace
    allow_cpu: bool = False  # run where the framework sees fewer GPUs than the machine has
    device: str = "auto"  # PyTorch's device: auto, cpu or cuda
