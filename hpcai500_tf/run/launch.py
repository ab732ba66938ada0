"""`hpcai500-tf train ... --workers N`: N worker processes on this machine, one run, one record.

Each worker gets a `TF_CONFIG` naming every worker on loopback, with ports chosen free at
launch. On a GPU node every worker sees every GPU CUDA makes visible (`CUDA_VISIBLE_DEVICES`
as it was, or unset) and gets its contiguous share in `HPCAI500_WORKER_GPUS`, which it gives
TensorFlow with tf.config.set_visible_devices: NCCL between local workers then sees the peers'
GPUs, which its peer-to-peer path (NVLink, PCIe) needs on some NCCL and CUDA versions.
`HPCAI500_GPU_PLACEMENT=cuda_visible_devices` gives each worker only its share as
`CUDA_VISIBLE_DEVICES` instead. Every worker gets its share of the cores' threads.
Worker 0 (the chief) prints to this console and writes the record; every worker's
messages (TensorFlow's included) go to `RUN_DIR/workers/worker-I.log`. When a worker fails,
the others get the communication timeout to end on their own (the chief then records the run
as stopped), then SIGTERM, then SIGKILL (a worker waiting for a lost peer ignores SIGTERM):
no process outlives the launcher.

The workers run in a process group of their own, so that a signal to the run reaches them once,
from the launcher: SIGTERM, SIGINT (Ctrl-C) and SIGHUP (a closed terminal) to the launcher are
passed to every worker at once (SIGHUP as SIGTERM, the stop that keeps the work), and the
launcher waits for them (`STOP_GRACE_S`, then SIGKILL) and exits with the chief's code: one
stopped run, its record written by the chief, `--resume` continuing it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hpcai500_tf import backends
from hpcai500_tf.cluster.devices import WORKER_GPUS
from hpcai500_tf.cluster.local_workers import MAX_WORKERS
from hpcai500_tf.config import Setup
from hpcai500_tf.errors import UserError
from hpcai500_tf.files import open_for_append
from hpcai500_tf.run import directory as run_directory
from hpcai500_tf.run.directory import INHERITED_LOCK, RunDirectory
from hpcai500_tf.run.stop import FORWARDED
from hpcai500_tf.run.trainer import refuse_unshardable_config

TERM_GRACE_S = 5.0
DEFAULT_FAILURE_GRACE_S = 30.0
STOP_GRACE_S = 30.0  # for the workers to write the stopped record after a forwarded signal
# The exit status of a worker a stop signal sent to it alone ended (run/stop.py): every other
# worker stops after the same step, the chief writing the stopped record.
STOPPED_BY_A_SIGNAL = (128 + signal.SIGTERM, 128 + signal.SIGUSR1)


def worker_args(args) -> list[str]:
    """The `train` arguments each launched worker gets from the launcher's own (the launcher
    adds TF_CONFIG, and --run-dir or --resume). A resumed run's workers read its saved config;
    every worker chooses multi_worker itself (TF_CONFIG is set)."""
    forwarded = [args.benchmark] if args.benchmark else []
    if args.preset:
        forwarded += ["--preset", args.preset]
    if args.config:
        forwarded += ["--config", args.config]
    for override in args.set:
        forwarded += ["--set", override]
    if args.data:
        forwarded += ["--data", args.data]
    forwarded += ["--power-hz", str(args.power_hz)]
    if args.meter_log:
        forwarded += ["--meter-log", args.meter_log]
    if not args.tensorboard:
        forwarded += ["--no-tensorboard"]
    if args.profile_steps:
        forwarded += ["--profile-steps", "-".join(map(str, args.profile_steps))]
    if args.allow_cpu:
        forwarded += ["--allow-cpu"]
    if getattr(args, "framework", None):
        forwarded += ["--framework", args.framework]
    if getattr(args, "device", "auto") != "auto":
        forwarded += ["--device", args.device]
    return forwarded


def gpu_shares(environments: list[dict[str, str]], gpus: list[str]) -> tuple[int, str]:
    """(GPUs per worker, the launch line's words for each worker's GPUs): CUDA_VISIBLE_DEVICES
    entries (node indices or UUIDs), and what keeps the workers to them."""
    if not any(WORKER_GPUS in env for env in environments):
        named = [env["CUDA_VISIBLE_DEVICES"] for env in environments]
        return len(named[0].split(",")), "CUDA_VISIBLE_DEVICES " + " | ".join(named)
    named = [
        ",".join(gpus[int(position)] for position in env[WORKER_GPUS].split(","))
        for env in environments
    ]
    listed = environments[0].get("CUDA_VISIBLE_DEVICES")
    seen = f"CUDA_VISIBLE_DEVICES={listed}" if listed is not None else "every GPU"
    shares = " | ".join(named)
    return len(named[0].split(",")), (
        f"GPUs {shares} by tf.config.set_visible_devices, each worker seeing {seen}"
    )


def _failure_line(path: Path) -> str:
    """What a failed worker said last: its one-line error, else the last line naming an error
    (a traceback's end), else nothing."""
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    ours = [line for line in lines if line.startswith("hpcai500-tf: error: ")]
    if ours:
        return ours[-1].removeprefix("hpcai500-tf: error: ")[:300]
    errors = [line for line in lines if "Error" in line and line[:1] not in "IWE"]
    return errors[-1][:300] if errors else ""


def _end(processes: list[subprocess.Popen], grace_s: float) -> None:
    """Wait up to `grace_s` for every process to end, then SIGTERM, then SIGKILL."""
    deadline = time.monotonic() + grace_s
    while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
        time.sleep(0.1)
    for sig, wait_s in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, 10.0)):
        alive = [p for p in processes if p.poll() is None]
        if not alive:
            return
        for process in alive:
            process.send_signal(sig)
        deadline = time.monotonic() + wait_s
        while any(p.poll() is None for p in alive) and time.monotonic() < deadline:
            time.sleep(0.05)


