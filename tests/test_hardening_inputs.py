"""Bad input at the door (issue 17): config values and flags, resume state, console markup,
logs through symlinks, a closed pipe. Each ends in one line and exit 2, never a traceback."""

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcai500_tf import backends, config
from hpcai500_tf.cli import main
from hpcai500_tf.energy.sampler import PowerSampler
from hpcai500_tf.energy.sources import Source
from hpcai500_tf.errors import UserError
from hpcai500_tf.mlperf.mllog import MLLogger

TRAIN = ["train", "image_classification", "--preset", "tiny"]


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("hpcai500-tf: error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture
def no_tensorflow(monkeypatch):
    """`train` fails the test if it gets as far as loading a framework."""

    def started(backend):
        raise AssertionError(f"{backend.name} was started before the input was refused")

    monkeypatch.setattr(backends.Backend, "load", started)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--set", "optimizer.base_learning_rate=inf"], "'optimizer.base_learning_rate' must be"),
        (["--set", "optimizer.weight_decay=nan"], "'optimizer.weight_decay' must be a finite"),
        (["--set", "data.noise=nan"], "'data.noise' must be a finite number"),
        (["--set", "model.width=nan"], "'model.width' must be a finite number"),
        (["--set", "training.seed=-1"], "'training.seed' must be in [0, 2,147,483,647], got -1"),
        (["--set", "training.seed=99999999999999999999"], "'training.seed' must be within"),
        (["--set", "data.num_classes=100000000000"], "'data.num_classes' must be within"),
        (["--set", "optimizer.base_learning_rate=1e300"], "must be in (0, 1000]"),
        (
            ["--set", "communication.timeout_s=1e9"],
            "'communication.timeout_s' must be in [0, 86,400]",
        ),
        (["--power-hz", "nan"], "--power-hz must be 0 (off) or in [0.01, 1000]"),
        (["--power-hz", "1e-300"], "--power-hz must be 0 (off) or in [0.01, 1000]"),
        (["--power-hz", "inf"], "--power-hz must be 0 (off) or in [0.01, 1000]"),
    ],
)
def test_train_refuses_bad_values_before_tensorflow(arguments, message, no_tensorflow, capsys):
    assert main([*TRAIN, *arguments]) == 2
    assert message in _one_line_error(capsys)


def test_train_out_naming_a_file_is_refused(tmp_path, no_tensorflow, capsys):
    taken = tmp_path / "a-file"
    taken.write_text("")
    assert main([*TRAIN, "--out", str(taken)]) == 2
    assert "exists and is not a directory" in _one_line_error(capsys)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.width=100", "'model.width' must be in (0, 16]"),
        ("data.num_classes=200000", "'data.num_classes' must be in [2, 100,000], got 200000"),
        ("data.noise=-1.0", "'data.noise' must be in [0, 100]"),
        ("model.blocks=[1, 1, 1, 0]", "'model.blocks' must be in [1, 100], got 0"),
        ("model.blocks=[]", "'model.blocks' must be four counts (one per stage), got []"),
    ],
)
def test_data_and_model_sections_state_their_ranges(override, message):
    with pytest.raises(UserError, match=re.escape(message)):
        config.prepare("image_classification", "tiny", [override])  # before TensorFlow


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--hz", "nan"], "--hz must be in [0.01, 1000]"),
        (["--hz", "1e-300"], "--hz must be in [0.01, 1000]"),
        (["--seconds", "inf"], "--seconds must be in (0, 86400]"),
        (["--seconds", "nan"], "--seconds must be in (0, 86400]"),
    ],
)
def test_power_refuses_bad_rates(arguments, message, capsys):
    assert main(["power", *arguments]) == 2
    assert message in _one_line_error(capsys)


