"""tools/slurm_train.sbatch requeues a job its time-limit warning (SIGUSR1) stopped, and only
that: never a run that ended, never past MAX_SEGMENTS, never one scancel stopped. The
decision is the script's own shell function, run here without Slurm."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcai500_tf import record
from hpcai500_tf.errors import UserError
from hpcai500_tf.run import segments

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "slurm_train.sbatch"


def _shell(command: str) -> str:
    """`command` run after the script's functions are defined (HPCAI500_SBATCH_FUNCTIONS_ONLY)."""
    script = f'HPCAI500_SBATCH_FUNCTIONS_ONLY=1 source "{SCRIPT}" /data; {command}'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("warned", "status", "segment", "cap", "decision"),
    [
        (1, "stopped", 1, 20, "requeue"),
        (1, "stopped", 19, 20, "requeue"),
        (1, "stopped", 20, 20, "this was segment 20 of MAX_SEGMENTS=20"),
        (1, "completed", 3, 20, "the run completed: nothing to resume"),
        (1, "failed", 3, 20, "the run failed: nothing to resume"),
        (1, "diverged", 3, 20, "the run diverged: nothing to resume"),
        (1, "", 1, 20, "the run left no record: nothing to resume"),
        (0, "stopped", 1, 20, "no SIGUSR1 came: the step ended on its own or was cancelled"),
    ],
)
def test_the_requeue_decision(warned, status, segment, cap, decision):
    assert _shell(f'requeue_decision {warned} "{status}" {segment} {cap}') == decision
    assert _shell(f'requeue_decision {warned} "{status}" {segment} {cap} 0') == decision


@pytest.mark.parametrize(
    ("warned", "status", "decision"),
    [
        (1, "", "requeue"),  # task 0 ended by --kill-on-bad-exit as it wrote the record
        (1, "failed", "the run failed: nothing to resume"),
        (0, "", "no SIGUSR1 came: the step ended on its own or was cancelled"),
    ],
)
def test_a_warned_stop_whose_record_was_lost_but_state_saved_is_requeued(warned, status, decision):
    assert _shell(f'requeue_decision {warned} "{status}" 1 20 1') == decision


@pytest.mark.parametrize("warned", [0, 1])
@pytest.mark.parametrize("status", ["stopped", ""])
def test_a_job_sigterm_reached_is_never_requeued(warned, status):
    """scancel's SIGTERM, also in the minutes after the time limit's warning, when the run
    stops at its checkpoint as for the warning (tests/test_real_slurm.py runs it on Slurm)."""
    decision = _shell(f'requeue_decision {warned} "{status}" 1 20 1 1')
    assert decision.startswith("cancelled: SIGTERM came"), decision
    assert "submit again with RUN_DIR set to this run's directory" in decision, decision
    assert decision.endswith("Slurm starts this job again itself and that start resumes it)")
    ended = _shell(f'requeue_decision {warned} "completed" 1 20 1 1')
    assert ended.endswith("the run completed"), ended
    assert _shell(f'requeue_decision {warned} "{status}" 1 20 1 0') == (
        "requeue" if warned else "no SIGUSR1 came: the step ended on its own or was cancelled"
    )


def test_the_record_status_is_read_from_the_record(tmp_path):
    path = tmp_path / "record.json"
    path.write_text('{"status": "stopped", "layers": {"status": "x"}}')
    assert _shell(f'record_status "{path}"') == "stopped"
    assert _shell(f'record_status "{tmp_path / "none.json"}"') == ""


def test_the_script_asks_slurm_for_the_warning_and_the_requeue():
    text = SCRIPT.read_text()
    assert "#SBATCH --signal=B:USR1@300" in text and "#SBATCH --requeue" in text
    assert '--resume-or-start "$RUN_DIR"' in text and 'scontrol requeue "$SLURM_JOB_ID"' in text


def test_resume_or_start_starts_in_a_new_directory_then_resumes_it(tmp_path):
    run_dir = tmp_path / "runs" / "slurm-7"
    assert segments.resume_or_start(run_dir) == (None, str(run_dir)) and run_dir.is_dir()
    (run_dir / "state.json").write_text("{}")
    assert segments.resume_or_start(run_dir) == (str(run_dir), None)


