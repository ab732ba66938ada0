"""The benchmark's tf.data input pipeline for the PyTorch runner, run in a process of its own.

TensorFlow and PyTorch must not share a process: TensorFlow loads its native libraries with
RTLD_GLOBAL, which exports the LLVM it bundles, and a CUDA build of PyTorch brings triton,
whose libtriton.so holds another LLVM. Loaded after TensorFlow, triton's LLVM references bind
to TensorFlow's copy and its static initialisers crash (a segmentation fault on `import
triton`, reached from `torch.use_deterministic_algorithms` or `torch.compile`). So a child
process (the "feeder") imports TensorFlow, builds the workload and iterates its datasets; the
runner imports only PyTorch. Batches cross in shared memory, a few slots per stream, with the
slot numbers on a pipe: one copy into the slot, one out of it.

    feeder = Feeder("image_classification", config, data_dir, batch=32, deterministic=True)
    # one of several workers: its shard (count, index) of both splits, as the TensorFlow engine
    feeder = Feeder(..., shard=(workers.world_size, workers.rank))
    feeder.workload      # the workload's facts the record needs (WorkloadFacts)
    for images, labels, count in feeder.batches(training=True, seed=10): ...
    feeder.close()
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import re
import signal
import traceback
from collections import deque
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

from hpcai500_tf.errors import UserError
from hpcai500_tf.run import data_position

SLOTS = 3  # batches in flight per stream: one being read, two being filled


class FeederError(RuntimeError):
    """The data process failed while reading data (its message names what)."""


class FeederDataError(FeederError):
    """Bad data met mid-run (a corrupt sample): what a UserError raised inside the
    TensorFlow engine's input pipeline is on that side."""


@dataclass(frozen=True)
class WorkloadFacts:
    """What the runner and the record need of the workload, without TensorFlow."""

    name: str
    quality_metric: str
    objective: str  # the training loss, as the workload names it
    measures_quality: bool
    train_examples: int
    eval_examples: int
    image_size: int
    num_classes: int
    model: dict  # the workload's model config (width, blocks, batch-norm settings)
    layer: dict  # L7 as the TensorFlow workload reports it
    dataset: str  # L9's dataset name
    problem: dict  # L9's facts verified from the data (counts, fingerprints)
    data_warnings: tuple = ()  # the workload's, for the feeders' shard count (workers)
    # An ensemble member's: its evaluation keeps its probabilities, in evaluation order (the
    # feeder reads the split in order for it, as the TensorFlow engine does)
    keeps_predictions: bool = False
    # L7's kernels: the runner's model is plain torch.nn layers (pytorch/resnet.py), the
    # counterpart of TensorFlow's "stock"; none of TensorFlow's CPU workarounds runs there.
    kernels = "stock"

    def workload_layer(self) -> dict:
        return dict(self.layer)

    def problem_layer(self) -> dict:
        return dict(self.problem)

    def dataset_name(self) -> str:
        return self.dataset


