"""A stop that keeps its work: a signal asks, every worker agrees at a step boundary.

    with listening() as request:       SIGINT, SIGTERM and SIGUSR1 only set `request.signum`
        agreed = trainer.agreed_stop()      the votes two steps back: no collective of its own
        if agreed: raise AgreedStop(agreed, local=request.signum == agreed)
        trainer.train_step(batch, request.signum)   the step's reduction carries the vote

A signal on any one worker (Ctrl-C, scancel's SIGTERM, Slurm's SIGUSR1 warning before a time
limit) stops every worker after the same step, so that none is left inside a collective the
others never join; the lifecycle then writes a checkpoint at that step (mid-epoch) and the
`stopped` record. A second Ctrl-C while a stop is pending raises `ForcedStop` at once (a
person's escape from a step that never ends): the run stops from its last checkpoint. A second
SIGTERM or SIGUSR1 does not (a scheduler repeats them: its signal to every process of a step,
its time limit's SIGTERM after the SIGUSR1 warning) and the stop still keeps its step; the
scheduler's SIGKILL remains the hard stop.

The vote a trainer carries is `vote(signum)`, one float per stop signal, summed over the
workers by a reduction the step does anyway (TensorFlow: the loss's; PyTorch: DDP's first
gradient bucket), and `PendingVotes` holds the sums of the last two steps: the one read is
two steps back, long ended, so the host never waits for the device to read it, and every
worker reads the same sums of the same step, so all stop after the same step (at most two
steps after the one the signal came during). Pure Python: no framework is imported here.
"""

from __future__ import annotations

import collections
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Sequence

# In the order a vote names them: where workers got different ones, the last wins.
STOP_SIGNALS = (signal.SIGINT, signal.SIGUSR1, signal.SIGTERM)
WHY = {
    signal.SIGINT: "interrupted by the user (SIGINT)",
    signal.SIGUSR1: "stopped by SIGUSR1 (Slurm's warning before a time limit, to requeue)",
    signal.SIGTERM: "stopped by SIGTERM (scancel, a time limit or preemption)",
}

# What a process that starts runs (--workers, --instances, an srun task's instance) passes on
# to them, as what each gets: every stop signal, and a closed terminal's SIGHUP as SIGTERM.
FORWARDED = {signal.SIGTERM: signal.SIGTERM, signal.SIGINT: signal.SIGINT,
             signal.SIGHUP: signal.SIGTERM, signal.SIGUSR1: signal.SIGUSR1}  # fmt: skip


class AgreedStop(KeyboardInterrupt):
    """Every worker stops after the same step for `signum`, which `local` says whether this
    worker got itself (else a peer did). Exits 128 + the signal, except Ctrl-C's 1 (as
    before: a stopped record's exit status)."""

    def __init__(self, signum: int, local: bool = True):
        self.signum = signum
        self.local = local
        self.exit_code = 1 if signum == signal.SIGINT else 128 + signum
        super().__init__(WHY[signum])


class ForcedStop(KeyboardInterrupt):
    """A Ctrl-C while a stop waited for its step boundary: raised at once."""

    def __init__(self, signum: int):
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"{signal.Signals(signum).name} again: stopped at once")


class StopRequest:
    """The handler of the stop signals: the first only sets `signum`; a later SIGINT raises
    `ForcedStop` (unless `defer`: the run is already writing what it keeps), a later SIGTERM
    or SIGUSR1 is only a repeat of the stop already asked for."""

    replaceable = True  # `noting`'s, by the loop's `listening`

    def __init__(self):
        self.signum = 0  # 0: no stop asked for on this worker
        self.defer = False

    def __call__(self, signum, frame):
        if not self.signum:
            self.signum = signum
        elif signum == signal.SIGINT and not self.defer:
            raise ForcedStop(signum)


_noted = StopRequest()  # a stop signal `noting` kept before the epoch loop listened


@contextlib.contextmanager
def noting(signals: Sequence[int] = (signal.SIGUSR1,)) -> Iterator[None]:
    """While inside, `signals` (whose default action ends the process) are only noted, and
    the epoch loop's `listening` takes the first one over: Slurm's warning during start-up
    stops the run after its second step (the first whose vote is read), checkpointed."""
    _noted.signum = 0
    _noted.defer = True  # never raises: start-up has no step boundary to wait for
    with _installed(_noted, signals):
        try:
            yield
        finally:
            _noted.signum = 0


@contextlib.contextmanager
def listening(signals: Sequence[int] = STOP_SIGNALS) -> Iterator[StopRequest]:
    """A `StopRequest` in place for `signals` while inside (main thread only: Python runs
    handlers there; elsewhere the request stays unset), the previous handlers restored after.
    A handler of the caller's own (not Python's or the lifecycle's defaults) is kept too: only
    SIG_DFL, Python's SIGINT default and a handler marked `replaceable` are replaced."""
    request = StopRequest()
    request.signum, _noted.signum = _noted.signum, 0
    with _installed(request, signals):
        yield request


@contextlib.contextmanager
def _installed(request: StopRequest, signals: Sequence[int]) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for signum in signals:
        handler = signal.getsignal(signum)
        if handler in (signal.SIG_DFL, signal.default_int_handler) or getattr(
            handler, "replaceable", False
        ):
            previous[signum] = signal.signal(signum, request)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def vote(signum: int) -> list[float]:
    """This worker's vote: 1.0 at its stop signal's place in `STOP_SIGNALS`, else zeros."""
    return [1.0 if signum == s else 0.0 for s in STOP_SIGNALS]


def agreed(votes: Sequence[float]) -> int:
    """The signal the summed votes stop for (the last of `STOP_SIGNALS` any worker got), or 0."""
    for signum, count in zip(reversed(STOP_SIGNALS), reversed(list(votes)), strict=True):
        if count > 0:
            return int(signum)
    return 0


class PendingVotes:
    """The summed votes of a worker's last two steps (framework tensors, read by `read`):
    `agreed()` reads the older one, two steps back; nothing before two steps have run."""

    def __init__(self, read: Callable[[object], Sequence[float]]):
        self.read = read
        self.pending: collections.deque = collections.deque(maxlen=2)

    def push(self, summed) -> None:
        self.pending.append(summed)

    def agreed(self) -> int:
        return agreed(self.read(self.pending[0])) if len(self.pending) == 2 else 0

    def clear(self) -> None:
        self.pending.clear()


def warning(stop: AgreedStop, epochs_done: int, batches_done: int, resume: str) -> str:
    """The stopped record's warning: which signal, where the run stands, how to resume."""
    where = "" if stop.local else " (sent to another worker)"
    at = f"after {epochs_done} epoch(s) and {batches_done} batch(es) of the next"
    return f"{WHY[stop.signum]}{where} {at}; {resume}"


def exit_code_of(warnings: Sequence[str]) -> int | None:
    """128 + the signal of a record an agreed SIGTERM or SIGUSR1 stopped, from its warnings
    (None where none did)."""
    for signum in (signal.SIGTERM, signal.SIGUSR1):
        if any(w.startswith(WHY[signum]) for w in warnings):
            return 128 + signum
    return None