@pytest.mark.parametrize(
    "state",
    [
        [],
        {"extra": 1},
        "missing",
        {"epochs_done": "1"},
        {"framework": "jax"},
    ],
)
def test_resume_state_of_the_wrong_shape_names_the_file(tmp_path, state):
    from dataclasses import asdict

    from hpcai500_tf.run.progress import Progress
    from hpcai500_tf.run.state import STATE_FILE, read_state

    valid = {**asdict(Progress(config_fingerprint="f")), "checkpoint": "ckpt-1"}
    valid["framework"] = "tensorflow"
    if state == "missing":
        state = {k: v for k, v in valid.items() if k != "energy"}
    elif isinstance(state, dict):
        state = {**valid, **state}
    (tmp_path / STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(UserError, match=f"{tmp_path / STATE_FILE}: corrupt resume state"):
        read_state(tmp_path)
    (tmp_path / STATE_FILE).write_text(json.dumps(valid))
    assert read_state(tmp_path) == valid


# ------------------------------------------------------------------------ console markup


def test_record_text_and_paths_are_shown_literally(tmp_path, published_record, capsys, monkeypatch):
    from hpcai500_tf.report import console

    monkeypatch.setattr(console.console, "width", 200)  # no cell cut short
    published_record["warnings"] = ["[/x] closes nothing"]
    published_record["layers"]["L1"]["summary"] = "[/x] system"
    (tmp_path / "x[").mkdir()
    path = tmp_path / "x[" / "y]z.json"
    path.write_text(json.dumps(published_record))
    other = copy.deepcopy(published_record)
    other["layers"]["L5"] = {**other["layers"]["L5"], "framework": "[/y]"}
    other_path = tmp_path / "b[bold].json"
    other_path.write_text(json.dumps(other))
    for command in (["score", str(path)], ["rank", str(path)], ["compare", str(path)]):
        assert main([*command, str(other_path)] if command[0] == "compare" else command) == 0
        out = capsys.readouterr().out
        assert "[/x]" in out or "[/y]" in out, out
    assert main(["score", str(path), str(other_path)]) == 0
    assert "b[bold].json" in capsys.readouterr().out.replace("\n", "")


def test_compare_refuses_a_record_of_an_unknown_benchmark(tmp_path, published_record, capsys):
    other = copy.deepcopy(published_record)
    other["benchmark"] = "no_such_benchmark"
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, rec in zip(paths, (published_record, other), strict=True):
        path.write_text(json.dumps(rec))
    assert main(["compare", *map(str, paths)]) == 2
    assert "no_such_benchmark" in _one_line_error(capsys)


def test_a_closed_pipe_ends_quietly(tmp_path):
    published = Path(__file__).resolve().parents[1] / "examples" / "published_2020"
    a, b = sorted(published.glob("*.json"))[:2]
    process = subprocess.Popen(
        [sys.executable, "-m", "hpcai500_tf.cli", "compare", str(a), str(b), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdout.close()  # the reader is gone before anything is written
    err = process.stderr.read().decode()
    assert process.wait() == 1 and err == ""


# ------------------------------------------------------------------------ logs and symlinks


def _planted_link(tmp_path: Path, name: str) -> tuple[Path, Path]:
    link = tmp_path / name
    link.parent.mkdir(parents=True, exist_ok=True)
    target = tmp_path / "precious.txt"
    target.write_text("keep\n")
    link.symlink_to(target)
    return link, target


def test_mlperf_log_never_follows_a_symlink(tmp_path):
    link, target = _planted_link(tmp_path, "mlperf.log")
    with pytest.raises(UserError, match="is a symbolic link"):
        MLLogger(link)
    assert target.read_text() == "keep\n"


def test_logs_are_created_with_the_umask(tmp_path):
    previous = os.umask(0o027)
    try:
        logger = MLLogger(tmp_path / "mlperf.log")
        logger.event("x")
        logger.close()
    finally:
        os.umask(previous)
    assert (tmp_path / "mlperf.log").stat().st_mode & 0o777 == 0o640


def test_power_samples_never_follow_a_symlink(tmp_path):
    link, target = _planted_link(tmp_path, "power-samples.csv")
    sampler = PowerSampler([Source("s", "CPU package", "power", "fake", read_value=lambda: 5.0)])
    sampler.sample_once()
    with pytest.raises(UserError, match="is a symbolic link"):
        sampler.write_samples(link)
    assert target.read_text() == "keep\n"
    sampler.write_samples(tmp_path / "power-samples.csv.new")
    sampler.write_samples(tmp_path / "power-samples.csv.new")  # appends, one header
    lines = (tmp_path / "power-samples.csv.new").read_text().splitlines()
    assert lines[0].startswith("worker,") and len(lines) == 3


def test_garbage_sensor_readings_are_failed_reads():
    values = iter([float("nan"), float("inf"), -3.0, 7.0])
    source = Source("s", "CPU package", "power", "fake", read_value=lambda: next(values))
    sampler = PowerSampler([source])
    for _ in range(4):
        sampler.sample_once()
    assert [v for _, v in sampler.readings["s"]] == [7.0]
    assert sampler.failed["s"] == 3


def test_worker_logs_never_follow_a_symlink(tmp_path, monkeypatch):
    from hpcai500_tf.run import launch

    run_dir = tmp_path / "run"
    link, target = _planted_link(run_dir, "workers/worker-1.log")

    def no_start(*args, **kwargs):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(launch.subprocess, "Popen", no_start)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    setup = config.prepare("image_classification", "tiny")
    with pytest.raises(UserError, match="worker-1.log: is a symbolic link"):
        launch.launch(setup, [], 2, tmp_path, resume=str(run_dir))
    assert target.read_text() == "keep\n"
