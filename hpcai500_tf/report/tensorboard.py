"""A run in TensorBoard: RUN_DIR/tensorboard/ holds its scalars, its layers as HParams and,
on request, a profiler trace of chosen steps (`tensorboard --logdir runs/`).

`TensorBoard` is the run's observer (run/observers.py), so the training loop knows nothing of
it; its `TensorBoardView` writes at most `MAX_WRITES_PER_S` step points a second through the
tensorboard package's own event writer (buffered, flushed at each epoch's end): the same files
whichever framework trains. This module imports no framework; the tensorboard package uses
TensorFlow's file layer where TensorFlow can be imported, and its own pure-Python one in a
PyTorch process (which refuses TensorFlow). Tags:

    train/loss, train/learning_rate, train/examples_per_second   step: global train step
    eval/quality, eval/target                                     step: epoch
    power/SOURCE (watts)                                          step: reading index
    score/flops, score/valid_flops, score/time_to_quality_s       step: epochs trained
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
from pathlib import Path

from hpcai500_tf.errors import UserError
from hpcai500_tf.report.run_files import counter_watts
from hpcai500_tf.run.observers import Observer

MAX_WRITES_PER_S = 10.0


class TensorBoardView:
    """Writes what the live view shows as TensorBoard scalars (the chief's only)."""

    def __init__(self, log_dir: Path):
        # Imported here, before the timed run: the tensorboard package is optional, and its
        # first import costs a few tenths of a second.
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.plugins.scalar.summary_v2 import scalar_pb
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._scalar_pb = Event, scalar_pb
        scalar_pb("warm_up", 0.0)  # its first call's one-time costs, outside the timed run too
        self.log_dir = Path(log_dir)
        self.writer = EventFileWriter(str(self.log_dir))
        self.epoch, self.steps_per_epoch, self._last_write = 0, 1, 0.0

    def _write(self, step: int, summary) -> None:
        self.writer.add_event(self._event(wall_time=time.time(), step=step, summary=summary))

    def _scalars(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self._write(step, self._scalar_pb(tag, float(value)))

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
            {
                "train/loss": loss,
                "train/learning_rate": learning_rate,
                "train/examples_per_second": examples_per_s,
            },
        )

    def epoch_end(self, epoch: int, loss: float, examples_per_s: float) -> None:
        self.writer.flush()

    def evaluation(self, epoch: int, quality: float, target: float) -> None:
        self._scalars(epoch, {"eval/quality": quality, "eval/target": target})

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()

    # ------------------------------------------------------------------ after the run

    def run_layers(self, run_name: str, layer_values: dict) -> None:
        """The run's layers L5-L9 as HParams, so that runs compare in TensorBoard's HParams
        table (the plugin comes with the tensorboard package)."""
        from tensorboard.plugins.hparams.summary_v2 import hparams_pb

        self._write(0, hparams_pb(hparams_of(layer_values), trial_id=run_name))

    def power(self, sampler) -> None:
        """Each power source's watts over the run (a counter's from its differences)."""
        for source in sampler.sources:
            points = sampler.readings[source.name]
            watts = counter_watts(points) if source.kind == "counter" else points
            for index, (_, value) in enumerate(watts):
                self._scalars(index, {f"power/{source.name}": value})

    def score(self, epochs: int, score) -> None:
        self._scalars(
            epochs,
            {
                "score/flops": score.flops,
                "score/valid_flops": score.valid_flops,
                "score/time_to_quality_s": score.time_to_quality_s,
            },
        )


class TensorBoard(Observer):
    """The run in TensorBoard: its scalars as it trains, then its layers, power and score;
    nothing where the tensorboard package is not installed (a warning in the record)."""

    def __init__(self):
        self.view: TensorBoardView | None = None

    def on_run_start(self, run_dir, setup) -> list[str]:
        if importlib.util.find_spec("tensorboard") is None:
            return [
                "TensorBoard scalars not written: the tensorboard package is not installed "
                "(it comes with the cpu and cuda extras)"
            ]
        self.run_dir, self.benchmark = run_dir, setup.benchmark
        self.view = TensorBoardView(run_dir.tensorboard)
        return []

    def on_epoch_start(self, epoch: int, epochs: int, steps: int) -> None:
        if self.view:
            self.view.epoch_start(epoch, epochs, steps)

    def on_step(self, step: int, loss: float, learning_rate: float, examples_per_s: float) -> None:
        if self.view:
            self.view.step(step, loss, learning_rate, examples_per_s)

    def on_epoch_end(self, epoch: int, loss: float, examples_per_s: float) -> None:
        if self.view:
            self.view.epoch_end(epoch, loss, examples_per_s)

    def on_eval(self, epoch: int, quality: float, target: float) -> None:
        if self.view:
            self.view.evaluation(epoch, quality, target)

    def on_record(self, artifacts: dict, warnings: list[str]) -> None:
        if self.view:
            artifacts["tensorboard"] = str(self.run_dir.tensorboard)

    def on_end(self, record: dict, layers: dict, sampler, epochs_done: int) -> None:
        """The run's layers (HParams), power and score in TensorBoard; never fatal."""
        if not self.view:
            return
        from hpcai500_tf.results import scoring

        board = self.view
        try:
            board.run_layers(self.run_dir.name, layers)
            if sampler and sampler.sources:
                board.power(sampler)
            if record["status"] == "completed" and record["quality"]["measured"]:
                with contextlib.suppress(UserError):
                    board.score(epochs_done, scoring.score(record, self.benchmark))
        finally:
            board.close()


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
