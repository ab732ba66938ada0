"""`train --resume` trusts nothing in a run directory: every kind of damage to a stopped run
(special files, damaged checkpoints, a state that disagrees with itself or its checkpoint) is
one line and exit 2 before any training, and leaves the run directory as it was; a resume of
a run that finished its epochs always gets a record."""

import json
import math
import os
import shutil
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcai500_tf import config, record
from hpcai500_tf.cli import main
from hpcai500_tf.engine import run
from hpcai500_tf.errors import UserError
from hpcai500_tf.run import state as run_state
from hpcai500_tf.run.progress import Progress
from hpcai500_tf.run.record import make_record

from . import test_hardening  # noqa: F401  (loads the Hypothesis profile)
from .conftest import copy_run
from .test_train import StopBeforeEpoch

RESUME = ["train", "--resume", "{}", "--power-hz", "0"]
DATA = "ckpt-3.data-00000-of-00002"


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> Path:
    """A tiny run stopped after 3 of its 5 epochs, a checkpoint after each."""
    setup = config.prepare(
        "image_classification", "tiny", ["training.epochs=5", "training.checkpoint_every=1"]
    )
    out = tmp_path_factory.mktemp("stopped")
    stopped, path = run.run_benchmark(setup, None, out, view=[StopBeforeEpoch(4)], power_hz=0)
    assert stopped["status"] == "stopped" and len(stopped["timeline"]["epochs"]) == 3
    return path.parent


def contents(run_dir: Path) -> dict:
    """What the user has in the run directory: each regular file's bytes (but the lock's, which
    names whoever last held it)."""
    return {
        str(path.relative_to(run_dir)): path.read_bytes()
        for path in sorted(run_dir.rglob("*"))
        if path.is_file() and not path.is_symlink() and path.name != "run.lock"
    }


def edit_state(change):
    def damage(run_dir):
        path = run_dir / "state.json"
        state = json.loads(path.read_text())
        change(state)
        path.write_text(json.dumps(state))

    return damage


def replace_with(name, kind):
    def damage(run_dir):
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "directory":
            path.mkdir()
        elif kind == "file":
            path.write_text("x")
        else:
            path.symlink_to(kind)

    return damage


def rewrite(name, change):
    def damage(run_dir):
        path = run_dir / "checkpoints" / name
        path.write_bytes(change(path.read_bytes()))

    return damage


