"""A stop keeps its work (#38): a signal mid-epoch stops the run after the step it came in,
the run checkpoints there, and --resume trains exactly the steps left, on the data an
uninterrupted run trains on, to the same weights."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hpcai500_tf import config, record
from hpcai500_tf.errors import UserError
from hpcai500_tf.run import data_position, lifecycle, stop
from hpcai500_tf.run import state as run_state
from hpcai500_tf.run.directory import checkpoint_name
from hpcai500_tf.run.options import RunOptions
from hpcai500_tf.run.status import exit_code

# One epoch-end checkpoint (the last): the stop's is the only one before it.
TINY = ["training.epochs=2", "training.checkpoint_every=0", "training.deterministic=true"]
STEPS = 8  # the tiny preset's steps per epoch (256 examples, batches of 32)


class Stopping:
    """A trainer `build` whose trainer sends this process `signum` during timed step
    `at_step` (counted from 1, warm-up steps not counted); `built` holds the trainer."""

    def __init__(self, build, at_step=None, signum=signal.SIGINT):
        self.build, self.at_step, self.signum, self.built = build, at_step, signum, None

    def __call__(self, setup, options, view=None):
        trainer = self.built = self.build(setup, options, view)
        steps, armed = [0], [False]
        warm_up, train_step = trainer.warm_up, trainer.train_step

        def warm(checkpoints):
            warm_up(checkpoints)
            armed[0] = True

        def step(batch, vote=None):
            loss = train_step(batch, vote)
            if armed[0]:
                steps[0] += 1
                if steps[0] == self.at_step:
                    os.kill(os.getpid(), self.signum)
            return loss

        trainer.warm_up, trainer.train_step = warm, step
        trainer.timed_steps = steps
        return trainer


def _tensorflow_build():
    from hpcai500_tf.engine import run

    return run.build_trainer


def _pytorch_build():
    from hpcai500_tf.pytorch.train import TorchTrainer

    return TorchTrainer


def _weights(trainer) -> list[np.ndarray]:
    if trainer.framework == "pytorch":
        return [v.detach().cpu().numpy() for v in trainer.module.state_dict().values()]
    return [v.numpy() for v in trainer.model.weights]


def _run(setup, build, **options):
    options = {"power_hz": 0, **options}
    return lifecycle.run(setup, RunOptions(**options), build)


def _stopped_then_resumed(tmp_path, framework, at_step, signum=signal.SIGINT):
    build = _tensorflow_build() if framework == "tensorflow" else _pytorch_build()
    setup = config.prepare("image_classification", "tiny", TINY)
    stopping = Stopping(build, at_step, signum)
    stopped, path = _run(setup, stopping, out_dir=tmp_path / "stopped")
    stopped["state"] = run_state.read_state(path.parent)  # as the stop left it
    resuming = Stopping(build)
    resumed, _ = _run(setup, resuming, resume=str(path.parent))
    whole = Stopping(build)
    plain, _ = _run(setup, whole, out_dir=tmp_path / "whole")
    return stopped, path.parent, resumed, resuming, plain, whole


@pytest.mark.slow  # three tiny runs: 1-2 minutes each framework on 2 busy cores
@pytest.mark.parametrize("framework", ["tensorflow", "pytorch"])
def test_a_sigint_mid_epoch_checkpoints_there_and_resume_ends_as_an_uninterrupted_run(
    tmp_path, framework, request
):
    if framework == "pytorch":
        request.getfixturevalue("torch_installed")
    stopped, run_dir, resumed, resuming, plain, whole = _stopped_then_resumed(
        tmp_path, framework, at_step=3
    )
    # Stopped after the step the signal came in: 3 batches of epoch 1, kept in a checkpoint.
    assert stopped["status"] == "stopped", stopped["warnings"]
    (warning,) = [w for w in stopped["warnings"] if w.startswith(stop.WHY[signal.SIGINT])]
    assert "after 0 epoch(s) and 3 batch(es) of the next" in warning, warning
    assert f"ckpt-0-b3 was written at the stop: resume with --resume {run_dir}" in warning
    state = run_state.read_state(run_dir)  # (the stopped state was replaced by the resume)
    assert state["epochs_done"] == 2 and state["batches_done"] == 0
    # The resumed segment trained exactly the steps left: 2 x 8 in all, none twice.
    assert resuming.built.timed_steps[0] == 2 * STEPS - 3
    assert resumed["status"] == "completed", resumed["warnings"]
    assert len(resumed["timeline"]["segments"]) == 2
    epochs = resumed["timeline"]["epochs"]
    assert [e["examples"] for e in epochs] == [256, 512]
    # Epoch 1's training seconds are both segments': the 3 steps before the stop as well.
    before_stop = stopped["state"]["epoch_seconds_done"]
    assert 0 < before_stop < epochs[0]["seconds"]
    assert epochs == [
        {**e, **{k: epochs[i][k] for k in ("elapsed_s", "seconds", "loss")}}
        for i, e in enumerate(plain["timeline"]["epochs"])
    ]
    # The same data and schedule as the run never stopped: the same loss and weights.
    assert epochs[-1]["loss"] == pytest.approx(plain["timeline"]["epochs"][-1]["loss"], rel=1e-5)
    for got, want in zip(_weights(resuming.built), _weights(whole.built), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_the_stop_checkpoint_is_named_by_its_position_and_the_state_agrees(tmp_path, monkeypatch):
    from hpcai500_tf.engine import run

    save_checkpoint = lifecycle.save_checkpoint

    def signalled_while_saving(trainer, run_dir, progress):
        # The scheduler's SIGTERM again, and a Ctrl-C, while the stop's checkpoint is written:
        # neither may abort it (the run is already writing what it keeps).
        for signum in (signal.SIGTERM, signal.SIGINT):
            os.kill(os.getpid(), signum)
        _wait_for_handlers(seconds=0.5)
        save_checkpoint(trainer, run_dir, progress)

    monkeypatch.setattr(lifecycle, "save_checkpoint", signalled_while_saving)
    setup = config.prepare("image_classification", "tiny", TINY)
    stopping = Stopping(run.build_trainer, at_step=STEPS + 2, signum=signal.SIGTERM)
    stopped, path = _run(setup, stopping, out_dir=tmp_path)
    assert stopped["status"] == "stopped" and exit_code(stopped) == 143
    assert any("ckpt-1-b2 was written at the stop" in w for w in stopped["warnings"])
    state = json.loads((path.parent / "state.json").read_text())
    assert (state["epochs_done"], state["batches_done"]) == (1, 2)
    assert state["examples"] == (STEPS + 2) * 32
    # the 2 steps' training seconds, for the resumed epoch's end (its throughput)
    assert (
        0
        < state["epoch_seconds_done"]
        < stopped["timeline"]["segments"][-1]["stop"]
        - (stopped["timeline"]["segments"][0]["start"])
    )
    assert state["checkpoint"].endswith("ckpt-1-b2")
    assert [p.name for p in (path.parent / "checkpoints").iterdir() if "index" in p.name] == [
        "ckpt-1-b2.index"
    ]
    # Steps a mid-epoch resume would not train again cannot be profiled in it.
    with pytest.raises(UserError, match=rf"outside the steps this run trains \({STEPS + 3}-"):
        _run(
            setup, run.build_trainer, resume=str(path.parent), profile_steps=(STEPS + 1, STEPS + 2)
        )
    # A state moved to another position than its checkpoint's is refused, in one line.
    state["batches_done"] = 3
    (path.parent / "state.json").write_text(json.dumps(state))
    with pytest.raises(UserError, match="says 3 batches of epoch 2 were done, but the checkpoint"):
        run_state.check_resumable(path.parent, 2)


def test_a_stop_at_an_epoch_boundary_resumes_with_one_epoch_start_per_epoch(tmp_path):
    from hpcai500_tf.engine import run

    setup = config.prepare("image_classification", "tiny", TINY)
    # The signal in epoch 1's last step: the stop comes before epoch 2's first.
    stopping = Stopping(run.build_trainer, at_step=STEPS, signum=signal.SIGUSR1)
    stopped, path = _run(setup, stopping, out_dir=tmp_path)
    assert stopped["status"] == "stopped" and "ckpt-1 was written at the stop" in " ".join(
        stopped["warnings"]
    )
    resumed, _ = _run(setup, Stopping(run.build_trainer), resume=str(path.parent))
    assert resumed["status"] == "completed", resumed["warnings"]
    events = [
        json.loads(line.removeprefix(":::MLLOG "))
        for line in (path.parent / "mlperf.log").read_text().splitlines()
    ]
    starts = [e["metadata"]["epoch_num"] for e in events if e["key"] == "epoch_start"]
    assert starts == [1, 2]
    assert [e["metadata"]["first_epoch_num"] for e in events if e["key"] == "block_start"] == [1, 2]


def _wait_for_handlers(until=lambda: False, seconds: float = 10.0) -> None:
    """Let Python run pending signal handlers (in the main thread, between bytecodes; another
    thread may take the signal first on a loaded machine) until `until()` or `seconds`."""
    deadline = time.monotonic() + seconds
    while not until() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_second_ctrl_c_stops_at_once_but_a_repeated_scheduler_signal_does_not(monkeypatch):
    # Whatever an earlier test in this process left (a blocked signal, a handler of its own),
    # the signals start as a fresh process has them.
    signals = {signal.SIGINT, signal.SIGUSR1, signal.SIGTERM}
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, signals) & signals
    monkeypatch.setattr(stop, "_noted", stop.StopRequest())
    previous = {
        signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
        signal.SIGUSR1: signal.signal(signal.SIGUSR1, signal.SIG_DFL),
        signal.SIGTERM: signal.signal(signal.SIGTERM, signal.SIG_DFL),
    }
    try:
        _second_signal_stops_at_once()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if blocked:
            signal.pthread_sigmask(signal.SIG_BLOCK, blocked)


def _second_signal_stops_at_once():
    with stop.listening() as request:
        os.kill(os.getpid(), signal.SIGUSR1)
        _wait_for_handlers(lambda: request.signum)
        assert request.signum == signal.SIGUSR1
        # Slurm's time limit: SIGTERM after the SIGUSR1 warning, and again to every process
        # of the step. The stop asked for still waits for its step boundary (and checkpoint).
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGUSR1)
        _wait_for_handlers(seconds=0.5)
        assert request.signum == signal.SIGUSR1
        with pytest.raises(stop.ForcedStop) as forced:
            os.kill(os.getpid(), signal.SIGINT)
            _wait_for_handlers()
        assert forced.value.exit_code == 130
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_votes_name_the_strongest_signal_any_worker_got():
    summed = [
        a + b for a, b in zip(stop.vote(signal.SIGINT), stop.vote(signal.SIGTERM), strict=True)
    ]
    assert stop.agreed(summed) == signal.SIGTERM
    assert stop.agreed(stop.vote(0)) == 0
    assert stop.agreed(stop.vote(signal.SIGUSR1)) == signal.SIGUSR1
    assert stop.exit_code_of([stop.WHY[signal.SIGUSR1] + " after ..."]) == 138


def test_epoch_batches_resume_at_the_next_batch_of_the_epoch():
    def open_epoch(epoch, skip):
        return iter([(epoch, b) for b in range(skip, 100)])

    whole = list(data_position.epoch_batches(open_epoch, 0, 0, 3, 4))
    assert whole[:5] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)] and len(whole) == 12
    assert list(data_position.epoch_batches(open_epoch, 1, 3, 3, 4)) == whole[7:]
    assert checkpoint_name(2, 0) == "ckpt-2"
    assert checkpoint_name(2, 5) == "ckpt-2-b5"


def test_the_stop_modules_import_no_framework():
    import subprocess
    import sys

    code = (
        "import sys; import hpcai500_tf.run.stop, hpcai500_tf.run.data_position; "
        "assert not {'tensorflow', 'torch', 'keras'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_saved_record_still_names_a_stop_by_sigterm():
    warnings = [stop.WHY[signal.SIGTERM] + " after 1 epoch(s) and 2 batch(es) of the next; ..."]
    assert exit_code({"status": "stopped", "warnings": warnings}) == 143


def _worker_pids(launcher: int) -> dict[int, int]:
    """The launcher's workers, by rank (TF_CONFIG's task index, or RANK)."""
    children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    ranks = {}
    for pid in map(int, children):
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        env = dict(item.decode().split("=", 1) for item in environ if b"=" in item)
        if "TF_CONFIG" in env:
            ranks[json.loads(env["TF_CONFIG"])["task"]["index"]] = pid
        elif "RANK" in env:
            ranks[int(env["RANK"])] = pid
    return ranks


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["tensorflow", "pytorch"])
def test_sigterm_to_one_of_two_workers_stops_both_after_the_same_step(tmp_path, framework, request):
    """SIGTERM to worker 1 alone, mid-run: both workers stop after the same step, the chief
    writes one stopped record (energy gathered: no worker was left in a collective) and its
    checkpoint, both exit within the bound, and the run resumes to completion, with the
    examples and final loss of the same run never stopped."""
    if framework == "pytorch":
        request.getfixturevalue("torch_installed")
    out = tmp_path / "runs"
    command = [sys.executable, "-m", "hpcai500_tf.cli", "train", "image_classification",
               "--preset", "tiny", "--set", "training.epochs=20", "--set",
               "training.checkpoint_every=0", "--set", "training.deterministic=true",
               "--workers", "2", "--power-hz", "0", "--framework", framework]  # fmt: skip
    whole = subprocess.run([*command, "--out", str(tmp_path / "whole")], capture_output=True,
                           text=True, timeout=600)  # fmt: skip
    assert whole.returncode == 0, whole.stderr[-2000:]
    command += ["--out", str(out)]
    with (tmp_path / "stderr").open("w") as stderr:
        launcher = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and launcher.poll() is None:
            logs = list(out.glob("*/mlperf.log"))
            if logs and logs[0].read_text().count('"epoch_start"') >= 2:
                break
            time.sleep(0.05)
        assert launcher.poll() is None, (tmp_path / "stderr").read_text()[-2000:]
        workers = _worker_pids(launcher.pid)
        sent = time.monotonic()
        os.kill(workers[1], signal.SIGTERM)
        code = launcher.wait(120)
        seconds = time.monotonic() - sent
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(30)
    print(f"{framework}: SIGTERM to worker 1 -> every worker exited in {seconds:.1f} s")
    err = (tmp_path / "stderr").read_text()
    assert code == 143, f"exit status {code}; stderr: {err[-2000:]}"
    assert seconds < 30, f"{seconds:.1f} s from the signal to the last exit"
    (run_dir,) = out.glob("*")
    stopped = record.load(run_dir / "record.json")
    assert stopped["status"] == "stopped", stopped["warnings"]
    (warning,) = [w for w in stopped["warnings"] if w.startswith(stop.WHY[signal.SIGTERM])]
    assert "(sent to another worker)" in warning and "was written at the stop" in warning
    state = run_state.check_resumable(run_dir, 20)
    assert state["checkpoint"].endswith(
        checkpoint_name(state["epochs_done"], state["batches_done"])
    )
    resumed = subprocess.run(
        [sys.executable, "-m", "hpcai500_tf.cli", "train", "--resume", str(run_dir),
         "--workers", "2", "--power-hz", "0"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    done = record.load(run_dir / "record.json")
    assert done["status"] == "completed" and done["timeline"]["epochs"][-1]["examples"] == 20 * 256
    # The same data and schedule as the run never stopped: the same examples and loss.
    (uninterrupted,) = (record.load(p) for p in (tmp_path / "whole").glob("*/record.json"))
    got, want = done["timeline"]["epochs"], uninterrupted["timeline"]["epochs"]
    assert [e["examples"] for e in got] == [e["examples"] for e in want]
    assert got[-1]["loss"] == pytest.approx(want[-1]["loss"], rel=1e-5)


def test_the_timed_run_ends_at_the_last_evaluation_not_after_the_last_checkpoint(
    tmp_path, monkeypatch
):
    """The last epoch's checkpoint is written after its evaluation, which time-to-quality
    ends at: the run's segment (and the energy integrated over it) used to end after the
    write, a second later here."""
    from hpcai500_tf.engine import run

    save_checkpoint = lifecycle.save_checkpoint

    def slow(trainer, run_dir, progress):
        save_checkpoint(trainer, run_dir, progress)
        time.sleep(1.0)

    monkeypatch.setattr(lifecycle, "save_checkpoint", slow)
    setup = config.prepare("image_classification", "tiny", TINY)
    record, _ = _run(setup, run.build_trainer, out_dir=tmp_path)
    timeline, quality = record["timeline"], record["quality"]
    timed = timeline["run_stop"] - timeline["run_start"]
    assert record["status"] == "completed"
    assert quality["curve"][-1]["elapsed_s"] <= timed < quality["curve"][-1]["elapsed_s"] + 0.5
