"""The registry of backends (backends.py): found by name, an unknown one refused in one line,
and what the CLI, the launcher and the run state ask of each, in pure Python (no framework
loads here)."""

import json
import sys

import pytest

from hpcai500_tf import backends
from hpcai500_tf.cli import build_parser
from hpcai500_tf.errors import UserError
from hpcai500_tf.run import state as run_state


def test_the_names_are_the_cli_choices_and_an_unknown_one_is_one_line():
    assert backends.NAMES == ("tensorflow", "pytorch") and backends.NAMES[0] == backends.DEFAULT
    choices = build_parser().parse_args(["train", "--framework", "pytorch"]).framework
    assert backends.get(choices).name == "pytorch"
    with pytest.raises(UserError) as error:
        backends.get("jax")
    assert str(error.value) == "unknown framework 'jax': use tensorflow or pytorch"


def test_the_device_flag_is_pytorchs_only():
    backends.get("pytorch").check_arguments(device="cuda")
    backends.get("tensorflow").check_arguments(device="auto")
    with pytest.raises(UserError) as error:
        backends.get("tensorflow").check_arguments(device="cpu")
    assert str(error.value) == "--device is for --framework pytorch (TensorFlow uses what it sees)"


def test_the_titles_and_thread_variables():
    assert (backends.get("tensorflow").title, backends.get("pytorch").title) == ("", " (PyTorch)")
    assert backends.get("tensorflow").threads_variable == "TF_NUM_INTRAOP_THREADS"
    assert backends.get("pytorch").threads_variable == "OMP_NUM_THREADS"


def test_torchruns_world_size_makes_a_pytorch_run_multi_worker_only(monkeypatch):
    for name in ("TF_CONFIG", "SLURM_STEP_NUM_TASKS", "RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert backends.get("pytorch").strategy_overrides(False) == ["training.strategy=multi_worker"]
    assert backends.get("tensorflow").strategy_overrides(False) == []
    assert backends.get("tensorflow").strategy_overrides(True) == ["training.strategy=multi_worker"]


def _state(framework: str, epochs: int = 2) -> dict:
    return {"checkpoint": f"ckpt-{epochs}", "epochs_done": epochs, "framework": framework}


def _refusal(run_dir, framework: str) -> str:
    with pytest.raises(UserError) as error:
        run_state.checkpoint_prefix(run_dir, _state(framework))
    assert "\n" not in str(error.value)
    return str(error.value)


def test_each_backends_checkpoint_files_are_checked_with_the_same_lines(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    prefix = checkpoints / "ckpt-2"
    assert _refusal(tmp_path, "pytorch") == (
        f"{prefix}.pt: no such checkpoint file: the checkpoint is incomplete"
    )
    (checkpoints / "ckpt-2.pt").write_bytes(b"x")
    assert run_state.checkpoint_prefix(tmp_path, _state("pytorch")) == prefix
    assert _refusal(tmp_path, "tensorflow") == (
        f"{prefix}.index: no such checkpoint index: the checkpoint is incomplete"
    )
    (checkpoints / "ckpt-2.index").write_bytes(b"x")
    assert _refusal(tmp_path, "tensorflow") == (
        f"{prefix}: the checkpoint has no data files (ckpt-2.data-*)"
    )
    (checkpoints / "ckpt-2.data-00001-of-00002").write_bytes(b"x")
    assert _refusal(tmp_path, "tensorflow") == (
        f"{prefix}: the checkpoint is incomplete (missing ckpt-2.data-00000-of-00002)"
    )
    (checkpoints / "ckpt-2.data-00000-of-00002").mkdir()
    assert _refusal(tmp_path, "tensorflow") == (
        f"{prefix}.data-00000-of-00002: not a regular file; a checkpoint data file must be one"
    )
    (checkpoints / "ckpt-2.data-00000-of-00002").rmdir()
    (checkpoints / "ckpt-2.data-00000-of-00002").write_bytes(b"x")
    assert run_state.checkpoint_prefix(tmp_path, _state("tensorflow")) == prefix


def test_a_state_naming_an_unknown_framework_is_refused(tmp_path):
    state = {
        "config_fingerprint": "x", "epochs_done": 0, "examples": 0, "segments": [],
        "epochs": [], "curve": [], "init_start": 0.0, "run_start": None, "energy": [],
        "checkpoints": [], "checkpoint": "ckpt-0", "framework": "jax",
    }  # fmt: skip
    (tmp_path / "state.json").write_text(json.dumps(state))
    with pytest.raises(UserError, match="'framework' must be tensorflow or pytorch"):
        run_state.read_state(tmp_path)


def test_the_registry_loads_no_framework_until_asked():
    """Importing the registry and reading its facts loads neither TensorFlow nor torch."""
    import subprocess

    probe = (
        "import sys\n"
        "from hpcai500_tf import backends\n"
        "for name in backends.NAMES:\n"
        "    b = backends.get(name); b.check_arguments(); b.checkpoint_files\n"
        "assert not {'tensorflow', 'torch', 'keras'} & set(sys.modules), 'a framework loaded'\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
