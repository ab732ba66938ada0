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
    RUN_DIR/run.lock             held (flock) by the one process writing the run: its pid, host
    RUN_DIR/unsaved-start-N/     the files of a start that ended before its first checkpoint,
                                 set aside by the next `--resume-or-start` (segments.py)

A new run's directory is named BENCHMARK-PRESET-TIMESTAMP, with the Slurm job (JOB, or an
array's JOB_TASK) where there is one, and -2, -3 ... where that name is taken (mkdir decides,
so runs started in the same second each get their own). One run directory has one writer: a
run, or its resume, holds `run.lock` for its whole life (the chief; under `--workers`, the
launcher, whose workers inherit it), and a second is refused in one line naming the holder.

Pure Python; every module that reads or writes a run's files takes its paths from here.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import socket
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from hpcai500_tf.errors import UserError
from hpcai500_tf.files import check_output_directory, open_lock_file

CONFIG_FILE = "config.json"
STATE_FILE = "state.json"
RECORD_FILE = "record.json"
MLPERF_LOG = "mlperf.log"
POWER_SAMPLES = "power-samples.csv"
ERROR_LOG = "error.log"
CHECKPOINTS = "checkpoints"
TENSORBOARD = "tensorboard"
WORKERS = "workers"
LOCK_FILE = "run.lock"
INHERITED_LOCK = "HPCAI500_RUN_LOCK_FD"  # the launcher's lock, open in each of its workers
UNSAVED_START = "unsaved-start"
MAX_SUFFIX = 10_000  # -2 ... -10000: more runs of one name in one second are refused


def checkpoint_name(epochs_done: int, batches_done: int = 0) -> str:
    """A checkpoint's prefix name: ckpt-N after N epochs, ckpt-N-bB B batches into the next."""
    return f"ckpt-{epochs_done}" + (f"-b{batches_done}" if batches_done else "")


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

    @property
    def lock(self) -> Path:
        return self.path / LOCK_FILE

    def holds_a_run(self) -> bool:
        """Whether this directory is a run's: empty (a run that wrote nothing yet) or holding
        any of the files or folders a run writes."""
        kept = (CONFIG_FILE, STATE_FILE, RECORD_FILE, MLPERF_LOG, POWER_SAMPLES, ERROR_LOG,
                CHECKPOINTS, TENSORBOARD, WORKERS, LOCK_FILE)  # fmt: skip
        names = {path.name for path in self.path.iterdir()}
        return not names or any(name in names for name in kept)

    def checkpoint(self, epochs_done: int, batches_done: int = 0) -> Path:
        """The prefix of the checkpoint written after `epochs_done` epochs (and `batches_done`
        batches of the next: a stop's, mid-epoch)."""
        return self.checkpoints / checkpoint_name(epochs_done, batches_done)

    def worker_log(self, index: int) -> Path:
        return self.workers / f"worker-{index}.log"

    def worker_power_samples(self, rank: int) -> Path:
        """A worker's power readings beside its log (worker 0's are the run's own file)."""
        return self.power_samples if rank == 0 else self.workers / f"power-samples-worker{rank}.csv"

    @classmethod
    def new(cls, out_dir: str | Path, benchmark: str, preset: str) -> RunDirectory:
        """A new, empty directory for one run under `out_dir`: BENCHMARK-PRESET-TIMESTAMP,
        the Slurm job's id after it where there is one, and the first free -N suffix where
        another run took that name (created by mkdir, which only one process wins)."""
        check_output_directory("--out", out_dir)
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        if len(preset.encode()) > 160:  # a config file's long name: the directory's stays < 255
            digest = hashlib.sha256(preset.encode()).hexdigest()[:8]
            preset = preset.encode()[:150].decode(errors="ignore") + "-" + digest
        base = Path(out_dir) / f"{benchmark}-{preset}-{stamp}{slurm_job_suffix(os.environ)}"
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        names = (base.name if n == 1 else f"{base.name}-{n}" for n in range(1, MAX_SUFFIX + 1))
        if path := _first_new_directory(base.parent, names):
            return cls(path)
        raise UserError(f"{base}: taken, and so are -2 to -{MAX_SUFFIX}; choose another --out")


