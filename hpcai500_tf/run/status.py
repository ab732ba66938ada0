"""How a run ends: its status words for every ending (divergence, Ctrl-C, SIGTERM, a lost peer,
bad data, a defect), the SIGTERM stop, and the exit codes; the same on every framework."""

from __future__ import annotations

import contextlib
import signal
import threading
import traceback

from hpcai500_tf.errors import UserError
from hpcai500_tf.run import stop
from hpcai500_tf.run.directory import RunDirectory, checkpoint_name


class Diverged(Exception):
    """The loss became NaN or Inf: the run's status is `diverged`, on every framework."""


def diverged(value: float, epoch: int, step: int) -> Diverged:
    """What a run whose loss became `value` at `step` of `epoch` (both from 1) says."""
    return Diverged(f"loss became {value} in epoch {epoch}, step {step}")


def data_failed(reason: object) -> tuple[str, str]:
    """(status, warning) of a run whose input data failed mid-run, on every framework."""
    return "failed", f"the input data failed mid-run: {reason}"


class Terminated(KeyboardInterrupt):
    """SIGTERM (scancel, a Slurm time limit, preemption), raised in the main thread by the
    handler `stop_on_sigterm` installs: it ends a run as Ctrl-C does (a `stopped` record that
    `--resume` continues), and the process exits 143 (128 + SIGTERM)."""

    exit_code = 128 + signal.SIGTERM

    def __init__(self):
        super().__init__("terminated by SIGTERM")


SIGTERM_STOPPED = "stopped by SIGTERM (scancel, a time limit or preemption)"


class SigtermStop:
    """The SIGTERM handler: the first one raises `Terminated` (or, once `defer` is set, while
    the record is written, is only noted); later ones are ignored, as the run is already
    ending (SIGKILL after the scheduler's grace period remains the hard stop)."""

    replaceable = True  # by stop.listening, inside the epoch loop

    def __init__(self):
        self.received = False
        self.defer = False
        self.installed = False

    def take_back(self) -> None:
        """Install this handler again where it was installed: a framework may replace it
        while it joins its workers (TensorFlow's coordination service does, below Python)."""
        if self.installed:
            signal.signal(signal.SIGTERM, self)

    def __call__(self, signum, frame):
        if self.received:
            return
        self.received = True
        if not self.defer:
            raise Terminated


@contextlib.contextmanager
def stop_on_sigterm():
    """SIGTERM stops the run as Ctrl-C does, while inside; the previous handler is restored
    after. Installed only from the main thread (Python runs signal handlers there) and only
    over the default handler, so that a handler of the caller's own is kept.

    Python runs the handler between bytecodes of the main thread, so a worker blocked inside
    a collective ignores SIGTERM until the collective returns: at once when a peer stopped
    first, within the communication timeout when a peer hangs. One that never returns (a peer
    that never joins) is ended by SIGKILL: the scheduler's, the launcher's or the join
    watchdog's."""
    handler = SigtermStop()
    handler.installed = (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    )
    if handler.installed:
        signal.signal(signal.SIGTERM, handler)
    try:
        yield handler
    finally:
        if handler.installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def exit_code(record: dict) -> int:
    """The exit status of `train` for the chief's record: 0 completed, 143 (128 + SIGTERM)
    stopped by SIGTERM, 1 otherwise (Ctrl-C's stopped record included)."""
    if record["status"] == "completed":
        return 0
    agreed = stop.exit_code_of(record["warnings"])  # an agreed SIGTERM or SIGUSR1 stop
    if record["status"] == "stopped" and agreed:
        return agreed
    if record["status"] == "stopped" and any(
        w.startswith(SIGTERM_STOPPED) for w in record["warnings"]
    ):
        return Terminated.exit_code
    return 1


class WorkerRunEnded(Exception):
    """A worker other than the chief saw the run end early: it exits non-zero (`code`) with
    the reason (the chief writes the record), so that a scheduler never counts that task a
    success."""

    def __init__(self, rank: int, status: str, reason: str, code: int = 1):
        super().__init__(f"worker {rank}: run {status}: {reason}")
        self.code = code


def classify_failure(error: BaseException, one) -> tuple[str, str, bool]:
    """(status, warning, whether a peer was lost) for what ended a run (`one`, the
    lifecycle's `Run`) early."""
    where = one.run_dir or "RUN_DIR (the chief's run directory)"
    if isinstance(error, Diverged):
        return "diverged", str(error), False
    if isinstance(error, stop.AgreedStop):  # every worker after the same step: all still here
        return "stopped", _agreed_stop_warning(error, one, where), False
    if isinstance(error, KeyboardInterrupt):  # Ctrl-C, or SIGTERM (Terminated)
        saved = one.saved_epochs
        if not one.chief:  # the chief writes the checkpoints
            resume = f"resume with --resume {where} (from the chief's last checkpoint)"
        elif saved is None:
            resume = "no checkpoint was written yet: it cannot be resumed"
        else:
            resume = (
                f"the last checkpoint holds {saved}: resume with --resume {where} "
                f"(it continues from epoch {saved + 1})"
            )
        done = one.progress.epochs_done
        # The peers get it too, each at its own point of the loop: no energy collective after.
        several = one.workers > 1
        if isinstance(error, Terminated):
            return "stopped", f"{SIGTERM_STOPPED} after {done} epoch(s); {resume}", several
        return "stopped", f"interrupted by the user after {done} epoch(s); {resume}", several
    failure = one.trainer.explain(error)
    if failure and failure.kind == "data":
        return (*data_failed(failure.detail), False)
    if failure and failure.kind == "peer_lost" and one.workers > 1:
        lost = f"lost contact with a peer worker ({failure.detail})"
        return "stopped", f"{lost}; resume with --resume {where}", True
    if failure:
        return "failed", f"the run failed: {failure.detail}", False
    if isinstance(error, UserError):
        return "failed", f"the run failed: {error}", False
    if isinstance(error, OSError) and error.filename is not None:  # a file it writes: disk full
        return "failed", f"the run failed: {error.filename}: {error.strerror}", False
    # A defect: still a record, and its traceback beside it.
    logged = _write_traceback(one.run_dir if one.chief else None)
    return "failed", f"the run failed: {error.__class__.__name__}: {error}{logged}", False


def _write_traceback(run_dir: RunDirectory | None) -> str:
    """The current exception's traceback in RUN_DIR/error.log; a note saying where."""
    if run_dir is None:
        return ""
    try:
        run_dir.error_log.write_text(traceback.format_exc())
    except OSError:
        return ""
    return f" (traceback in {run_dir.error_log})"


def _agreed_stop_warning(error: stop.AgreedStop, one, where) -> str:
    """What an agreed stop's record says: the signal, the position, how to resume."""
    done, batches = one.progress.epochs_done, one.progress.batches_done
    if not one.chief:
        resume = f"resume with --resume {where} (from the chief's checkpoint at the stop)"
    elif one.saved_position == (done, batches):
        at = checkpoint_name(done, batches)
        resume = f"its checkpoint {at} was written at the stop: resume with --resume {where}"
    else:  # no run directory to write it in
        resume = "no checkpoint was written at the stop: it cannot be resumed from there"
    return stop.warning(error, done, batches, resume)
