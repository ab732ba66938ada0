"""A run's directory: every path in it, named once.

    RUN_DIR/config.json          the resolved config the run was started with
    RUN_DIR/state.json           the resume state: progress so far and the checkpoint it names
    RUN_DIR/checkpoints/ckpt-N   the model and optimizer after N epochs (TensorFlow's index and
                                 data files, or PyTorch's ckpt-N.pt)
    RUN_DIR/mlperf.log           the MLPerf log (:::MLLOG lines), appended to by a resume
    RUN_DIR/power-samples.csv    every power reading of the timed run
    RUN_DIR/tensorboard/         scalars, HParams and profiler traces
    RUN_DIR/workers/             each worker's log and power readings (several workers)
    RUN_DIR/error.log            the traceback of a run that failed on a defect
    RUN_DIR/record.json          the record: written last, the run's result

Pure Python; every module that reads or writes a run's files takes its paths from here.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from hpcai500_tf.errors import UserError
from hpcai500_tf.files import check_output_directory

CONFIG_FILE = "config.json"
STATE_FILE = "state.json"
RECORD_FILE = "record.json"
MLPERF_LOG = "mlperf.log"
POWER_SAMPLES = "power-samples.csv"
ERROR_LOG = "error.log"
CHECKPOINTS = "checkpoints"
TENSORBOARD = "tensorboard"
WORKERS = "workers"


@dataclass(frozen=True)
class RunDirectory:
    """The paths of one run's files (nothing is created by naming them)."""

    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    def __str__(self) -> str:
        return str(self.path)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def config(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def state(self) -> Path:
        return self.path / STATE_FILE

    @property
    def record(self) -> Path:
        return self.path / RECORD_FILE

    @property
    def mlperf_log(self) -> Path:
        return self.path / MLPERF_LOG

    @property
    def power_samples(self) -> Path:
        return self.path / POWER_SAMPLES

    @property
    def error_log(self) -> Path:
        return self.path / ERROR_LOG

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def tensorboard(self) -> Path:
        return self.path / TENSORBOARD

    @property
    def workers(self) -> Path:
        return self.path / WORKERS

    def checkpoint(self, epochs_done: int) -> Path:
        """The prefix of the checkpoint written after `epochs_done` epochs."""
        return self.checkpoints / f"ckpt-{epochs_done}"

    def worker_log(self, index: int) -> Path:
        return self.workers / f"worker-{index}.log"

    def worker_power_samples(self, rank: int) -> Path:
        """A worker's power readings beside its log (worker 0's are the run's own file)."""
        return self.power_samples if rank == 0 else self.workers / f"power-samples-worker{rank}.csv"

    @classmethod
    def new(cls, out_dir: str | Path, benchmark: str, preset: str) -> RunDirectory:
        """A new, empty directory for one run: BENCHMARK-PRESET-TIMESTAMP under `out_dir`."""
        check_output_directory("--out", out_dir)
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        if len(preset.encode()) > 160:  # a config file's long name: the directory's stays < 255
            digest = hashlib.sha256(preset.encode()).hexdigest()[:8]
            preset = preset.encode()[:150].decode(errors="ignore") + "-" + digest
        path = Path(out_dir) / f"{benchmark}-{preset}-{stamp}"
        if path.exists():
            raise UserError(f"{path}: already exists; refusing to overwrite it")
        path.mkdir(parents=True)
        return cls(path)
