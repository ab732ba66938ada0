"""The learning-rate schedule of both frameworks, in steps: linear warm-up from 0 to the peak
rate, then cosine decay to 0 or step decay by epochs (the reference recipe's, docs/
image_classification.md). `warmup_decay` derives it from the config once; the TensorFlow
optimizer evaluates it in the traced step (engine/optimizers.py `WarmupDecay`, built from
these fields), PyTorch in Python between steps (`rate`). Pure Python.

The cosine starts at step 0 and spans every step (`cosine_start = "step_0"`: the reference's
`tf.train.cosine_decay(peak, step, total_steps)`, which the warm-up overrides until it ends),
or starts where the warm-up ends and spans the steps after it ("warmup_end").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hpcai500_tf.config import OptimizerConfig, peak_learning_rate


@dataclass(frozen=True)
class WarmupDecaySteps:
    """The schedule in steps (counted from 0: the rate step `step` trains with)."""

    peak: float
    warmup_steps: int
    total_steps: int
    schedule: str  # cosine | step
    boundaries_steps: list[int]
    factor: float  # step decay's factor at each boundary
    cosine_start: str  # step_0 | warmup_end

    def rate(self, step: int) -> float:
        """The learning rate of step `step`."""
        warmup = self.warmup_steps
        if warmup and step < warmup:
            return self.peak * step / warmup
        if self.schedule == "cosine":
            start = 0 if self.cosine_start == "step_0" else warmup
            span = max(self.total_steps - start, 1)
            progress = min(max((step - start) / span, 0.0), 1.0)
            return self.peak * 0.5 * (1.0 + math.cos(math.pi * progress))
        passed = sum(step >= b for b in self.boundaries_steps)
        return self.peak * self.factor**passed


def warmup_decay(
    config: OptimizerConfig, global_batch: int, steps_per_epoch: int, epochs: int
) -> WarmupDecaySteps:
    """The configured schedule of a run of `epochs` epochs at `global_batch`."""
    return WarmupDecaySteps(
        peak=peak_learning_rate(config, global_batch),
        warmup_steps=int(round(config.warmup_epochs * steps_per_epoch)),
        total_steps=epochs * steps_per_epoch,
        schedule=config.schedule,
        boundaries_steps=[b * steps_per_epoch for b in config.step_boundaries],
        factor=config.step_factor,
        cosine_start=config.cosine_start,
    )
