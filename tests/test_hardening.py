"""Never lose a run, never print a traceback or a non-finite score: faults injected into real
tiny runs, hostile files, inconsistent records, and generated records through every command
that reads them (Hypothesis; `HYPOTHESIS_PROFILE=slow` runs 10x the examples)."""

import copy
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcai500_tf import record
from hpcai500_tf.cli import main
from hpcai500_tf.errors import UserError

from .conftest import EXAMPLE, copy_run
from .test_data import imagenet_dir  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[1]
settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.register_profile(
    "slow", max_examples=600, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
TINY = ["train", "image_classification", "--preset", "tiny", "--power-hz", "0"]


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def strict_json(text: str):
    """Parse as JSON that has no NaN or Infinity, and check every number is finite."""

    def refuse(name):
        raise AssertionError(f"{name} in the output")

    value = json.loads(text, parse_constant=refuse)

    def walk(item):
        if isinstance(item, float):
            assert math.isfinite(item)
        elif isinstance(item, dict):
            for v in item.values():
                walk(v)
        elif isinstance(item, list):
            for v in item:
                walk(v)

    walk(value)
    return value


# ------------------------------------------------------------------------ a run is never lost


def test_a_meter_log_of_absurd_watts_leaves_a_record_with_energy_not_measured(tmp_path, capsys):
    meter = tmp_path / "meter.csv"
    now = time.time()
    meter.write_text("".join(f"{now + i},1.7e308\n" for i in range(-5, 400)))
    out = tmp_path / "runs"
    assert main([*TINY, "--out", str(out), "--meter-log", str(meter)]) == 0
    (path,) = out.glob("*/record.json")
    rec = record.load(path)
    assert rec["status"] == "completed" and rec["energy"]["measured"] is False
    # readings beyond a gigawatt are unreadable lines (energy/meter_log.py): none is used
    assert (
        f"meter log not used: {meter}: fewer than two usable readings in the meter log"
        in (rec["warnings"])
    )


def _corrupt_a_payload(shard: Path) -> None:
    """Flip bytes inside the last record's data: the headers still count (and the sampled
    first records still parse) before the run, but reading it fails mid-epoch."""
    from hpcai500_tf.data import tfrecords

    records = tfrecords.first_records(shard, 1000)
    offset, payload = records[-1]
    data = bytearray(shard.read_bytes())
    for position in range(offset + 12 + 10, offset + 12 + 30):
        data[position] ^= 0xFF
    shard.write_bytes(bytes(data))


def test_a_shard_corrupt_mid_run_ends_in_a_failed_record(tmp_path, imagenet_dir, capsys):  # noqa: F811
    data = tmp_path / "data"
    data.mkdir()
    for shard in imagenet_dir.iterdir():
        (data / shard.name).write_bytes(shard.read_bytes())
    _corrupt_a_payload(data / "train-00001-of-00002")
    out = tmp_path / "runs"
    code = main(
        [*TINY, "--data", str(data), "--out", str(out), "--set", "data.source=imagenet",
         "--set", "data.train_examples=12", "--set", "data.eval_examples=12",
         "--set", "data.num_classes=3", "--set", "data.label_offset=1",
         "--set", "training.batch_per_replica=4"]
    )  # fmt: skip
    assert code == 1
    (path,) = out.glob("*/record.json")
    rec = record.load(path)
    assert rec["status"] == "failed"
    assert any("DataLossError" in w or "corrupt" in w.lower() for w in rec["warnings"])
    last = (path.parent / "mlperf.log").read_text().strip().splitlines()[-1]
    assert '"key": "run_stop"' in last and '"status": "aborted"' in last


def test_resume_rebuilds_a_finished_runs_lost_record(tf_tiny, tmp_path, capsys):
    # A copy of the session's finished tiny run (conftest's tf_tiny: `train image_classification
    # --preset tiny`, as TINY without --power-hz).
    path = copy_run(tf_tiny[0].parent, tmp_path) / "record.json"
    original = record.load(path)
    path.unlink()
    assert main(["train", "--resume", str(path.parent), "image_classification",
                 "--preset", "tiny", "--power-hz", "0"]) == 0  # fmt: skip
    rebuilt = record.load(path)
    assert rebuilt["status"] == "completed"
    assert rebuilt["quality"]["achieved"] == original["quality"]["achieved"]
    assert rebuilt["timeline"]["epochs"] == original["timeline"]["epochs"]
    assert any("rebuilt by --resume" in w for w in rebuilt["warnings"])
    assert (path.parent / "mlperf.log").read_text().count('"key": "run_stop"') == 1
    capsys.readouterr()
    assert main(["train", "--resume", str(path.parent), "image_classification",
                 "--preset", "tiny", "--power-hz", "0"]) == 2  # fmt: skip
    assert "already finished all its epochs (its record" in one_line_error(capsys)


def _checkpointed_epochs(out: Path) -> list[dict]:
    """The epochs in the run's last checkpoint (state.json is replaced atomically)."""
    states = list(out.glob("*/state.json"))
    return json.loads(states[0].read_text())["epochs"] if states else []


def test_a_run_killed_at_a_random_moment_resumes_without_counting_time_twice(tmp_path):
    out = tmp_path / "runs"
    epochs = ["--set", "training.epochs=12"]
    command = [sys.executable, "-m", "hpcai500_tf.cli", *TINY, "--out", str(out), *epochs]
    start = time.time()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = start + 240
    while time.time() < deadline and child.poll() is None and len(_checkpointed_epochs(out)) < 3:
        time.sleep(0.02)  # until the third checkpoint
    done = _checkpointed_epochs(out)
    assert len(done) >= 3, (
        f"{len(done)} epochs checkpointed, then exit status {child.poll()} "
        "(None: still running after 240 s)"
    )
    # A tiny epoch (train, evaluate, checkpoint) takes 0.1-0.5 s by CPU and load: a fixed wait
    # can outlast the run. The moment is a random point of the next two epochs at this run's
    # own pace (its shortest epoch after the first, whose evaluation traces), while 12 - 3 - 2
    # or more epochs are still to run.
    pairs = zip(done[1:], done[2:], strict=False)
    epoch_s = min(b["elapsed_s"] - a["elapsed_s"] for a, b in pairs)
    time.sleep(random.uniform(0.0, 2.0 * epoch_s))
    assert child.poll() is None, (
        f"the run ended ({child.returncode}) before the kill, {2.0 * epoch_s:.2f} s at most "
        f"after its epoch {len(done)} of 12 (checkpointed epochs: {done})"
    )
    child.send_signal(signal.SIGKILL)
    child.wait(30)
    (run_dir,) = out.glob("*")
    assert not (run_dir / "record.json").exists()
    # The resume in this process (TensorFlow is loaded here already): the kill was the child's.
    code = main(["train", "--resume", str(run_dir), "image_classification", "--preset", "tiny",
                 "--power-hz", "0", *epochs])  # fmt: skip
    wall = time.time() - start
    assert code == 0
    rec = record.load(run_dir / "record.json")
    segments = rec["timeline"]["segments"]
    assert len(segments) == 2 and segments[0]["stop"] <= segments[1]["start"]
    assert sum(s["stop"] - s["start"] for s in segments) < wall
    assert not list(run_dir.glob(".*.tmp"))


# ------------------------------------------------------------------------ files


def test_write_atomic_refuses_non_finite_numbers_and_writes_nothing(tmp_path):
    with pytest.raises(ValueError, match="non-finite"):
        record.write_atomic(tmp_path / "x.json", {"joules": math.inf})
    assert not list(tmp_path.iterdir())


def test_write_atomic_removes_a_killed_writes_orphans_and_respects_the_umask(tmp_path):
    orphan = tmp_path / ".record.json.abc123.tmp"
    orphan.write_text("half a reco")
    unrelated = tmp_path / ".notes.tmp"
    unrelated.write_text("mine")
    old = os.umask(0o022)
    try:
        record.write_atomic(tmp_path / "record.json", {"a": 1})
    finally:
        os.umask(old)
    assert not orphan.exists() and unrelated.exists()
    assert (tmp_path / "record.json").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p.write_text("[" * 100_000 + "]" * 100_000), "nested too deeply"),
        (lambda p: p.write_text('{"a": ' + "9" * 5000 + "}"), "not a valid record"),
        (lambda p: os.mkfifo(p), "not a regular file"),
        (lambda p: p.symlink_to(p), "cannot open record file"),
        (lambda p: p.write_text('{"a": NaN}'), "NaN is not JSON"),
    ],
    ids=["deep", "huge-int", "fifo", "symlink-loop", "nan"],
)
def test_hostile_files_are_one_line(tmp_path, capsys, make, message):
    path = tmp_path / "r.json"
    make(path)
    assert main(["score", str(path)]) == 2
    assert message in one_line_error(capsys)