def _first_new_directory(parent: Path, names) -> Path | None:
    """The first of `names` made a new directory in `parent` (by mkdir, which one process
    wins); None where every one is taken."""
    for name in names:
        try:
            (parent / name).mkdir()
        except FileExistsError:
            continue
        return parent / name
    return None


def slurm_job_suffix(environ) -> str:
    """-JOB_TASK for a task of a Slurm job array, -JOB in a Slurm job, '' elsewhere (a value
    that is not a short run of ASCII digits is left out of the name)."""

    def number(name: str) -> str | None:
        value = environ.get(name, "")
        return value if value.isascii() and value.isdigit() and len(value) <= 20 else None

    array, task = number("SLURM_ARRAY_JOB_ID"), number("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"-{array}_{task}"
    job = number("SLURM_JOB_ID")
    return f"-{job}" if job else ""


class RunLock:
    """The exclusive lock on a run directory (flock on RUN_DIR/run.lock), held from `hold`
    until `release` (or the end of the process: flock dies with its holder). A filesystem
    without flock leaves the run unlocked, and `warning` says so."""

    def __init__(self, handle, warning: str | None = None):
        self.handle = handle
        self.warning = warning

    def fileno(self) -> int:
        return self.handle.fileno()

    def release(self) -> None:
        if self.handle is not None:
            self.handle.close()  # the lock goes with the last descriptor of its open file
            self.handle = None


def hold(run_dir: RunDirectory) -> RunLock:
    """Take the run directory's lock, or refuse in one line naming its holder: nothing of the
    run has been read for writing or changed yet."""
    handle = open_lock_file(run_dir.lock, "run directory lock")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(handle)
        handle.close()
        raise UserError(
            f"{run_dir}: in use by another run ({holder}); one run directory has one writer: "
            "wait for that run to end, or stop it first"
        ) from None
    except OSError as error:  # e.g. Lustre mounted without flock
        if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            handle.close()
            raise UserError(f"{run_dir.lock}: cannot be locked ({error.strerror})") from None
        why = f"{run_dir.lock}: not locked ({error.strerror}); nothing stops a second writer"
        return RunLock(handle, why)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    said = f"held by pid {os.getpid()} on {socket.gethostname()} since {stamp}\n".encode()
    os.ftruncate(handle.fileno(), 0)
    os.pwrite(handle.fileno(), said, 0)
    return RunLock(handle)


def inherited(run_dir: RunDirectory, environ) -> bool:
    """Whether this process is a worker of the `--workers` launcher holding the lock on
    `run_dir`: the descriptor INHERITED_LOCK names is open on that directory's lock file."""
    text = environ.get(INHERITED_LOCK, "")
    if not (text.isascii() and text.isdigit() and len(text) < 10):
        return False
    try:
        held, named = os.fstat(int(text)), os.stat(run_dir.lock, follow_symlinks=False)
    except OSError:
        return False
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def _holder(handle) -> str:
    """Who holds the lock, as it wrote it (its first line, at most 200 characters)."""
    try:
        text = os.pread(handle.fileno(), 512, 0).decode(errors="replace")
    except OSError:
        text = ""
    said = text.strip().splitlines()[0][:200] if text.strip() else ""
    return said.removeprefix("held by ") or "a process that has not said who it is yet"


def set_aside_unsaved_start(run_dir: RunDirectory) -> str | None:
    """Where a start ended before its first checkpoint (its config there, no state, no
    record), its files moved into RUN_DIR/unsaved-start-N, kept, so that the new start's
    MLPerf log holds one run; the record's warning saying so (None: nothing to set aside).
    Called by the run's one writer, holding its lock."""
    path = run_dir.path
    if not run_dir.config.exists() or run_dir.state.exists() or run_dir.record.exists():
        return None
    aside = _first_new_directory(path, (f"{UNSAVED_START}-{n}" for n in range(1, MAX_SUFFIX + 1)))
    if aside is None:
        raise UserError(f"{path}: {MAX_SUFFIX} unsaved starts set aside already; clear them")
    for entry in sorted(path.iterdir()):
        if entry.name != LOCK_FILE and not entry.name.startswith(f"{UNSAVED_START}-"):
            entry.rename(aside / entry.name)
    return (
        f"an earlier start in {path} ended before its first checkpoint: started anew, "
        f"its files kept in {aside}"
    )
