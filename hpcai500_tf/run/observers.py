"""What watches a run from outside it (the live view, TensorBoard, the console's streams):
built by the caller and handed to the lifecycle as one list, as Keras takes callbacks."""

from __future__ import annotations


class Observer:
    """Every call the lifecycle makes to an observer, each doing nothing here: an observer
    overrides those it needs. All are made on the chief only (but `message`, which a trainer
    makes while it builds), from the main thread."""

    def message(self, text: str) -> None:
        """A line for the person watching (devices, power sources, a first-use compile)."""

    def on_run_start(self, run_dir, setup) -> list[str]:
        """The run directory is known (`run.directory.RunDirectory`); returns warnings for
        the record."""
        return []

    def on_epoch_start(self, epoch: int, epochs: int, steps: int) -> None: ...

    def on_step(self, step: int, loss: float, learning_rate: float, examples_per_s: float):
        """Every `LOG_EVERY` steps and an epoch's last: the loss just read."""

    def on_epoch_end(self, epoch: int, loss: float, examples_per_s: float) -> None: ...
    def on_eval(self, epoch: int, quality: float, target: float) -> None: ...

    def on_record(self, artifacts: dict, warnings: list[str]) -> None:
        """The record is about to be written: add to its artifacts and warnings."""

    def on_end(self, record: dict, layers: dict, sampler, epochs_done: int) -> None:
        """The record is written (`sampler`: the power sampler, or None)."""


class Observers:
    """A list of observers as one: each call goes to each, in order. False when empty."""

    def __init__(self, observers=()):
        self.observers = [o for o in observers or () if o is not None]

    def __bool__(self) -> bool:
        return bool(self.observers)

    def __getattr__(self, name: str):
        def call(*args, **kwargs):
            for observer in self.observers:
                getattr(observer, name)(*args, **kwargs)

        return call

    def on_run_start(self, run_dir, setup) -> list[str]:
        return [w for o in self.observers for w in o.on_run_start(run_dir, setup) or ()]
