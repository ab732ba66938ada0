"""The frameworks a run trains with, found by name: where TensorFlow (engine/) and PyTorch
(pytorch/) end. Only this module imports engine/ or pytorch/ (by name, `_module`); the CLI,
the launcher and the run state ask it for what differs between frameworks and never compare
a framework's name.

    NAMES                                    the names, for argparse's choices; DEFAULT first
    get(name) -> Backend                     one line (UserError) for an unknown name
    backend.name, backend.title              "pytorch", " (PyTorch)": the console title's suffix
    backend.check_arguments(device=...)      a flag this framework does not take: one line
    backend.strategy_overrides(launching)    multi_worker from --workers, srun, TF_CONFIG or
                                             (PyTorch) torchrun; the cluster checked first
    backend.worker_environments(setup, n, environ) -> (environments, ports, gpus)
    backend.threads_variable                 the thread count --workers N shares out
    backend.checkpoint_files                 ((suffix, what), ...): the files of ckpt-N
    backend.check_checkpoint(prefix)         ckpt-N's content read whole, where pure Python can
    backend.load()                           import the framework; a missing one is one line
    backend.run(setup, options, view)        train: lifecycle.run with its trainer
    backend.build_trainer(setup, options, view), backend.end_worker(code)
    backend.library_layers() -> (L4, L5)     system_layers(workers, collective): L1-L5

Everything but `load`, `run`, `build_trainer`, `end_worker` and the layers is pure Python:
it runs before any framework loads (argument checks, a resume's checks, the launcher).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hpcai500_tf.errors import UserError

DEFAULT = "tensorflow"


@dataclass(frozen=True)
class Backend:
    """One framework's side of the seam; see the module's docstring."""

    name: str
    title: str
    threads_variable: str
    checkpoint_files: tuple[tuple[str, str], ...]
    reads_torchrun: bool  # WORLD_SIZE, RANK: torchrun's (and the launcher's) workers
    reads_tf_config: bool  # TF_CONFIG's cluster is this framework's to check and join
    takes_device: bool  # --device (TensorFlow uses the devices it sees)
    saves_predictions: bool  # an ensemble member's evaluation probabilities (run/ensemble.py)
    _load: Callable[[], object] = field(repr=False)
    _library_layers: Callable[[], tuple[dict, dict]] = field(repr=False)
    _worker_environments: Callable = field(repr=False)
    _build_trainer: Callable = field(repr=False)
    _check_checkpoint: Callable[[Path], None] | None = field(default=None, repr=False)

    def check_arguments(self, device: str = "auto") -> None:
        if device != "auto" and not self.takes_device:
            raise UserError("--device is for --framework pytorch (TensorFlow uses what it sees)")

    def strategy_overrides(self, launching: bool) -> list[str]:
        from hpcai500_tf.cluster import workers

        return workers.strategy_overrides(
            launching, reads_torchrun=self.reads_torchrun, reads_tf_config=self.reads_tf_config
        )

    def worker_environments(
        self, setup, workers: int, environ: Mapping[str, str]
    ) -> tuple[list[dict[str, str]], list[int], list[str]]:
        """`--workers N` on this machine: each worker's environment, the ports they use and
        the GPUs shared out (CUDA_VISIBLE_DEVICES entries; none where each takes its own)."""
        return self._worker_environments(setup, workers, environ)

    def check_checkpoint(self, prefix: Path) -> None:
        """The content of the checkpoint at `prefix` read whole before the framework loads
        (a damaged one is one line); a framework whose files only it can read (TensorFlow's)
        has its trainer check them instead."""
        if self._check_checkpoint is not None:
            self._check_checkpoint(prefix)

    def load(self):
        """The framework's backend module (`run`, `end_worker`), its framework imported."""
        return self._load()

    def run(self, setup, options, view=None):
        return self.load().run(setup, options, view)

    def build_trainer(self, setup, options, view=None):
        """The lifecycle's trainer for this framework (lifecycle.run calls this)."""
        return self._build_trainer(setup, options, view)

    def end_worker(self, code: int) -> None:
        self.load().end_worker(code)

    def library_layers(self) -> tuple[dict, dict]:
        """L4 (accelerator libraries) and L5 (framework) of this process's framework."""
        return self._library_layers()

    def system_layers(self, workers: int = 1, collective: str | None = None) -> dict[str, dict]:
        """L1-L5 of this machine with this framework, as far as they can be observed."""
        from hpcai500_tf.cluster import machine

        return machine.system_layers(self.library_layers(), workers, collective)


def _module(name: str):
    """A backend's module, found by name when first needed (as big_vision finds its models).
    The run state, which the lifecycle and so both backends import, reads the plain facts
    above; an import statement here would draw the loop run_state -> backends -> engine.run
    -> lifecycle -> run_state, which no call follows."""
    return importlib.import_module(f"hpcai500_tf.{name}")


def _load_tensorflow():
    from hpcai500_tf.tensorflow_import import import_tensorflow

    import_tensorflow()
    return _module("engine.run")


def _load_pytorch():
    sys.modules["tensorflow"] = None  # an import of it fails here, loudly, not in triton later
    # c10d's C++ warnings (a rendezvous retrying, say: dozens of lines) kept off stderr; its
    # errors reach the run's one line. Read when torch loads; a setting of the user's is kept.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    _module("freed_memory").keep_freed_memory()  # before torch allocates
    _module("pytorch.build").import_torch()  # a missing or unusable torch is one line
    return _module("pytorch.train")


def _pytorch_checkpoint(prefix: Path) -> None:
    _module("pytorch.checkpoint_file").check_whole(prefix)


def _tensorflow_trainer(setup, options, view=None):
    return _load_tensorflow().build_trainer(setup, options, view)


def _pytorch_trainer(setup, options, view=None):
    return _load_pytorch().TorchTrainer(setup, options, view)


def _tensorflow_library_layers() -> tuple[dict, dict]:
    from hpcai500_tf.tensorflow_import import import_tensorflow

    import_tensorflow()
    return _module("engine.library_layers").library_layers()


def _pytorch_library_layers() -> tuple[dict, dict]:
    build = _module("pytorch.build")
    return build.library_layers(build.import_torch())


def _tensorflow_workers(setup, workers: int, environ: Mapping[str, str]):
    from hpcai500_tf.cluster import local_workers

    return local_workers.tensorflow_workers(setup.communication.collective, workers, environ)


def _pytorch_workers(setup, workers: int, environ: Mapping[str, str]):
    from hpcai500_tf.cluster import local_workers

    return local_workers.pytorch_workers(workers, environ)


_BACKENDS = {
    "tensorflow": Backend(
        name="tensorflow",
        title="",
        threads_variable="TF_NUM_INTRAOP_THREADS",
        checkpoint_files=(("index", "checkpoint index"), ("data-*-of-*", "checkpoint data file")),
        reads_torchrun=False,
        reads_tf_config=True,
        takes_device=False,
        saves_predictions=True,
        _load=_load_tensorflow,
        _library_layers=_tensorflow_library_layers,
        _worker_environments=_tensorflow_workers,
        _build_trainer=_tensorflow_trainer,
    ),
    "pytorch": Backend(
        name="pytorch",
        title=" (PyTorch)",
        threads_variable="OMP_NUM_THREADS",
        checkpoint_files=(("pt", "checkpoint file"),),  # one file: ckpt-N.pt
        reads_torchrun=True,
        reads_tf_config=False,
        takes_device=True,
        saves_predictions=True,
        _load=_load_pytorch,
        _library_layers=_pytorch_library_layers,
        _worker_environments=_pytorch_workers,
        _build_trainer=_pytorch_trainer,
        _check_checkpoint=_pytorch_checkpoint,
    ),
}
NAMES = tuple(_BACKENDS)  # DEFAULT first


def get(name: str) -> Backend:
    """The backend called `name`; one line naming the known ones where there is none."""
    try:
        return _BACKENDS[name]
    except (KeyError, TypeError):
        raise UserError(f"unknown framework {name!r}: use {' or '.join(NAMES)}") from None