class _Forward:
    """The launcher's handler of the `FORWARDED` signals: the first is passed to every worker
    started (and stops the start of more); later ones are ignored, since a second SIGINT
    would interrupt the record the workers are writing (SIGKILL stays the hard stop)."""

    def __init__(self, processes: list[subprocess.Popen]):
        self.processes = processes
        self.received: int | None = None
        self.at = 0.0
        self.signalled = 0  # the workers started when the signal came, which it was passed to
        self.all_started = False  # every worker was started before the signal

    def __call__(self, signum, frame) -> None:
        if self.received is not None:
            return
        self.received, self.at = signum, time.monotonic()
        self.signalled = len(self.processes)
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(FORWARDED[signum])


@contextlib.contextmanager
def _forwarding(processes: list[subprocess.Popen]):
    """`_Forward` in place for the `FORWARDED` signals while inside (main thread only: Python
    runs handlers there), the previous handlers restored after."""
    forward = _Forward(processes)
    if threading.current_thread() is not threading.main_thread():
        yield forward
        return
    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED}
    try:
        yield forward
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def launch(
    setup: Setup,
    worker_args: list[str],
    workers: int,
    out_dir: str | Path,
    resume: str | None = None,
    on_start: Callable[[list[subprocess.Popen]], None] | None = None,
    framework: str = backends.DEFAULT,
) -> int:
    """Run `hpcai500-tf train` as `workers` processes; returns the exit code of the run. Each
    TensorFlow worker gets a TF_CONFIG; each PyTorch worker torch.distributed's variables,
    rank 0 waiting for the others on one loopback port."""
    if not 2 <= workers <= MAX_WORKERS:
        raise UserError(f"--workers must be in [2, {MAX_WORKERS}] to launch several, got {workers}")
    if "TF_CONFIG" in os.environ:
        raise UserError("TF_CONFIG is set: start each worker yourself, or unset it for --workers")
    refuse_unshardable_config(setup, workers)  # before any worker starts
    backend = backends.get(framework)
    environments, ports, gpus = backend.worker_environments(setup, workers, os.environ)
    run_dir = RunDirectory(resume) if resume else None
    if run_dir and not run_dir.path.is_dir():
        raise UserError(f"{run_dir}: not a run directory")
    run_dir = run_dir or RunDirectory.new(out_dir, setup.benchmark.name, setup.preset)
    lock = run_directory.hold(run_dir)  # the one writer, for every worker: each inherits it
    logs = run_dir.workers
    logs.mkdir(exist_ok=True)
    # Every worker's log (a resumed run adds to it), opened before any worker starts.
    log_files = [open_for_append(run_dir.worker_log(index)) for index in range(workers)]
    command = [sys.executable, "-m", "hpcai500_tf.cli", "train", *worker_args]
    command += ["--resume", str(run_dir)] if resume else ["--run-dir", str(run_dir)]
    processes = []
    each = f"{environments[0][backend.threads_variable]} intra-op threads each"
    if gpus:
        per_worker, shares = gpu_shares(environments, gpus)
        each = f"{per_worker} GPU(s) and {each}; {shares}"
    stopped = False
    try:
        with _forwarding(processes) as forward:
            print(
                f"launching {workers} workers on 127.0.0.1 ports {', '.join(map(str, ports))} "
                f"({each}); logs in {logs}",
                flush=True,
            )
            _start_workers(command, environments, log_files, lock, processes, forward)
            forward.all_started = forward.received is None
            if on_start:
                on_start(processes)
            code = _supervise(processes, run_dir, setup.communication.timeout_s, forward)
            stopped = forward.received is not None
            return code
    except KeyboardInterrupt:
        stopped = True
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        _end(processes, TERM_GRACE_S)
        raise
    finally:
        _end(processes, 0.0)
        for log in log_files:
            log.close()
        lock.release()
        if stopped:
            _remove_unstarted(run_dir, resume)


