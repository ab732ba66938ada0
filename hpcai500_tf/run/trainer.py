"""What a backend author reads: the `Trainer` a framework supplies to the lifecycle (one per
worker process), the `StepTrace` of its profiler and the `Failure` its own errors mean.

A backend subclasses `Trainer` (the MLCommons runnable pattern: the lifecycle drives, the
trainer steps) and supplies the steps, the data, the checkpoint files, its library layers
(L4, L5) and the errors only it can name. What both backends share is here, written once:
the full-batch and evaluation-sharding refusals, the refusal of workers disagreeing on the
config, the record's FLOPs block, the checkpoint messages, the L1-L9 assembly and the
profiler trace's step logic. Pure Python: this module imports neither TensorFlow nor torch.
"""

from __future__ import annotations

import re
import shutil
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hpcai500_tf import benchmark_layers
from hpcai500_tf.cluster import machine
from hpcai500_tf.config import Setup
from hpcai500_tf.errors import UserError, first_line
from hpcai500_tf.workload_config import configured_examples


@dataclass(frozen=True)
class Failure:
    """What a framework's own error means for the run: `kind` is "data" (the input data
    failed mid-run), "peer_lost" (a peer worker died or stopped answering) or "failed"."""

    kind: str
    detail: str


class TrainedWorkload(Protocol):
    """The facts of a workload the lifecycle, the record and the layers read (a workload of
    workloads/, or the PyTorch runner's facts of one)."""

    name: str
    quality_metric: str  # the record's quality.metric
    measures_quality: bool  # False where the data is random: a throughput-only run
    train_examples: int
    eval_examples: int
    kernels: str  # what the model runs on, as L7 records it

    def workload_layer(self) -> dict: ...  # L7: the model and what it runs on
    def dataset_name(self) -> str: ...  # L9's dataset, in words
    def problem_layer(self) -> dict: ...  # L9 facts verified from the data


# ----------------------------------------------------------------------------- refusals


def full_batch_steps(train_examples: int, global_batch: int) -> int:
    """Steps per epoch: the full global batches one epoch holds (none is refused)."""
    steps = train_examples // global_batch
    if steps < 1:
        raise UserError(
            f"{train_examples} training examples make no full batch of "
            f"{global_batch}: lower training.batch_per_replica"
        )
    return steps


def refuse_unshardable_training(train_examples: int, workers: int, worker_batch: int) -> None:
    """Every worker takes a full batch of `worker_batch` examples (its replicas') a step."""
    if train_examples // workers < worker_batch:
        raise UserError(
            f"{train_examples} training examples cannot be sharded to {workers} workers of "
            f"{worker_batch} examples per step each"
        )


def refuse_unshardable_evaluation(eval_examples: int, workers: int) -> None:
    """Every worker evaluates its own part of the evaluation split: at least one example."""
    if eval_examples < workers:
        raise UserError(
            f"{eval_examples} evaluation examples cannot be sharded to {workers} workers"
        )


def refuse_unshardable_config(setup: Setup, workers: int) -> None:
    """What the config alone shows cannot be sharded to `workers` (the training and
    evaluation examples it fixes; a worker's batch is at least one replica's), refused before
    any data is read: by the launcher before it starts a worker, by a PyTorch worker before
    its rendezvous, by a TensorFlow worker once its strategy has joined the others. Each
    worker checks again once its data is counted and its replicas known. One worker shards
    nothing: its data is refused as a run's (`full_batch_steps`)."""
    if workers < 2:
        return
    training, evaluation = configured_examples(setup.benchmark.name, setup.config)
    if training is not None:
        refuse_unshardable_training(training, workers, setup.training.batch_per_replica)
    if evaluation is not None:
        refuse_unshardable_evaluation(evaluation, workers)


def refuse_disagreeing_workers(agreed: bool, config_id: str) -> None:
    """`agreed`: whether every worker's config fingerprint is this worker's, `config_id`."""
    if not agreed:
        raise UserError(
            f"the workers were started with different configs (this worker's is {config_id}): "
            "start every worker with the same benchmark, preset and --set values"
        )


# ----------------------------------------------------------------------------- checkpoints


def checkpoint_damaged(path: Path, error: BaseException) -> UserError:
    """A checkpoint file that does not read whole (a torn write, a flipped bit)."""
    return UserError(f"{path}: the checkpoint is damaged ({first_line(error)})")


def checkpoint_unrestorable(path: Path, error: BaseException) -> UserError:
    """A checkpoint that reads whole but does not fit this run's model or optimizer."""
    return UserError(f"{path}: cannot restore the checkpoint ({first_line(error)})")


def checkpoint_unwritable(path: Path, error: BaseException) -> UserError:
    """A checkpoint the framework could not write: its path, the framework's words (which may
    name neither: TensorFlow's for a full disk is a bare ResourceExhaustedError) and the room
    left where it was written, a full disk being the usual cause."""
    # TensorFlow's words: "Graph execution error: ... FILE; REASON\n\t [[{{node SaveV2}}]]"
    reason = re.search(r"; ([^;\n]+)\n\s*\[\[", str(error))
    words = f"{error.__class__.__name__}: {reason.group(1)}" if reason else first_line(error)
    try:
        free = shutil.disk_usage(Path(path).parent).free
    except OSError:
        room = ""
    else:
        room = f"; {free / 2**20:.1f} MiB free on its filesystem"
    return UserError(f"{path}: cannot write the checkpoint ({words}{room})")


# ----------------------------------------------------------------------------- the record