class Feeder:
    """A child process that runs the benchmark's tf.data pipeline and hands out batches."""

    def __init__(
        self,
        benchmark: str,
        config: dict,
        data_dir: str | None,
        batch: int,
        deterministic: bool,
        shard: tuple[int, int] = (1, 0),
    ):
        """`shard` = (count, index): this worker reads part `index` of `count` of the training
        and the evaluation data (the workload's `dataset(training, seed, shard)`, as the
        TensorFlow engine shards its input pipelines); (1, 0) reads all of both."""
        count, index = shard
        if count < 1 or not 0 <= index < count:
            raise ValueError(f"shard {shard} is not (count >= 1, 0 <= index < count)")
        self.shard = (int(count), int(index))
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no PyTorch in it
        self._pipe, child_end = context.Pipe()
        self._process = context.Process(
            target=_serve,
            args=(child_end, benchmark, config, data_dir, batch, deterministic, self.shard),
            name="hpcai500-tf-data",
            daemon=True,
        )
        self._process.start()
        child_end.close()
        self.batch = batch
        self._streams = 0
        self._memory: list[shared_memory.SharedMemory] = []
        self._pending: dict[int | None, deque] = {}
        self._closed: set[int] = set()
        self.workload: WorkloadFacts = WorkloadFacts(**self._reply())
        shape = (batch, self.workload.image_size, self.workload.image_size, 3)
        self._image_bytes = int(np.prod(shape)) * 4
        self._slot_bytes = self._image_bytes + batch * 8

    def _died(self) -> FeederError:
        self._process.join(5)
        return FeederError(
            f"the data process ended unexpectedly (exit code {self._process.exitcode})"
        )

    def _send(self, *message) -> None:
        try:
            self._pipe.send(message)
        except OSError:
            raise self._died() from None

    def _reply(self, stream=None):
        """The next reply for `stream` (None: the start-up reply); replies for other streams
        that arrive first are kept for their readers."""
        while not self._pending.setdefault(stream, deque()):
            try:
                tag, kind, value = self._pipe.recv()
            except (EOFError, OSError):
                raise self._died() from None
            if tag not in self._closed:  # a closed stream's last fills are dropped
                self._pending.setdefault(tag, deque()).append((kind, value))
        kind, value = self._pending[stream].popleft()
        if kind == "user_error" and stream is not None:
            raise FeederDataError(value)
        if kind == "user_error":
            raise UserError(value)
        if kind == "error":
            raise FeederError(value)
        return value

    def batches(self, training: bool, seed: int, epochs: tuple[int, int, int, int] | None = None):
        """(images NHWC float32, labels int64, count) views into shared memory, each valid
        until the next one is asked for; training streams repeat forever, evaluation ends.
        `epochs` (epochs done, batches done in the next, epochs, steps per epoch): a training
        stream of every epoch's own, seeded by `data_position.epoch_seed(seed, epoch)`,
        from that position to the last epoch.
        The stream opens now (its dataset built in the data process, its first batches asked
        for), as a TensorFlow iterator starts when it is made, not at its first batch."""
        stream = self._streams
        self._streams += 1
        memory = shared_memory.SharedMemory(create=True, size=self._slot_bytes * SLOTS)
        self._memory.append(memory)
        self._send("open", stream, training, seed, memory.name, epochs)
        self._reply(stream)
        for slot in range(SLOTS):  # the child fills every slot ahead of the reader
            self._send("next", stream, slot)
        return self._read(stream, memory)

    def _read(self, stream: int, memory: shared_memory.SharedMemory):
        in_flight, slot = SLOTS, 0
        try:
            while True:
                count = self._reply(stream)
                in_flight -= 1
                if count is None:
                    return
                offset = slot * self._slot_bytes
                size = self.workload.image_size
                images = np.ndarray((self.batch, size, size, 3), np.float32, memory.buf, offset)
                labels = np.ndarray((self.batch,), np.int64, memory.buf, offset + self._image_bytes)
                yield images[:count], labels[:count], count
                self._send("next", stream, slot)
                in_flight += 1
                slot = (slot + 1) % SLOTS
        finally:
            self._pending.pop(stream, None)
            self._closed.add(stream)
            if self._process.is_alive():
                with contextlib.suppress(OSError):
                    self._pipe.send(("close", stream))

    def close(self) -> None:
        if self._process.is_alive():
            with contextlib.suppress(OSError):
                self._pipe.send(("quit",))
            self._process.join(10)
            if self._process.is_alive():
                self._process.kill()
        for memory in self._memory:
            memory.close()
            memory.unlink()
        self._memory = []


def _serve(pipe, benchmark, config, data_dir, batch, deterministic, shard=(1, 0)) -> None:
    """The child: build the workload, then answer the runner's requests in order."""
    # Stops are the runner's to handle: Ctrl-C reaches the process group, and Slurm signals
    # every process of a step (scancel's SIGTERM, the time limit's SIGUSR1 through srun),
    # while the runner still needs batches to agree on the stop. It ends this process by
    # "quit", else SIGKILL, and this loop ends when the runner's end of the pipe closes.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    started = _start(pipe, benchmark, config, data_dir, shard)
    if started is None:
        return
    tf, workload = started
    image_bytes = batch * workload.data.image_size * workload.data.image_size * 3 * 4
    slot_bytes = image_bytes + batch * 8
    streams, splits = {}, {}
    while True:
        try:
            message = pipe.recv()
        except (EOFError, OSError):
            return  # the runner is gone
        kind = message[0]
        if kind == "quit":
            return
        if kind == "close":
            _, memory = streams.pop(message[1], (None, None))
            if memory is not None:
                memory.close()
            continue
        stream = message[1]
        try:
            if kind == "open":
                _, _, training, seed, name, epochs = message
                stream_of = functools.partial(_iterator, tf, workload, shard, batch, deterministic)
                if epochs is None:
                    iterator = stream_of(training, seed)
                else:
                    iterator = _epoch_streams(stream_of, seed, epochs)
                streams[stream] = (iterator, shared_memory.SharedMemory(name=name))
                splits[stream] = "train" if training else "validation"
                pipe.send((stream, "ok", None))
            elif kind == "next":
                count = _fill(*streams[stream], message[2] * slot_bytes, image_bytes)
                pipe.send((stream, "ok", count))
        except UserError as error:
            pipe.send((stream, "user_error", str(error)))
        except tf.errors.OpError as error:
            # A UserError raised inside the pipeline (a corrupt sample) arrives wrapped.
            inner = re.search(r"UserError: (.*)", str(error))
            if inner:
                pipe.send((stream, "user_error", inner.group(1).strip()))
            else:
                pipe.send((stream, "error", _read_failure(error, data_dir, splits[stream])))
        except Exception:  # noqa: BLE001 - reported to the runner, which names it
            pipe.send((stream, "error", "the data process failed:\n" + traceback.format_exc()))