def test_devices_and_long_names_are_one_line(tmp_path, capsys):
    assert main(["score", "/dev/zero"]) == 2
    assert "not a regular file" in one_line_error(capsys)
    assert main(["rank", str(tmp_path / ("x" * 300 + ".json"))]) == 2
    assert "cannot open record file" in one_line_error(capsys)


# ------------------------------------------------------------------------ records


def published() -> dict:
    return json.loads(EXAMPLE.read_text())


def _edit(**changes):
    def apply(rec):
        for dotted, value in changes.items():
            *parents, last = dotted.split(".")
            target = rec
            for key in parents:
                target = target[int(key)] if key.isdigit() else target[key]
            target[int(last) if last.isdigit() else last] = value
        return rec

    return apply


@pytest.mark.parametrize(
    "edit, field",
    [
        (_edit(**{"quality.reached_target": False}), "quality.reached_target"),
        (_edit(**{"quality.time_to_quality_s": 1e6, "quality.curve.0.elapsed_s": 1e6}),
         "quality.time_to_quality_s"),
        (_edit(**{"quality.curve": []}), "quality.curve"),
        (_edit(**{"timeline.segments": []}), "timeline.segments"),
        (_edit(**{"energy.sample_hz": -5}), "energy.sample_hz"),
        (_edit(**{"quality.curve.0.elapsed_s": -3.0, "quality.time_to_quality_s": -3.0}),
         "quality.curve[0].elapsed_s"),
        (_edit(**{"timeline.epochs": [{"epoch": 1, "elapsed_s": 1.0, "examples": 1,
                                       "seconds": "12"}]}), "timeline.epochs[0].seconds"),
        (_edit(**{"timeline.epochs": [{"epoch": 2, "elapsed_s": 1.0, "examples": 5},
                                      {"epoch": 1, "elapsed_s": 2.0, "examples": 9}]}),
         "timeline.epochs[1].epoch"),
    ],
    ids=["reached", "ttq-beyond-run", "empty-curve", "no-segments", "sample-hz", "negative",
         "string-seconds", "epochs-backwards"],
)  # fmt: skip
def test_inconsistent_records_are_refused_naming_the_field(edit, field):
    with pytest.raises(UserError, match=field.replace("[", r"\[").replace("]", r"\]")):
        record.validate(edit(published()))


