import copy
import json
import shutil
import signal
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "published_2020" / "2_google.json"


@pytest.fixture
def published_record() -> dict:
    """The Google TPU v3 entry of the 2020 ranking: a valid, rankable IC record."""
    return copy.deepcopy(json.loads(EXAMPLE.read_text()))


def set_result(record: dict, *, seconds: float, quality: float) -> dict:
    """Change a record's time-to-quality and quality, keeping it consistent."""
    record["quality"].update(
        achieved=quality,
        final=quality,
        time_to_quality_s=seconds,
        reached_target=quality >= record["quality"]["target"],
    )
    record["quality"]["curve"][-1].update(elapsed_s=seconds, value=quality)
    record["timeline"]["run_stop"] = seconds
    record["timeline"]["segments"] = [{"start": 0.0, "stop": seconds}]
    return record


@pytest.fixture(scope="session")
def tf_tiny(tmp_path_factory):
    """A finished TensorFlow run of the tiny image-classification preset: (path, record)."""
    from hpcai500_tf import record
    from hpcai500_tf.cli import main

    out = tmp_path_factory.mktemp("tf")
    assert main(["train", "image_classification", "--preset", "tiny", "--out", str(out)]) == 0
    (path,) = out.glob("*/record.json")
    return path, record.load(path)


@pytest.fixture(scope="session")
def tf_stopped(tmp_path_factory) -> Path:
    """A TensorFlow run of the tiny preset set to 3 epochs, stopped as epoch 3 began (as
    Ctrl-C would), a checkpoint after each of its 2: its run directory. A test that changes
    it (a resume) takes a copy: `copy_run(tf_stopped, tmp_path)`."""
    from hpcai500_tf import config
    from hpcai500_tf.engine import run

    from .test_train import StopBeforeEpoch

    setup = config.prepare("image_classification", "tiny", ["training.epochs=3"])
    out = tmp_path_factory.mktemp("stopped")
    stopped, path = run.run_benchmark(setup, None, out, view=[StopBeforeEpoch(3)])
    assert stopped["status"] == "stopped" and len(stopped["timeline"]["epochs"]) == 2
    return path.parent


def copy_run(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of a run directory under tmp_path, by the same name."""
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy, symlinks=True)
    return copy


@pytest.fixture
def float32_policy():
    """Keras models built in float32 whatever an earlier test (a training run sets Keras's
    global policy) left, in any order; a test that wants bfloat16 asks for it by dtype."""
    import keras

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    yield
    keras.mixed_precision.set_global_policy(previous)


@pytest.fixture
def torch_installed():
    """PyTorch, or a skip; CI sets HPCAI500_REQUIRE_TORCH=1 so that a missing torch fails."""
    import os

    if os.environ.get("HPCAI500_REQUIRE_TORCH") == "1":
        import torch  # noqa: F401  (an ImportError fails the test)
    else:
        pytest.importorskip("torch", reason="PyTorch is optional: pip install -e '.[torch]'")


_SIGNALS = sorted(set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP})


def _signal_state() -> tuple[dict, set]:
    """Python's handler of every signal and the signals this thread blocks."""
    return {s: signal.getsignal(s) for s in _SIGNALS}, signal.pthread_sigmask(signal.SIG_BLOCK, [])


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:  # a real-time signal past SIGRTMIN
        return f"signal {signum}"


@pytest.fixture(autouse=True)
def signal_state_is_kept():
    """Every test leaves the signal handlers and the blocked signals as it found them: one
    that changed them (a stop signal blocked, as an srun task's `run_instance` leaves them, or
    a handler of its own) would change what a later test's signal does, and only in the full
    suite. Its teardown puts them back (later tests start as they would alone) and fails,
    naming the signals."""
    handlers, blocked = _signal_state()
    yield
    now_handlers, now_blocked = _signal_state()
    changed = [s for s in _SIGNALS if now_handlers[s] is not handlers[s]]
    for signum in changed:
        if handlers[signum] is not None:  # None: not set from Python, cannot be put back
            signal.signal(signum, handlers[signum])
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    names = ", ".join(_name(s) for s in changed)
    assert not changed, f"the test changed the handler of {names}"
    assert now_blocked == blocked, (
        f"the test changed the blocked signals from {sorted(blocked)} to {sorted(now_blocked)}"
    )