DAMAGE = {
    # special files: refused before anything opens them (a FIFO would hang the resume)
    "state.json a FIFO": (replace_with("state.json", "fifo"), "state.json: not a regular file"),
    "state.json -> /dev/zero": (
        replace_with("state.json", "/dev/zero"),
        "state.json: not a regular file",
    ),
    "mlperf.log a FIFO": (replace_with("mlperf.log", "fifo"), "mlperf.log: not a regular file"),
    "mlperf.log a directory": (replace_with("mlperf.log", "directory"), "mlperf.log: a directory"),
    "record.json a directory": (
        replace_with("record.json", "directory"),
        "record.json: a directory",
    ),
    # a record a resume would replace that is a result, or cannot be read to tell
    "record completed, another schema version": (
        lambda d: (d / "record.json").write_text('{"schema_version": 99, "status": "completed"}'),
        "the run already finished all its epochs (its record:",
    ),
    "record diverged": (
        lambda d: (d / "record.json").write_text(
            (d / "record.json").read_text().replace('"status": "stopped"', '"status": "diverged"')
        ),
        "its run diverged",
    ),
    "record not JSON": (
        lambda d: (d / "record.json").write_bytes(b"\xff\xfe"),
        "record.json: cannot be read as a record, and a resume would replace it",
    ),
    "power samples a FIFO": (
        replace_with("power-samples.csv", "fifo"),
        "power-samples.csv: not a regular file",
    ),
    "tensorboard a file": (replace_with("tensorboard", "file"), "tensorboard: not a directory"),
    "tensorboard a FIFO": (replace_with("tensorboard", "fifo"), "tensorboard: not a directory"),
    "checkpoints a file": (replace_with("checkpoints", "file"), "checkpoints: not a directory"),
    "state.json dangling": (replace_with("state.json", "/nowhere"), "dangling symbolic link"),
    "checkpoint data a FIFO": (
        replace_with(f"checkpoints/{DATA}", "fifo"),
        f"{DATA}: not a regular file",
    ),
    "checkpoint index a directory": (
        replace_with("checkpoints/ckpt-3.index", "directory"),
        "ckpt-3.index: not a regular file",
    ),
    "checkpoint data missing": (
        lambda d: (d / "checkpoints" / "ckpt-3.data-00001-of-00002").unlink(),
        "the checkpoint is incomplete (missing ckpt-3.data-00001-of-00002)",
    ),
    # damaged checkpoints: found by reading every tensor before training
    "checkpoint data truncated": (
        rewrite(DATA, lambda b: b[: len(b) // 2]),
        "ckpt-3: the checkpoint is damaged",
    ),
    "checkpoint data zeroed": (rewrite(DATA, lambda b: bytes(len(b))), "the checkpoint is damaged"),
    "checkpoint data random": (
        rewrite("ckpt-3.data-00001-of-00002", lambda b: os.urandom(len(b))),
        "the checkpoint is damaged",
    ),
    "checkpoint index truncated": (
        rewrite("ckpt-3.index", lambda b: b[:100]),
        "the checkpoint is damaged",
    ),
    # a state that disagrees with itself, its checkpoint or the run's budget
    "epochs_done 99": (edit_state(lambda s: s.update(epochs_done=99)), "epochs_done is 99"),
    "epochs_done 1": (
        edit_state(lambda s: s.update(epochs_done=1)),
        "epochs_done is 1, but 3 epochs are listed, and its checkpoint ckpt-3",
    ),
    "segments [1, 2]": (
        edit_state(lambda s: s.update(segments=[1, 2])),
        "'segments[0]' must be an object",
    ),
    "segment NaN": (
        edit_state(lambda s: s["segments"][0].update(start=math.nan)),
        "NaN is not JSON",
    ),
    "segment backwards": (
        edit_state(lambda s: s["segments"][0].update(stop=s["segments"][0]["start"] - 5)),
        "'segments[0].stop' must be after its start",
    ),
    "curve entry malformed": (
        edit_state(lambda s: s["curve"][0].update(epoch="x")),
        "'curve[0].epoch' must be an integer",
    ),
    "curve beyond the timed run": (
        edit_state(lambda s: s["curve"][-1].update(elapsed_s=1e9)),
        "'curve[2].elapsed_s' must be in",
    ),
    "epoch entry missing its loss": (
        edit_state(lambda s: s["epochs"][1].pop("loss")),
        "missing key 'epochs[1].loss'",
    ),
    "examples disagree": (
        edit_state(lambda s: s.update(examples=10)),
        "'examples' must be the last epoch's examples",
    ),
    "checkpoint outside the run": (
        edit_state(lambda s: s.update(checkpoint="/etc/passwd")),
        "'checkpoint' must be a checkpoint of the run",
    ),
    "unknown key": (edit_state(lambda s: s.update(extra=1)), "unknown key 'extra'"),
    "state nested deeply": (
        lambda d: (d / "state.json").write_text("[" * 100_000 + "]" * 100_000),
        "nested too deeply",
    ),
    "state too large": (
        lambda d: (d / "state.json").write_bytes(b" " * (run_state.MAX_STATE_BYTES + 1)),
        "larger than a resume state can be",
    ),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_run_directory_is_refused_in_one_line_and_left_as_it_was(
    stopped_run, tmp_path, capsys, kind
):
    damage, message = DAMAGE[kind]
    run_dir = copy_run(stopped_run, tmp_path)
    damage(run_dir)
    before = contents(run_dir)
    assert main([part.format(run_dir) for part in RESUME]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert message in err, err
    assert contents(run_dir) == before  # nothing appended, nothing replaced


def test_a_state_that_names_another_epoch_than_its_checkpoint_holds_is_refused(
    stopped_run, tmp_path, capsys
):
    """The checkpoint holds its own epoch count: a state (and file names) made to say 2 epochs
    over a checkpoint of 3 is refused naming both, before training."""
    run_dir = copy_run(stopped_run, tmp_path)
    for path in (run_dir / "checkpoints").iterdir():
        path.rename(path.with_name(path.name.replace("ckpt-3", "ckpt-2")))

    def two_epochs(state):
        del state["epochs"][2]
        state["curve"] = [point for point in state["curve"] if point["epoch"] <= 2]
        state["checkpoints"] = [c for c in state["checkpoints"] if c["epoch"] <= 2]
        state.update(epochs_done=2, examples=state["epochs"][1]["examples"])
        state["checkpoint"] = state["checkpoint"].replace("ckpt-3", "ckpt-2")

    edit_state(two_epochs)(run_dir)
    before = contents(run_dir)
    assert main([part.format(run_dir) for part in RESUME]) == 2
    err = capsys.readouterr().err
    assert "says 2 epochs were done, but its checkpoint" in err and "holds 3" in err, err
    assert contents(run_dir) == before


def test_a_moved_run_directory_resumes_from_its_own_checkpoint(stopped_run, tmp_path):
    """state.json names the checkpoint where it was written; the resume reads the one in the
    run directory as it is now (never another run's, wherever that path leads)."""
    run_dir = copy_run(stopped_run, tmp_path)
    original = json.loads((run_dir / "state.json").read_text())["checkpoint"]
    assert not original.startswith(str(run_dir))
    assert main([part.format(run_dir) for part in RESUME]) == 0
    done = record.load(run_dir / "record.json")
    assert done["status"] == "completed" and len(done["timeline"]["epochs"]) == 5


def test_the_cli_checks_a_resume_once_and_hands_the_lifecycle_its_plan(
    stopped_run, tmp_path, monkeypatch
):
    """`train --resume` checks the run directory once (run/resume.py's plan, made before any
    framework loads); the lifecycle continues that plan and checks nothing of it again."""
    from hpcai500_tf.run.resume import Plan

    run_dir = copy_run(stopped_run, tmp_path)
    checked, given = [], []
    check_resumable = run_state.check_resumable
    monkeypatch.setattr(
        run_state, "check_resumable", lambda *a: checked.append(a) or check_resumable(*a)
    )

    def build_trainer(setup, options, observers):
        given.append(options.resume)
        raise UserError("stopped here: the trainer is not built")

    monkeypatch.setattr(run, "build_trainer", build_trainer)
    assert main([part.format(run_dir) for part in RESUME]) == 2
    assert len(checked) == 1
    (plan,) = given
    assert isinstance(plan, Plan) and plan.run_dir.path == run_dir
    assert plan.framework == "tensorflow"


def test_a_stopped_record_after_the_last_epoch_is_rebuilt_complete(tf_tiny, tmp_path):
    """A stop between the last checkpoint and the record leaves a stopped record of a run
    whose epochs are all done: the resume rebuilds it as completed, once; then it is done."""
    run_dir = copy_run(tf_tiny[0].parent, tmp_path)  # the session's tiny run: its 2 epochs done
    path = run_dir / "record.json"
    finished = record.load(path)
    assert finished["status"] == "completed" and len(finished["timeline"]["epochs"]) == 2
    record.save(path, {**finished, "status": "stopped"}, overwrite=True)
    assert main([part.format(run_dir) for part in RESUME]) == 0
    rebuilt = record.load(path)
    assert rebuilt["status"] == "completed"
    assert any("rebuilt by --resume" in warning for warning in rebuilt["warnings"])
    with pytest.raises(UserError, match="already finished all its epochs"):
        run_state.check_resumable(run_dir, 2)


# ------------------------------------------------------------------------ generated damage

STATE_KEYS = [f.name for f in fields(Progress)] + ["checkpoint"]
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)


@st.composite
def damaged_states(draw, valid: dict):
    """The stopped run's state with a few values replaced, removed or added, anywhere."""
    state = json.loads(json.dumps(valid))
    for _ in range(draw(st.integers(1, 3))):
        target, path = state, []
        while isinstance(target, dict | list) and target and draw(st.booleans()):
            key = draw(
                st.sampled_from(list(target) if isinstance(target, dict) else range(len(target)))
            )
            path.append(key)
            parent, target = target, target[key]
        if not path:
            key = draw(st.sampled_from(STATE_KEYS + ["extra"]))
            parent, path = state, [key]
        action = draw(st.sampled_from(["replace", "remove", "number"]))
        last = path[-1]
        if action == "remove" and isinstance(parent, dict):
            parent.pop(last, None)
        elif (
            action == "number" and isinstance(target, int | float) and not isinstance(target, bool)
        ):
            parent[last] = target + draw(st.sampled_from([-1, 1, -1e9, 1e9, 0.5]))
        else:
            parent[last] = draw(JSON_VALUES)
    return state


@pytest.fixture(scope="module")
def valid_state(stopped_run) -> dict:
    return json.loads((stopped_run / "state.json").read_text())


@given(data=st.data())
def test_any_damaged_state_is_refused_in_one_line_or_makes_a_valid_record(
    stopped_run, valid_state, tmp_path_factory, data
):
    """Whatever a state says, the door refuses it in one line, or the record a resume of it
    writes at the end is valid: a resume that reaches the end always writes its record."""
    state = data.draw(damaged_states(valid_state))
    run_dir = tmp_path_factory.mktemp("state")
    (run_dir / "state.json").write_text(json.dumps(state))
    shutil.copytree(stopped_run / "checkpoints", run_dir / "checkpoints")
    try:
        checked = run_state.check_resumable(run_dir, epochs=5)
    except UserError as error:
        assert "\n" not in str(error)
        return
    rec = record.load(stopped_run / "record.json")
    setup = config.setup_of_run(stopped_run)
    del checked["checkpoint"], checked["framework"]
    workload = SimpleNamespace(quality_metric=rec["quality"]["metric"], measures_quality=True)
    flops = {k: v for k, v in rec["flops"].items() if k != "total"}
    built = make_record(
        setup, rec["layers"], workload, Progress(**checked), flops, "stopped", [],
        rec["artifacts"], rec["energy"],
    )  # fmt: skip
    record.validate(json.loads(record.dumps(built)))


KINDS = ["fifo", "directory", "file", "/dev/zero", "/nowhere", "loop"]


@given(name=st.sampled_from(sorted(run_state.RUN_FILES)), kind=st.sampled_from(KINDS))
def test_any_file_of_the_wrong_kind_is_refused_naming_it(stopped_run, tmp_path_factory, name, kind):
    run_dir = copy_run(stopped_run, tmp_path_factory.mktemp("kind"))
    expected = run_state.RUN_FILES[name]
    if kind == "loop":
        kind = str(run_dir / name)  # a link to itself
    if (expected == "directory") == (kind == "directory"):
        return  # the right kind: not damage
    replace_with(name, kind)(run_dir)
    with pytest.raises(UserError) as refused:
        run_state.check_resumable(run_dir, epochs=5)
    assert str(run_dir / name) in str(refused.value)