@pytest.mark.parametrize(
    "edit",
    [
        _edit(**{"quality.time_to_quality_s": 1e-300, "quality.curve.0.elapsed_s": 1e-300}),
        _edit(**{"quality.target": 1e-320, "layers.L9.target_quality": 1e-320}),
    ],
    ids=["tiny-time", "tiny-target"],
)
def test_a_score_that_is_not_finite_is_refused(tmp_path, capsys, edit):
    rec = edit(published())
    rec["timeline"]["segments"] = [{"start": 0.0, "stop": 132.0}]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(rec))
    assert main(["score", str(path), "--json"]) == 2
    assert "not a finite number" in one_line_error(capsys)
    assert main(["rank", str(path), "--json"]) == 0
    ranking = strict_json(capsys.readouterr().out)
    assert not ranking["submissions"] and ranking["refused"]  # refused, with a reason


def test_energy_measured_without_a_sample_rate_scores(tmp_path, capsys):
    rec = published()
    rec["energy"].update(
        measured=True, reason=None, joules=1e6, interval_s=132.0, scope="node (meter log)",
        average_watts=1e6 / 132.0, coverage=1.0, sample_hz=None,
    )  # fmt: skip
    path = tmp_path / "r.json"
    path.write_text(json.dumps(rec))
    for command in (["score"], ["rank"], ["compare", str(path)]):
        assert main([*command, str(path), "--json"]) == 0
        strict_json(capsys.readouterr().out)


# ------------------------------------------------------------------------ MLPerf logs


def _log(*events) -> str:
    return "".join(":::MLLOG " + json.dumps(e) + "\n" for e in events)


GOOD = [
    {"key": "submission_benchmark", "value": "resnet", "time_ms": 0},
    {"key": "global_batch_size", "value": 256, "time_ms": 0},
    {"key": "train_samples", "value": 1024, "time_ms": 0},
    {"key": "run_start", "value": None, "time_ms": 1000},
    {"key": "epoch_stop", "value": None, "time_ms": 2000, "metadata": {"epoch_num": 1}},
    {"key": "eval_accuracy", "value": 0.5, "time_ms": 2100, "metadata": {"epoch_num": 1}},
    {"key": "run_stop", "value": None, "time_ms": 2200, "metadata": {"status": "success"}},
]


