"""One run directory, one writer, and one directory per run: a run (or its resume) holds an
exclusive lock on its directory for its whole life and a second is refused in one line naming
the holder; runs started in the same second each get their own directory (a Slurm job's id, or
a -N suffix chosen by mkdir); a `--workers` launch stopped during start-up leaves no directory
of worker logs alone."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcai500_tf import config
from hpcai500_tf.cli import build_parser
from hpcai500_tf.errors import UserError
from hpcai500_tf.run import directory as run_directory
from hpcai500_tf.run import launch
from hpcai500_tf.run import state as run_state
from hpcai500_tf.run.directory import INHERITED_LOCK, RunDirectory

ROOT = Path(__file__).resolve().parents[1]
NAME = "image_classification-tiny-20240506-070809"
FROZEN = """
import datetime as real
from hpcai500_tf.run import directory as run_directory
class Frozen:
    @staticmethod
    def now():
        return real.datetime(2024, 5, 6, 7, 8, 9)
run_directory.datetime = Frozen
"""


@pytest.fixture(autouse=True)
def _no_slurm(monkeypatch):
    for name in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", INHERITED_LOCK):
        monkeypatch.delenv(name, raising=False)


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _python(code: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code], env=_env(), text=True, stdout=subprocess.PIPE, **kwargs
    )


# ----------------------------------------------------------------------------- the lock


def test_a_second_writer_is_refused_naming_the_holder_until_it_lets_go(tmp_path):
    run = RunDirectory(tmp_path)
    holder = _python(
        "from hpcai500_tf.run import directory as r\n"
        f"held = r.hold(r.RunDirectory({str(tmp_path)!r}))\n"
        "print('locked', flush=True)\nimport sys\nsys.stdin.read()",
        stdin=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(UserError) as refused:
            run_directory.hold(run)
        message = str(refused.value)
        assert "\n" not in message
        assert message.startswith(
            f"{tmp_path}: in use by another run (pid {holder.pid} on {socket.gethostname()} since "
        )
        assert message.endswith(
            "); one run directory has one writer: wait for that run to end, or stop it first"
        )
    finally:
        holder.communicate("")  # it ends: the lock goes with it
    lock = run_directory.hold(run)
    assert run.lock.read_text().startswith(f"held by pid {os.getpid()} on ")
    lock.release()


def test_a_lock_file_that_is_a_link_is_refused_and_its_target_left(tmp_path):
    notes = tmp_path / "notes"
    notes.write_text("mine\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.lock").symlink_to(notes)
    with pytest.raises(UserError, match=r"run\.lock: is a symbolic link; a run directory lock"):
        run_directory.hold(RunDirectory(run_dir))
    assert notes.read_text() == "mine\n"
    with pytest.raises(UserError, match=r"run\.lock: is a symbolic link; refusing to write"):
        run_state.check_run_files(run_dir)


def test_a_worker_of_the_launcher_recognises_the_lock_it_inherited(tmp_path):
    run = RunDirectory(tmp_path)
    lock = run_directory.hold(run)
    try:
        assert run_directory.inherited(run, {INHERITED_LOCK: str(lock.fileno())})
        other = RunDirectory(tmp_path / "other")
        other.path.mkdir()
        run_directory.hold(other).release()
        assert not run_directory.inherited(other, {INHERITED_LOCK: str(lock.fileno())})
        for told in ("", "x", "99999", "²"):
            assert not run_directory.inherited(run, {INHERITED_LOCK: told})
    finally:
        lock.release()


# ----------------------------------------------------------------------------- new names


def test_ten_runs_started_in_the_same_second_get_ten_directories(tmp_path):
    go = tmp_path / "go"
    out = tmp_path / "runs"
    code = (
        FROZEN
        + "import os, sys, time\n"
        + f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.005)\n"
        + f"print(run_directory.RunDirectory.new({str(out)!r}, 'image_classification', 'tiny'))"
    )
    starters = [_python(code) for _ in range(10)]
    time.sleep(1.0)  # each is waiting for the go
    go.touch()
    made = [starter.communicate(timeout=60)[0].strip() for starter in starters]
    assert all(starter.returncode == 0 for starter in starters)
    names = sorted(Path(path).name for path in made)
    assert len(set(names)) == 10
    assert names == sorted([NAME] + [f"{NAME}-{n}" for n in range(2, 11)])
    assert sorted(p.name for p in out.iterdir()) == names


@pytest.mark.parametrize(
    ("slurm", "suffix"),
    [
        ({"SLURM_JOB_ID": "4321"}, "-4321"),
        ({"SLURM_JOB_ID": "4321", "SLURM_ARRAY_JOB_ID": "4300", "SLURM_ARRAY_TASK_ID": "7"},
         "-4300_7"),
        ({"SLURM_JOB_ID": "../x"}, ""),
        ({"SLURM_JOB_ID": "²"}, ""),
        ({"SLURM_JOB_ID": "9" * 5000}, ""),
        ({"SLURM_ARRAY_JOB_ID": "4300", "SLURM_ARRAY_TASK_ID": "a/b", "SLURM_JOB_ID": "1"}, "-1"),
    ],
)  # fmt: skip
def test_a_slurm_jobs_id_is_in_the_name_where_it_is_a_number(tmp_path, monkeypatch, slurm, suffix):
    monkeypatch.setattr(run_directory, "datetime", _Frozen)
    for name, value in slurm.items():
        monkeypatch.setenv(name, value)
    run = RunDirectory.new(tmp_path, "image_classification", "tiny")
    assert run.name == NAME + suffix and run.path.parent == tmp_path


def test_an_array_started_at_once_keeps_every_task_run(tmp_path, monkeypatch):
    monkeypatch.setattr(run_directory, "datetime", _Frozen)
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "4300")
    made = []
    for task in range(3):
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", str(task))
        made.append(RunDirectory.new(tmp_path, "image_classification", "tiny").name)
    assert made == [f"{NAME}-4300_{task}" for task in range(3)]


class _Frozen:
    @staticmethod
    def now():
        from datetime import datetime

        return datetime(2024, 5, 6, 7, 8, 9)


# ----------------------------------------------------------------------------- --workers


def _launch_args(tmp_path: Path, *extra: str):
    argv = ["train", "image_classification", "--preset", "tiny", "--set", "data.source=random"]
    args = build_parser().parse_args([*argv, *extra, "--workers", "2", "--out", str(tmp_path)])
    setup = config.prepare(
        args.benchmark, args.preset, [*args.set, "training.strategy=multi_worker"]
    )
    return args, setup


def test_workers_stopped_during_start_up_leave_no_directory_of_logs_alone(tmp_path):
    args, setup = _launch_args(tmp_path)
    started = []

    def ctrl_c(processes):
        started.extend(processes)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        launch.launch(setup, launch.worker_args(args), 2, args.out, None, ctrl_c)
    assert all(process.poll() is not None for process in started)
    assert list(tmp_path.iterdir()) == []


def test_a_resumed_runs_directory_is_never_removed_by_a_stop(tmp_path):
    args, setup = _launch_args(tmp_path)
    run_dir = tmp_path / "stopped-run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text("{}")

    def ctrl_c(processes):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        launch.launch(setup, launch.worker_args(args), 2, args.out, str(run_dir), ctrl_c)
    assert (run_dir / "config.json").read_text() == "{}" and (run_dir / "workers").is_dir()


def test_a_launch_into_a_run_directory_another_run_holds_is_refused(tmp_path):
    args, setup = _launch_args(tmp_path)
    run_dir = RunDirectory(tmp_path / "running")
    run_dir.path.mkdir()
    lock = run_directory.hold(run_dir)
    try:
        with pytest.raises(UserError, match=r"in use by another run \(pid \d+ on "):
            launch.launch(setup, launch.worker_args(args), 2, args.out, str(run_dir), None)
    finally:
        lock.release()
    assert sorted(p.name for p in run_dir.path.iterdir()) == ["run.lock"]  # no workers/ made


def test_ctrl_c_to_the_launcher_during_start_up_leaves_nothing(tmp_path):
    command = [
        sys.executable, "-m", "hpcai500_tf.cli", "train", "image_classification", "--preset",
        "tiny", "--set", "data.source=random", "--workers", "2", "--out", str(tmp_path / "runs"),
    ]  # fmt: skip
    launcher = subprocess.Popen(command, env=_env(), text=True, stdout=subprocess.PIPE)
    try:
        assert launcher.stdout.readline().startswith("launching 2 workers")
        launcher.send_signal(signal.SIGINT)  # as Ctrl-C, while the workers start
        launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert launcher.returncode == 130
    assert list((tmp_path / "runs").iterdir()) == []


# ----------------------------------------------------------------------------- end to end


def _hpcai500(*argv: str, **kwargs) -> subprocess.Popen:
    command = [sys.executable, "-m", "hpcai500_tf.cli", "train", *argv, "--power-hz", "0"]
    return subprocess.Popen(
        command, env=_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs
    )


def _stopped_run(out: Path) -> Path:
    """A tiny run of 200 epochs stopped by SIGTERM after its first checkpoint."""
    first = _hpcai500(
        "image_classification", "--preset", "tiny", "--set", "training.epochs=200",
        "--set", "data.source=random", "--out", str(out),
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not list(out.glob("*/state.json")) and time.monotonic() < deadline:
        assert first.poll() is None, first.communicate()
        time.sleep(0.2)
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=120)
    assert first.returncode == 143
    (run_dir,) = out.iterdir()
    return run_dir


@pytest.mark.slow
def test_two_resumes_at_once_one_trains_and_one_refuses(tmp_path):
    run_dir = _stopped_run(tmp_path / "runs")
    stopped_after = sum('"key": "epoch_stop"' in line for line in _log(run_dir))
    resumes = [_hpcai500("--resume", str(run_dir)) for _ in range(2)]
    deadline = time.monotonic() + 300
    while all(resume.poll() is None for resume in resumes) and time.monotonic() < deadline:
        time.sleep(0.2)
    (refused,) = [resume for resume in resumes if resume.poll() is not None]
    (trains,) = [resume for resume in resumes if resume is not refused]
    _, err = refused.communicate()
    assert refused.returncode == 2 and "Traceback" not in err, err[-2000:]
    # the holder named as it wrote itself, or, refused between its lock and that write (a
    # loaded machine), as one that has not said who it is yet
    holder = (
        f"pid {trains.pid} on {socket.gethostname()} since {err.split(' since ')[1].split(')')[0]}"
        if " since " in err
        else "a process that has not said who it is yet"
    )
    assert err.splitlines() == [
        f"hpcai500-tf: error: {run_dir}: in use by another run ({holder}); one run "
        "directory has one writer: wait for that run to end, or stop it first"
    ]
    # an epoch of the resume's own (the tiny run may have logged 3 or more before its stop:
    # a stop sent before the resume's segment began leaves no run_stop of its own)
    while trains.poll() is None and not _epochs_logged(run_dir, stopped_after + 1):
        time.sleep(0.2)
    trains.send_signal(signal.SIGTERM)
    trains.communicate(timeout=120)
    assert trains.returncode == 143
    events = [json.loads(line.removeprefix(":::MLLOG ")) for line in _log(run_dir)]
    ends = [e["metadata"]["epoch_num"] for e in events if e["key"] == "epoch_stop"]
    assert ends == list(range(1, len(ends) + 1))  # no epoch trained twice into one log
    assert [e["key"] for e in events].count("run_stop") == 2  # the first stop's and this one's
    state = json.loads((run_dir / "state.json").read_text())
    assert json.loads((run_dir / "record.json").read_text())["status"] == "stopped"
    assert state["epochs_done"] >= 2


def _log(run_dir: Path) -> list[str]:
    return (run_dir / "mlperf.log").read_text().splitlines()


def _epochs_logged(run_dir: Path, count: int) -> bool:
    return sum('"key": "epoch_stop"' in line for line in _log(run_dir)) >= count


@pytest.mark.slow
def test_three_trains_started_at_once_into_one_out_keep_three_runs(tmp_path):
    out = tmp_path / "runs"
    trains = [
        _hpcai500("image_classification", "--preset", "tiny", "--set", "data.source=random",
                  "--set", "training.epochs=1", "--out", str(out))
        for _ in range(3)
    ]  # fmt: skip
    for train in trains:
        _, err = train.communicate(timeout=600)
        assert train.returncode == 0, err[-2000:]
    records = sorted(out.glob("*/record.json"))
    assert len(records) == 3
    assert all(json.loads(r.read_text())["status"] == "completed" for r in records)
