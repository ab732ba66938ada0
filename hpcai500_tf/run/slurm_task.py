"""One srun task's instance of `train --instances M`, run as a child that a stop reaches too.

scancel (or srun's own stop) sends SIGTERM to every process of the step: the task's `train`
child writes its stopped record, and this process, instead of dying with the default
handler, passes the signal on (a second SIGTERM is ignored by a run already stopping), waits
for the child to end, and returns, so that the task still leaves its member note and the
last chief the throughput record. SIGINT and SIGUSR1 (Slurm's warning before a time limit)
are passed on as they are, SIGHUP as SIGTERM (`stop.FORWARDED`). A child
that has not ended `STOP_GRACE_S` after the signal is killed (Slurm's KillWait, 30 s by
default, kills both sooner where it is shorter). The stop signals stay blocked once the
child has ended: a stop that comes as the task writes its member note (milliseconds before it
exits) cannot cut the note or the throughput record short.
"""

from __future__ import annotations

import signal
import subprocess
import time

from hpcai500_tf.run.stop import FORWARDED

STOP_GRACE_S = 60.0


class _Forward:
    """The first stop signal, passed on to the child (once it exists); later ones ignored."""

    def __init__(self):
        self.child: subprocess.Popen | None = None
        self.received: int | None = None
        self.at = 0.0

    def __call__(self, signum, frame) -> None:
        if self.received is None:
            self.received, self.at = signum, time.monotonic()
            self.pass_on()

    def pass_on(self) -> None:
        if self.received is not None and self.child and self.child.poll() is None:
            self.child.send_signal(FORWARDED[self.received])


def run_instance(command: list[str], env: dict[str, str]) -> tuple[int, int | None]:
    """(the child's exit code, the first stop signal this task received or None)."""
    stop = _Forward()
    previous = {signum: signal.signal(signum, stop) for signum in FORWARDED}
    try:
        stop.child = subprocess.Popen(command, env=env)
        stop.pass_on()  # a signal before the child existed: it is stopped as it starts
        while stop.child.poll() is None:
            if stop.received is not None and time.monotonic() - stop.at > STOP_GRACE_S:
                break
            time.sleep(0.1)
    finally:
        if stop.child is not None and stop.child.poll() is None:  # never outlives this task
            stop.child.kill()
            stop.child.wait()
        signal.pthread_sigmask(signal.SIG_BLOCK, set(FORWARDED))  # see the module's doc
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return stop.child.returncode, stop.received