@pytest.mark.parametrize(
    "bad",
    [
        {"key": "run_start", "value": None, "time_ms": None},
        {"key": "run_start", "value": None, "time_ms": [1, 2]},
        {"key": ["run_start"], "value": None, "time_ms": 1},
        {"key": {"a": 1}, "value": None, "time_ms": 1},
        {"key": "eval_accuracy", "value": 0.5, "time_ms": 2100, "metadata": [1]},
        {"key": "eval_accuracy", "value": 0.5, "time_ms": 2100, "metadata": "x"},
        {"key": "eval_accuracy", "value": 0.5, "time_ms": 2100, "metadata": {"epoch_num": 1e300}},
        {"key": "eval_accuracy", "value": 0.5, "time_ms": 2100, "metadata": {"epoch_num": -1}},
    ],
)
def test_hostile_mlperf_logs_are_one_line_or_a_valid_record(tmp_path, capsys, bad):
    log = tmp_path / "mlperf.log"
    log.write_text(_log(*GOOD, bad) + ":::MLLOG " + "[" * 50_000 + "\n")
    code = main(["import-mlperf", str(log), "--framework", "x", "--flops-per-example", "1e9"])
    if code == 0:
        record.load(f"{log}.record.json")
    else:
        assert code == 2 and str(log) in one_line_error(capsys)


# ------------------------------------------------------------------------ generated records

JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet='ab[]/\\"{}x0', max_size=12),
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


BASE = json.loads(EXAMPLE.read_text())
FIELDS = [p for p in _paths(BASE) if p]


@st.composite
def mutated_records(draw):
    rec = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        path = draw(st.sampled_from(FIELDS))
        target = rec
        try:
            for key in path[:-1]:
                target = target[key]
            if draw(st.booleans()) and isinstance(target, dict):
                target.pop(path[-1], None)
            else:
                target[path[-1]] = draw(JSON_VALUES)
        except (KeyError, IndexError, TypeError):
            continue
    return rec


@given(
    rec=mutated_records(),
    command=st.sampled_from(["score", "rank", "compare"]),
    as_json=st.booleans(),
)
def test_every_command_on_any_record_is_finite_output_or_one_line(
    tmp_path_factory, rec, command, as_json
):
    path = tmp_path_factory.mktemp("gen") / "r[x]" / "q[" / "y]z.json"  # markup: "q[/y]z"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(rec))  # NaN and Infinity written as JSON cannot hold them
    args = [command, str(path)] + ([str(EXAMPLE)] if command == "compare" else [])
    out, err = _run_main(args + (["--json"] if as_json else []))
    assert out[0] in (0, 2), (out, err)
    if out[0] == 0 and as_json:
        strict_json(out[1])
    elif out[0] == 0:
        assert not any(word in out[1] for word in ("inf ", "nan ", "Infinity", "NaN")), out[1]
    else:
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def _run_main(args):
    import contextlib
    import io

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(args)
    return (code, stdout.getvalue()), stderr.getvalue()


# ------------------------------------------------------------------------ generated --set values


def _preset_keys():
    from hpcai500_tf import config

    setup = config.prepare("image_classification", "tiny", [])
    return [
        f"{section}.{key}"
        for section, values in setup.config.items()
        if isinstance(values, dict)
        for key in values
    ]


SET_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**25), max_value=10**25).map(str),
    st.sampled_from(["nan", "inf", "-inf", "true", "'x'", "[1, 2]", "[]", "1e309", "0", "-1"]),
)


@given(key=st.sampled_from(_preset_keys()), value=SET_VALUES)
def test_any_set_value_is_a_finite_config_or_one_line(key, value):
    from hpcai500_tf import config

    try:
        setup = config.prepare("image_classification", "tiny", [f"{key}={value}"])
    except UserError as error:
        assert "\n" not in str(error)
        return
    strict_json(json.dumps(setup.config))  # every number in the resolved config is finite


def test_a_stopped_record_says_which_epoch_resume_continues_from(tf_stopped):
    # The session's run of 3 epochs, stopped as epoch 3 began; read only.
    stopped = record.load(tf_stopped / "record.json")
    state = json.loads((tf_stopped / "state.json").read_text())
    assert stopped["status"] == "stopped" and state["epochs_done"] == 2
    assert any(
        f"the last checkpoint holds 2: resume with --resume {tf_stopped} (it continues from "
        "epoch 3)" in w
        for w in stopped["warnings"]
    )


@given(
    index=st.integers(min_value=0, max_value=len(GOOD) - 1),
    field=st.sampled_from(["key", "value", "time_ms", "metadata"]),
    value=JSON_VALUES,
)
def test_any_mlperf_log_is_a_valid_record_or_one_line(tmp_path_factory, index, field, value):
    events = copy.deepcopy(GOOD)
    events[index][field] = value
    log = tmp_path_factory.mktemp("log") / "mlperf.log"
    log.write_text(_log(*events))
    (code, _), err = _run_main(
        ["import-mlperf", str(log), "--framework", "x", "--flops-per-example", "1e9"]
    )
    if code == 0:
        record.load(f"{log}.record.json")
    else:
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