def test_resume_or_start_never_starts_a_run_that_ended_again(tmp_path):
    record.write_atomic(tmp_path / "record.json", {"status": "completed"})
    with pytest.raises(UserError, match=r"its run ended \(completed, .*record.json\)"):
        segments.resume_or_start(tmp_path)


def test_a_start_that_saved_nothing_is_set_aside_and_started_anew(tmp_path):
    # A first start killed before its first checkpoint left its config, an MLPerf log and a
    # lock: the next --resume-or-start must start (it cannot resume), keeping those files.
    from hpcai500_tf import config
    from hpcai500_tf.engine import run
    from hpcai500_tf.run import lifecycle
    from hpcai500_tf.run.options import RunOptions

    run_dir = tmp_path / "slurm-7"
    assert segments.resume_or_start(run_dir) == (None, str(run_dir))
    (run_dir / "config.json").write_text('{"preset": "tiny"}')
    (run_dir / "mlperf.log").write_text(':::MLLOG {"key": "init_start"}\n')
    (run_dir / "tensorboard").mkdir()
    assert segments.resume_or_start(run_dir) == (None, str(run_dir))
    setup = config.prepare("image_classification", "tiny", ["training.epochs=1"])
    options = RunOptions(run_dir=run_dir, start_over_unsaved=True, power_hz=0)
    done, path = lifecycle.run(setup, options, run.build_trainer)
    assert done["status"] == "completed" and path == run_dir / "record.json"
    aside = run_dir / "unsaved-start-1"
    assert (aside / "config.json").read_text() == '{"preset": "tiny"}'
    assert (aside / "mlperf.log").read_text().count("init_start") == 1
    assert (aside / "tensorboard").is_dir() and not (aside / "run.lock").exists()
    assert f"its files kept in {aside}" in " ".join(done["warnings"])
    assert (run_dir / "mlperf.log").read_text().count('"init_start"') == 1
    # Without --resume-or-start's leave, a directory holding a run is still refused.
    plain = RunOptions(run_dir=run_dir, power_hz=0)
    with pytest.raises(UserError, match="config.json: already exists"):
        lifecycle.run(setup, plain, run.build_trainer)


def test_a_sigterm_to_the_whole_batch_step_as_the_script_decides_is_still_said(tmp_path):
    """scancel's SIGTERM reaches every process of the batch step, the subshell reading the
    record too: the script must still say why it did not requeue, naming RUN_DIR (under
    `set -e` the killed subshell ended it silently, now and then on the real Slurm test). The
    step here ended at once (exit 138); the record is read by a python3 that waits to be
    signalled."""
    bin_dir, run_dir = tmp_path / "bin", tmp_path / "run"
    bin_dir.mkdir()
    run_dir.mkdir()
    (run_dir / "record.json").write_text('{"status": "stopped"}')
    (run_dir / "state.json").write_text("{}")
    reading = tmp_path / "reading"
    fakes = {
        "srun": "#!/bin/sh\nexit 138\n",
        "python3": f'#!/bin/sh\ntouch "{reading}"\nsleep 5\nexec "{sys.executable}" "$@"\n',
    }
    for name, text in fakes.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}", "HPCAI500_ALLOW_CPU": "1",
        "SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1", "SLURM_CPUS_ON_NODE": "2",
        "RUN_DIR": str(run_dir),
    }  # fmt: skip
    script = subprocess.Popen(
        ["bash", str(SCRIPT), "/data", str(tmp_path / "out")], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, process_group=0,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while not reading.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reading.exists(), "the script never read the record"
    os.killpg(script.pid, signal.SIGTERM)  # as slurmstepd signals the batch step
    output, _ = script.communicate(timeout=30)
    assert script.returncode == 138, output
    assert output.splitlines()[-1].startswith(
        "slurm_train.sbatch: not requeued: cancelled: SIGTERM came"
    ), output
    assert output.rstrip().endswith(f"(RUN_DIR={run_dir})"), output