def _start_workers(command, environments, log_files, lock, processes, forward) -> None:
    """Start one worker per environment into `processes`, each in its own process group (a
    terminal's signal reaches it once, through the launcher) with the run directory's lock
    open (INHERITED_LOCK names its descriptor); none after a signal was `forward`ed."""
    for index, env in enumerate(environments):
        if forward.received is not None:
            break  # stopped while starting: no more workers
        log = log_files[index]
        # The chief's console output is the run's; everyone's stderr (TensorFlow's messages
        # included) goes to its log, whose last line is shown on failure.
        stdout = None if index == 0 else log
        env = {**env, INHERITED_LOCK: str(lock.fileno())}
        processes.append(
            subprocess.Popen(
                command, env=env, stdout=stdout, stderr=log, pass_fds=(lock.fileno(),),
                process_group=0,
            )
        )  # fmt: skip


def _remove_unstarted(run_dir: RunDirectory, resume: str | None) -> None:
    """A new run's directory removed where nothing of the run is in it yet (no record, no
    state and no run_start in its MLPerf log: stopped before its timed run began), so that a
    stop during start-up never leaves a directory of worker logs alone; a stop after it
    leaves the chief's stopped record. A resumed run's directory is never removed."""
    if resume or any(os.path.lexists(p) for p in (run_dir.state, run_dir.record)):
        return
    if not _run_began(run_dir, unreadable=True):
        shutil.rmtree(run_dir.path, ignore_errors=True)


def _run_began(run_dir: RunDirectory, unreadable: bool) -> bool:
    """Whether the run's MLPerf log holds a run_start (its timed part began); `unreadable`
    where the log is there but cannot be read."""
    try:
        with open(run_dir.mlperf_log, "rb") as log:
            return b'"key": "run_start"' in log.read(1 << 20)
    except FileNotFoundError:
        return False
    except OSError:
        return unreadable


def _supervise(
    processes: list[subprocess.Popen], run_dir: RunDirectory, timeout_s: float, forward: _Forward
) -> int:
    while True:
        if forward.received is not None:
            return _stopped(processes, forward, run_dir)
        codes = [p.poll() for p in processes]
        if all(code == 0 for code in codes):
            return 0
        failed = next((i for i, code in enumerate(codes) if code not in (None, 0)), None)
        if failed is not None:
            break
        time.sleep(0.1)
    code = codes[failed]
    if code in STOPPED_BY_A_SIGNAL:  # a stop signal sent to one worker: all stop with it
        _end(processes, STOP_GRACE_S)
        chief = processes[0].returncode
        return chief if chief is not None and chief >= 0 else code
    why = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    _end(processes, timeout_s or DEFAULT_FAILURE_GRACE_S)
    log = run_dir.worker_log(failed)
    detail = _failure_line(log)
    print(
        f"hpcai500-tf: error: worker {failed} {why}"
        + (f": {detail}" if detail else "")
        + f" (its log: {log}); the run was ended on every worker",
        file=sys.stderr,
        flush=True,
    )
    return 2 if code == 2 else 1


def _stopped(processes: list[subprocess.Popen], forward: _Forward, run_dir: RunDirectory) -> int:
    """The end of a run the launcher passed a signal to: every worker given `STOP_GRACE_S`
    from the signal to write its part of the stopped run, then ended; the chief's exit code
    (128 + the signal where it was killed). Stopped before the run began (a worker not yet
    started, or no run_start logged), the run has no work to keep and a worker may wait for a
    peer that is gone: every one ends within `TERM_GRACE_S`; the launcher exits 128 + the
    signal."""
    for process in processes[forward.signalled :]:  # started as the signal came
        if process.poll() is None:
            process.send_signal(FORWARDED[forward.received])
    if not (forward.all_started and _run_began(run_dir, unreadable=True)):
        _end(processes, TERM_GRACE_S)
        return 128 + forward.received
    grace = STOP_GRACE_S - (time.monotonic() - forward.at)
    _end(processes, max(grace, 0.0))
    name = signal.Signals(forward.received).name
    for index, process in enumerate(processes):
        if process.returncode == -signal.SIGKILL:
            print(
                f"hpcai500-tf: worker {index} had not ended {STOP_GRACE_S:g} s after {name}: "
                "killed",
                file=sys.stderr,
                flush=True,
            )
    code = processes[0].returncode if processes else None
    if code is None or code < 0:
        return 128 + (-code if code else forward.received)
    return code