def _start(pipe, benchmark, config, data_dir, shard):
    """TensorFlow (off the GPUs, seeded as the TensorFlow engine seeds) and the workload, its
    facts sent as the start-up reply; (tf, workload), or None once the failure is sent."""
    try:
        from hpcai500_tf.tensorflow_import import import_tensorflow

        import_tensorflow()  # its native start-up lines kept off the runner's console
        import tensorflow as tf

        tf.config.set_visible_devices([], "GPU")  # the accelerators are PyTorch's
        import keras

        keras.utils.set_random_seed(config["training"]["seed"])  # as the TensorFlow engine does
        from hpcai500_tf.workloads import build_workload

        workload = build_workload(benchmark, config, data_dir)
        pipe.send((None, "ok", _facts(workload, shard)))
    except UserError as error:
        pipe.send((None, "user_error", str(error)))
        return None
    except Exception:  # noqa: BLE001 - reported to the runner, which names it
        pipe.send((None, "error", "the data process could not start:\n" + traceback.format_exc()))
        return None
    return tf, workload


def _facts(workload, shard) -> dict:
    """The WorkloadFacts fields of `workload`, as plain values that cross the pipe."""
    return {
        "name": workload.name,
        "quality_metric": workload.quality_metric,
        "objective": workload.objective,
        "measures_quality": workload.measures_quality,
        "train_examples": workload.train_examples,
        "eval_examples": workload.eval_examples,
        "image_size": workload.data.image_size,
        "num_classes": workload.data.num_classes,
        "model": {
            k: getattr(workload.model_config, k) for k in workload.model_config.__dataclass_fields__
        },
        "layer": workload.workload_layer(),
        "dataset": workload.dataset_name(),
        "problem": workload.problem_layer(),
        "data_warnings": tuple(workload.data_warnings(shard[0])),
        "keeps_predictions": getattr(workload, "keeps_predictions", False),
    }


def _epoch_streams(stream_of, seed: int, epochs: tuple[int, int, int, int]):
    """Every epoch's own training stream, by its seed, from the position `epochs` names."""

    def open_epoch(epoch: int, skip: int):
        return stream_of(True, data_position.epoch_seed(seed, epoch), skip)

    return data_position.epoch_batches(open_epoch, *epochs)


def _iterator(tf, workload, shard, batch, deterministic, training, seed, skip=0):
    """A stream's batches as numpy arrays: the workload's dataset, this worker's shard of it,
    batched and normalised, the first `skip` dropped; training repeats forever."""
    dataset = workload.dataset(training, seed, shard)
    if training:
        dataset = dataset.repeat()
    options = tf.data.Options()
    options.deterministic = deterministic
    if not training and getattr(workload, "keeps_predictions", False):
        options.deterministic = True  # an ensemble member's rows: evaluation order
    dataset = dataset.with_options(options)
    dataset = dataset.batch(batch, drop_remainder=training)
    if skip:  # a resumed epoch's batches trained before the stop
        dataset = dataset.skip(skip)
    # The workload's uint8 pixels become the model's normalised float32 input here, in this
    # process (the TensorFlow engine does it on its device, in the step).
    dataset = dataset.map(
        lambda images, labels: (workload.model_inputs(images), labels),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    return dataset.prefetch(tf.data.AUTOTUNE).as_numpy_iterator()


def _fill(iterator, memory, offset: int, image_bytes: int) -> int | None:
    """The stream's next batch copied into its slot at `offset`: its example count, or None
    where an evaluation stream has ended."""
    try:
        images, labels = next(iterator)
    except StopIteration:
        return None
    count = len(labels)
    np.copyto(np.ndarray(images.shape, np.float32, memory.buf, offset), images, "unsafe")
    np.copyto(np.ndarray((count,), np.int64, memory.buf, offset + image_bytes), labels, "unsafe")
    return count


# TensorFlow's decorations of an op's message: the function and node it ran in, the op's name.
_OP_TEXT = re.compile(
    r"\{\{function_node [^}]*\}\}|\[\[\{\{node [^}]*\}\}\]\]|\[Op:[^\]]*\]( name: ?\S*)?"
)
_RECORD_AT = re.compile(r"(?:corrupted|truncated) record at (\d+)")


def _read_failure(error, data_dir: str | None, split: str) -> str:
    """A TensorFlow error reading the `split` data, in the user's terms: its message without
    TensorFlow's op text and, for a damaged TFRecord ("corrupted record at N", which names no
    file), the shard file it is in."""
    lines = [_OP_TEXT.sub("", line).strip() for line in str(error).strip().splitlines()]
    message = next((line for line in lines if line), "")[:300]
    at = _RECORD_AT.search(message)
    if at and data_dir:
        from hpcai500_tf.data import imagenet, tfrecords

        try:
            files = imagenet.shard_files(data_dir, split)
        except UserError:
            files = []
        shard = tfrecords.file_failing_at(files, int(at.group(1)))
        if shard:
            message = f"{shard}: {message} (a damaged TFRecord shard file)"
        elif files:
            message = f"{message} in one of the {len(files)} {split} shard files of {data_dir}"
    return f"reading data failed: {error.__class__.__name__}: {message}"
