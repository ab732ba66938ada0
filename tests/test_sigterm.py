"""SIGTERM (scancel, a Slurm time limit, preemption) ends a run as Ctrl-C does: a `stopped`
record that `train --resume` continues, the MLPerf log closed with run_stop (aborted), and the
process exits 143 (128 + SIGTERM)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcai500_tf import record
from hpcai500_tf.cluster import local_workers
from hpcai500_tf.run import status as run

EPOCHS = ["--set", "training.epochs=6"]


def _state(out: Path) -> dict | None:
    """The run's last checkpoint's state (state.json is replaced atomically), if any yet."""
    states = list(out.glob("*/state.json"))
    return json.loads(states[0].read_text()) if states else None


def _last_event(log: Path) -> dict:
    line = log.read_text().strip().splitlines()[-1]
    return json.loads(line.split(":::MLLOG", 1)[1])


def test_sigterm_mid_run_leaves_a_stopped_record_that_resume_completes(tmp_path):
    out = tmp_path / "runs"
    command = [sys.executable, "-m", "hpcai500_tf.cli", "train", "image_classification",
               "--preset", "tiny", *EPOCHS, "--out", str(out)]  # fmt: skip
    with (tmp_path / "stdout").open("w") as stdout, (tmp_path / "stderr").open("w") as stderr:
        child = subprocess.Popen(command, stdout=stdout, stderr=stderr)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and child.poll() is None and _state(out) is None:
            time.sleep(0.02)  # until the first epoch's checkpoint
        state = _state(out)
        assert child.poll() is None and state is not None, (
            f"before the SIGTERM: exit status {child.poll()} (None: still running), "
            f"checkpoint state {state} after {time.time() - deadline + 240:.0f} s; stderr: "
            + (tmp_path / "stderr").read_text()[-2000:]
        )
        assert state["epochs_done"] < 6, state
        child.send_signal(signal.SIGTERM)
        code = child.wait(60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
    err = (tmp_path / "stderr").read_text()
    assert code == 143, f"exit status {code}; stderr: {err[-2000:]}"
    assert "Traceback" not in err, err[-2000:]
    (run_dir,) = out.glob("*")
    stopped = record.load(run_dir / "record.json")
    assert stopped["status"] == "stopped", stopped["warnings"]
    (warning,) = [w for w in stopped["warnings"] if w.startswith(run.SIGTERM_STOPPED)]
    assert f"resume with --resume {run_dir}" in warning, warning
    assert len(stopped["timeline"]["epochs"]) < 6
    last = _last_event(run_dir / "mlperf.log")
    assert last["key"] == "run_stop" and last["metadata"]["status"] == "aborted", last

    from hpcai500_tf.cli import main

    # The resume in this process (TensorFlow is loaded here already): the signal was the child's.
    assert main(["train", "--resume", str(run_dir)]) == 0
    done = record.load(run_dir / "record.json")
    assert done["status"] == "completed", done["warnings"]
    assert [e["epoch"] for e in done["timeline"]["epochs"]] == [1, 2, 3, 4, 5, 6]
    last = _last_event(run_dir / "mlperf.log")
    assert last["key"] == "run_stop" and last["metadata"]["status"] == "success", last


def test_sigterm_to_every_worker_stops_a_multi_worker_run(tmp_path):
    """As Slurm ends a job step (no launcher): every worker gets SIGTERM; the chief writes the
    `stopped` record, the other worker exits non-zero with one line, both 143."""
    out = tmp_path / "runs"
    # 16 steps an epoch of 2 x 32: the SIGTERM comes early in epoch 2, 48 epochs before the end.
    sets = ["data.source=random", "data.train_examples=1024", "training.epochs=50",
            "training.strategy=multi_worker", "communication.timeout_s=5"]  # fmt: skip
    command = [sys.executable, "-m", "hpcai500_tf.cli", "train", "image_classification",
               "--preset", "tiny", "--out", str(out)]  # fmt: skip
    command += [arg for value in sets for arg in ("--set", value)]
    workers = []
    try:
        for index, tf_config in enumerate(local_workers.tf_configs(local_workers.free_ports(2))):
            with (tmp_path / f"worker-{index}.log").open("w") as log:
                environment = {**os.environ, "TF_CONFIG": tf_config}
                workers.append(
                    subprocess.Popen(command, env=environment, stdout=log, stderr=subprocess.STDOUT)
                )
        deadline = time.time() + 240
        while time.time() < deadline and all(w.poll() is None for w in workers) and not _state(out):
            time.sleep(0.02)  # until the first epoch's checkpoint
        assert all(w.poll() is None for w in workers) and _state(out), (
            [w.poll() for w in workers],
            (tmp_path / "worker-0.log").read_text()[-2000:],
        )
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        codes = [worker.wait(60) for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait(30)
    logs = [(tmp_path / f"worker-{i}.log").read_text() for i in range(2)]
    assert codes == [143, 143], (codes, logs[0][-2000:], logs[1][-2000:])
    assert not any("Traceback" in log for log in logs), logs
    (line,) = [x for x in logs[1].splitlines() if x.startswith("hpcai500-tf:")]
    assert line.startswith(f"hpcai500-tf: worker 1: run stopped: {run.SIGTERM_STOPPED}"), line
    (run_dir,) = out.glob("*")
    stopped = record.load(run_dir / "record.json")
    assert stopped["status"] == "stopped", stopped["warnings"]
    assert any(w.startswith(run.SIGTERM_STOPPED) for w in stopped["warnings"])
    last = _last_event(run_dir / "mlperf.log")
    assert last["key"] == "run_stop" and last["metadata"]["status"] == "aborted", last


def test_the_sigterm_handler_is_restored_and_a_users_own_is_kept():
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    with run.stop_on_sigterm():
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

    def own(signum, frame):
        pass

    signal.signal(signal.SIGTERM, own)
    try:
        with run.stop_on_sigterm():
            assert signal.getsignal(signal.SIGTERM) is own
        assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.mark.parametrize(
    ("stop", "code", "line"),
    [(run.Terminated(), 143, "hpcai500-tf: terminated by SIGTERM"),
     (KeyboardInterrupt(), 130, "hpcai500-tf: interrupted")],
)  # fmt: skip
def test_a_stop_before_the_record_exits_with_the_signals_code(
    tmp_path, monkeypatch, capsys, stop, code, line
):
    from hpcai500_tf.cli import main
    from hpcai500_tf.engine import run as tensorflow_backend

    def stopped(*args, **kwargs):
        raise stop

    monkeypatch.setattr(tensorflow_backend, "run", stopped)
    argv = ["train", "image_classification", "--preset", "tiny", "--out", str(tmp_path)]
    assert main(argv) == code
    assert capsys.readouterr().err.strip() == line


def test_exit_codes_of_records():
    warning = f"{run.SIGTERM_STOPPED} after 2 epoch(s); resume with --resume x"
    assert run.exit_code({"status": "stopped", "warnings": [warning]}) == 143
    assert run.exit_code({"status": "stopped", "warnings": ["interrupted by the user"]}) == 1
    assert run.exit_code({"status": "completed", "warnings": []}) == 0
