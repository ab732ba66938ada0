"""A run in TensorBoard: RUN_DIR/tensorboard/ holds its scalars, its layers as HParams and,
on request, a profiler trace of chosen steps (`tensorboard --logdir runs/`).

`TensorBoardView` takes the live view's calls (`report.live.LiveView`), so the training loop
knows nothing of it; it writes at most `MAX_WRITES_PER_S` step points a second, through
TensorFlow's summary writer (buffered, flushed at each epoch's end). Tags:

    train/loss, train/learning_rate, train/examples_per_second   step: global train step
    eval/quality, eval/target                                     step: epoch
    power/SOURCE (watts)                                          step: reading index
    score/flops, score/valid_flops, score/time_to_quality_s       step: epochs trained
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import tensorflow as tf

from hpcai500_tf.report.run_files import counter_watts

DIRECTORY = "tensorboard"
MAX_WRITES_PER_S = 10.0


class TensorBoardView:
    """Writes what the live view shows as TensorBoard scalars (the chief's only)."""

    def __init__(self, log_dir: Path):
        self.log_dir = Path(log_dir)
        warm_up_summaries()
        self.writer = tf.summary.create_file_writer(str(self.log_dir))
        self.epoch, self.steps_per_epoch, self._last_write = 0, 1, 0.0

    def _scalars(self, step: int, **values: float) -> None:
        with self.writer.as_default(step=step):
            for tag, value in values.items():
                tf.summary.scalar(tag.replace("__", "/"), value)

    def message(self, text: str) -> None:
        pass

    def epoch_start(self, epoch: int, epochs: int, steps: int) -> None:
        self.epoch, self.steps_per_epoch = epoch, steps

    def step(self, step: int, loss: float, learning_rate: float, examples_per_s: float) -> None:
        now = time.monotonic()
        if now - self._last_write < 1.0 / MAX_WRITES_PER_S and step < self.steps_per_epoch:
            return
        self._last_write = now
        global_step = (self.epoch - 1) * self.steps_per_epoch + step
        self._scalars(
            global_step,
            train__loss=loss,
            train__learning_rate=learning_rate,
            train__examples_per_second=examples_per_s,
        )

    def epoch_end(self, epoch: int, loss: float, examples_per_s: float) -> None:
        self.writer.flush()

    def evaluation(self, epoch: int, quality: float, target: float) -> None:
        self._scalars(epoch, eval__quality=quality, eval__target=target)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()

    # ------------------------------------------------------------------ after the run

    def run_layers(self, run_name: str, layer_values: dict) -> None:
        """The run's layers L5-L9 as HParams, so that runs compare in TensorBoard's HParams
        table (the plugin comes with the tensorboard package)."""
        from tensorboard.plugins.hparams import api as hparams_api

        with self.writer.as_default():
            hparams_api.hparams(hparams_of(layer_values), trial_id=run_name)

    def power(self, sampler) -> None:
        """Each power source's watts over the run (a counter's from its differences)."""
        for source in sampler.sources:
            points = sampler.readings[source.name]
            watts = counter_watts(points) if source.kind == "counter" else points
            with self.writer.as_default():
                for index, (_, value) in enumerate(watts):
                    tf.summary.scalar(f"power/{source.name}", value, step=index)

    def score(self, epochs: int, score) -> None:
        self._scalars(
            epochs,
            score__flops=score.flops,
            score__valid_flops=score.valid_flops,
            score__time_to_quality_s=score.time_to_quality_s,
        )


def warm_up_summaries() -> None:
    """Write one scalar into a scratch directory: the first summary write of a process costs
    ~0.3-0.5 s (measured here), which would otherwise fall inside the timed run."""
    with tempfile.TemporaryDirectory(prefix="hpcai500-warm-up-") as scratch:
        writer = tf.summary.create_file_writer(scratch)
        with writer.as_default(step=0):
            tf.summary.scalar("warm_up", 0.0)
        writer.close()


def hparams_of(layer_values: dict) -> dict:
    """L5-L9 flattened to `L7.width`-style keys of strings, numbers and booleans (lists are
    written as text; nothing None)."""
    flat = {}
    for layer in ("L5", "L6", "L7", "L8", "L9"):
        for key, value in (layer_values.get(layer) or {}).items():
            if value is None or isinstance(value, dict):
                continue
            flat[f"{layer}.{key}"] = (
                value if isinstance(value, str | bool | int | float) else str(value)
            )
    return flat


class StepTrace:
    """A TensorFlow profiler trace of global train steps `first`..`last` (counted from 1 over
    the whole run), written under the TensorBoard directory for its profile plugin."""

    def __init__(self, log_dir: Path, first: int, last: int):
        if not 1 <= first <= last:
            raise ValueError(f"profile steps must be 1 <= first <= last, got {first}-{last}")
        self.log_dir, self.first, self.last = Path(log_dir), first, last
        self.active = False

    def before(self, step: int) -> None:
        if step == self.first:
            tf.profiler.experimental.start(str(self.log_dir))
            self.active = True

    def after(self, step: int, loss) -> None:
        if self.active and step == self.last:
            float(loss)  # the traced steps have run to their end
            self.stop()

    def stop(self) -> None:
        if self.active:
            tf.profiler.experimental.stop()
            self.active = False

    def files(self) -> list[Path]:
        """The trace files written (the profile plugin's xplane protobufs)."""
        return sorted(self.log_dir.glob("plugins/profile/*/*.xplane.pb"))