def flops_block(
    *,
    per_example_training: float,
    per_example_forward: float | None,
    analytical_per_example_forward: float | None,
    method: str,
    basis: str,
    by_op_type: dict[str, float],
    batch: int,
    uncounted_op_types: list[str],
) -> dict:
    """The record's FLOPs block: FLOPs per example of the train step that runs and of the
    forward pass, how they were counted, and the training count by op type (`by_op_type`:
    totals over `batch`, the batch the step was counted at)."""
    return {
        "per_example_training": per_example_training,
        "per_example_forward": per_example_forward,
        "analytical_per_example_forward": analytical_per_example_forward,
        "method": method,
        "basis": basis,
        "counted_op_types": sorted(by_op_type),
        "uncounted_op_types": uncounted_op_types,
        # per example of the batch the step was counted at, as the total is
        "by_op_type_per_example": {k: v / batch for k, v in sorted(by_op_type.items())},
    }


# ----------------------------------------------------------------------------- the trace


class StepTrace(ABC):
    """A profiler trace of global train steps `first`-`last` (counted from 1 over the whole
    run), written under `log_dir`. A backend supplies `start`, `finish` (which writes the
    trace), `wait` (until a step's loss is computed) and the trace files' `pattern`."""

    profiler: str  # the profiler's name, for the record's warning
    pattern: str  # the trace files written, as a glob under `log_dir`

    def __init__(self, log_dir: Path, first: int, last: int):
        if not 1 <= first <= last:
            raise ValueError(f"profile steps must be 1 <= first <= last, got {first}-{last}")
        self.log_dir, self.first, self.last = Path(log_dir), first, last
        self.active = False

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def finish(self) -> None: ...

    @abstractmethod
    def wait(self, loss) -> None: ...

    def before(self, step: int) -> None:
        if step == self.first:
            self.start()
            self.active = True

    def after(self, step: int, loss) -> None:
        if self.active and step == self.last:
            self.wait(loss)  # the traced steps have run to their end
            self.stop()

    def stop(self) -> None:
        if self.active:
            self.active = False
            self.finish()

    def files(self) -> list[Path]:
        return sorted(self.log_dir.glob(self.pattern))


# ----------------------------------------------------------------------------- the trainer


class Trainer(ABC):
    """What a framework supplies to the lifecycle; one per worker process."""

    framework: str  # the record's source.framework: "tensorflow" or "pytorch"
    setup: Setup
    workload: TrainedWorkload
    global_batch: int
    steps_per_epoch: int
    workers: int
    rank: int
    replicas: int  # devices the global batch is split over
    precision: str  # the precision policy that ran (L7)
    initial_loss_scale: float | None  # where dynamic loss scaling ran (float16)
    warnings: list[str]  # found while building (devices, data), for the record

    @abstractmethod
    def count_flops(self) -> dict: ...  # the record's flops block, of the step that runs

    @abstractmethod
    def warm_up(self, checkpoints: bool) -> None: ...  # one step undone (and the writer)

    @abstractmethod
    def train_batches(self, epochs_done: int, batches_done: int = 0) -> Iterator: ...

    # The stop the workers agreed on, from the votes the step before last carried (run/stop.py)
    @abstractmethod
    def agreed_stop(self) -> int: ...

    # The loss (reading it is `loss_value`); `vote`: this worker's stop signal, carried to every
    # worker by the step's own reduction (None: no vote, one worker)
    @abstractmethod
    def train_step(self, batch, vote: int | None = None): ...

    @abstractmethod
    def loss_value(self, loss) -> float: ...  # syncs the device

    @abstractmethod
    def learning_rate(self) -> float: ...

    @abstractmethod
    def evaluate(self) -> float: ...  # the workload's quality over the evaluation split

    @property
    def predictions(self) -> dict | None:
        """An ensemble member's last evaluation outputs (the classifier's probabilities and
        labels, the detector's boxes and truth: run/predictions.py), over the whole evaluation
        split in evaluation-set order, for run/predictions.py to save; None for any other run.
        Here: what the workload kept (the TensorFlow workload keeps them as its evaluation
        gathers them)."""
        return getattr(self.workload, "predictions", None)

    @abstractmethod
    def write_checkpoint(self, prefix: Path, epochs_done: int, batches_done: int = 0) -> Path: ...

    # the epochs (and batches of the next) it holds; None: written before checkpoints held it
    @abstractmethod
    def read_checkpoint(self, prefix: Path) -> int | tuple[int, int] | None: ...

    @abstractmethod
    def step_trace(self, log_dir: Path, first: int, last: int) -> StepTrace: ...

    @abstractmethod
    def explain(self, error: BaseException) -> Failure | None: ...

    @abstractmethod
    def gather_rows(self, row: list[float]) -> list[list[float]]: ...  # a collective

    @abstractmethod
    def communication_layer(self) -> dict: ...  # L3: the collectives that ran, if any

    @abstractmethod
    def library_layers(self) -> tuple[dict, dict]: ...  # L4 and L5, as the framework reports

    @abstractmethod
    def intra_op_threads(self) -> int: ...  # L6: the framework's threads per op

    @abstractmethod
    def close(self) -> None: ...  # release what it holds (processes, process groups)

    def layers(self) -> dict:
        """L1-L9: the system as observed (L1, L2 here; L3-L5 the framework's), the run as
        configured (L6-L9, in terms every framework shares)."""
        l4, l5 = self.library_layers()
        return {
            "L1": machine.hardware_layer(self.workers),
            "L2": machine.os_layer(),
            "L3": self.communication_layer(),
            "L4": l4,
            "L5": l5,
            **benchmark_layers.run_layers(
                self.setup,
                self.workload,
                workers=self.workers,
                replicas=self.replicas,
                global_batch=self.global_batch,
                precision=self.precision,
                initial_loss_scale=self.initial_loss_scale,
                intra_op_threads=self.intra_op_threads(),
            ),
        }
