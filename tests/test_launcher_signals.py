"""The `--workers` launcher passes SIGTERM, SIGINT and SIGHUP to its workers at once and ends
as one stopped run with the chief's exit code; it never sits on a signal
(hpcai500_tf/run/launch.py)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpcai500_tf import record
from hpcai500_tf.run import launch
from hpcai500_tf.run import status as run
from hpcai500_tf.run.directory import RunDirectory

# A worker that says which signal it got in its exit code (100 + the signal's number).
WORKER = (
    "import signal, sys, time\n"
    "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
    "    signal.signal(s, lambda n, f: sys.exit(100 + n))\n"
    "{ignore}"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def _workers(count: int, ignore: str = "") -> list[subprocess.Popen]:
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER.format(ignore=ignore)],
            stdout=subprocess.PIPE,
            text=True,
            process_group=0,
        )  # fmt: skip
        for _ in range(count)
    ]
    for process in processes:
        assert process.stdout.readline() == "ready\n"
    return processes


def _supervise_through(sent: int, processes, tmp_path, began=True) -> tuple[int, float]:
    """The launcher's supervision with `sent` delivered to it (this process) half a second in,
    every worker started and (where `began`) the run's run_start logged."""
    run_dir = RunDirectory(tmp_path)
    if began:
        run_dir.mlperf_log.write_text(':::MLLOG {"key": "run_start"}\n')
    started = time.monotonic()
    try:
        with launch._forwarding(processes) as forward:
            forward.all_started = True
            threading.Timer(0.5, os.kill, (os.getpid(), sent)).start()
            code = launch._supervise(processes, run_dir, 1.0, forward)
    finally:
        launch._end(processes, 0.0)
    return code, time.monotonic() - started


@pytest.mark.parametrize(
    "sent, got",
    [
        (signal.SIGTERM, signal.SIGTERM),
        (signal.SIGINT, signal.SIGINT),
        (signal.SIGHUP, signal.SIGTERM),
    ],  # fmt: skip
)
def test_a_signal_to_the_launcher_reaches_every_worker_at_once(sent, got, tmp_path):
    before = {s: signal.getsignal(s) for s in launch.FORWARDED}
    processes = _workers(2)
    code, seconds = _supervise_through(sent, processes, tmp_path)
    assert [p.returncode for p in processes] == [100 + got, 100 + got]
    assert code == 100 + got  # the chief's
    assert seconds < 10, seconds
    assert {s: signal.getsignal(s) for s in launch.FORWARDED} == before


def test_a_worker_that_does_not_stop_is_killed_after_the_grace(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(launch, "STOP_GRACE_S", 1.0)
    monkeypatch.setattr(launch, "TERM_GRACE_S", 0.5)
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    processes = [*_workers(1, ignore), *_workers(1)]
    code, seconds = _supervise_through(signal.SIGTERM, processes, tmp_path)
    assert [p.returncode for p in processes] == [-signal.SIGKILL, 100 + signal.SIGTERM]
    assert code == 128 + signal.SIGKILL
    assert seconds < 10, seconds
    err = capsys.readouterr().err
    assert err.strip() == "hpcai500-tf: worker 0 had not ended 1 s after SIGTERM: killed", err


def _processes_naming(text: str) -> list[int]:
    """The pids of live processes whose command line holds `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if text in cmdline and state != "Z":
                found.append(int(entry.name))
    return found


@pytest.mark.slow  # ~2 min on 2 loaded cores: two workers start, train an epoch, stop
@pytest.mark.parametrize("framework", ["tensorflow", "pytorch"])
def test_sigterm_to_the_launcher_stops_the_run_resumably(framework, tmp_path, request):
    if framework == "pytorch":
        request.getfixturevalue("torch_installed")
    out = tmp_path / "runs"
    command = [sys.executable, "-m", "hpcai500_tf.cli", "train", "image_classification",
               "--preset", "tiny", "--framework", framework, "--workers", "2", "--power-hz", "0",
               "--set", "training.epochs=20", "--out", str(out)]  # fmt: skip
    with (tmp_path / "stdout").open("w") as stdout, (tmp_path / "stderr").open("w") as stderr:
        launcher = subprocess.Popen(command, stdout=stdout, stderr=stderr)
    try:
        deadline = time.monotonic() + 400
        while not list(out.glob("*/state.json")) and launcher.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint after 400 s"
            time.sleep(0.1)  # the first epoch's checkpoint
        assert launcher.poll() is None, (tmp_path / "stderr").read_text()[-2000:]
        (run_dir,) = out.glob("*")
        assert len(_processes_naming(str(run_dir))) == 2  # the workers
        launcher.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = launcher.wait(launch.STOP_GRACE_S + 30)
        seconds = time.monotonic() - sent
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(30)
    err = (tmp_path / "stderr").read_text()
    assert code == 143, f"exit status {code}; stderr: {err[-2000:]}"
    assert seconds < 30, seconds
    assert _processes_naming(str(run_dir)) == []
    assert "Traceback" not in err + (tmp_path / "stdout").read_text(), err[-2000:]
    stopped = record.load(run_dir / "record.json")
    assert stopped["status"] == "stopped", stopped["warnings"]
    assert any(w.startswith(run.SIGTERM_STOPPED) for w in stopped["warnings"])
    assert len(stopped["timeline"]["epochs"]) < 20
    state = json.loads((run_dir / "state.json").read_text())
    assert state["epochs_done"] >= 1


def test_a_signal_before_the_run_began_ends_every_worker_within_the_short_grace(tmp_path):
    """No run_start yet: nothing to keep, and a worker may wait for a peer already gone; the
    launcher ends them all within TERM_GRACE_S and exits 128 + the signal."""
    ignore = "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"  # as one waiting in a join
    processes = [*_workers(1, ignore), *_workers(1)]
    code, seconds = _supervise_through(signal.SIGINT, processes, tmp_path, began=False)
    assert code == 128 + signal.SIGINT
    assert processes[0].returncode in (-signal.SIGTERM, 100 + signal.SIGTERM)
    assert seconds < launch.TERM_GRACE_S + 5, seconds
