"""The config a command runs: a shipped preset, a user's config file, or a stopped run's own."""

import json

import pytest

from hpcai500_tf import config
from hpcai500_tf.errors import UserError


def _saved_run(tmp_path, setup):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(config.saved_config(setup)))
    return run_dir


def test_a_config_file_inherits_a_shipped_preset_and_changes_what_it_names(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(
        'benchmark = "image_classification"\ninherits = "tiny"\n'
        "[training]\nepochs = 3\n[optimizer]\nwarmup_epochs = 0\n"
    )
    setup = config.run_setup(None, None, ["training.seed=7"], str(path))
    tiny = config.prepare("image_classification", "tiny")
    assert setup.benchmark.name == "image_classification" and setup.preset == "tiny+mine"
    assert (setup.training.epochs, setup.training.seed, setup.optimizer.warmup_epochs) == (3, 7, 0)
    changed = {("training", "epochs"), ("training", "seed"), ("optimizer", "warmup_epochs")}
    for section, table in tiny.config.items():
        for key, value in table.items():
            if (section, key) not in changed:
                assert setup.config[section][key] == value, (section, key)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('inherits = "tiny"\n', "missing key"),
        ('benchmark = "image_classification"\ninherits = "huge"\n', "unknown preset 'huge'"),
        ('benchmark = "nope"\ninherits = "tiny"\n', "unknown benchmark 'nope'"),
        (
            'benchmark = "image_classification"\ninherits = "tiny"\n[training]\nepoch = 3\n',
            "unknown key 'training.epoch'",
        ),
        (
            'benchmark = "image_classification"\ninherits = "tiny"\n[trainig]\nepochs = 3\n',
            "unknown section 'trainig'",
        ),
        (
            'benchmark = "image_classification"\ninherits = "tiny"\n[training]\nepochs = 0\n',
            "must be in [1, 10,000], got 0",
        ),
        ("benchmark = [", "not valid TOML"),
    ],
)
def test_a_bad_config_file_is_one_line_naming_it(tmp_path, text, message):
    path = tmp_path / "mine.toml"
    path.write_text(text)
    with pytest.raises(UserError) as refused:
        config.run_setup(None, None, [], str(path))
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_config_file_and_a_preset_exclude_each_other(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('benchmark = "image_classification"\ninherits = "tiny"\n')
    with pytest.raises(UserError, match="--config and --preset"):
        config.run_setup(None, "smoke", [], str(path))
    with pytest.raises(UserError, match="is a config of image_classification"):
        config.run_setup("extreme_weather", None, [], str(path))


def test_resume_alone_takes_the_saved_config(tmp_path):
    setup = config.prepare("image_classification", "tiny", ["training.epochs=3"])
    run_dir = _saved_run(tmp_path, setup)
    resumed = config.resume_setup(run_dir, None, None, [])
    assert (resumed.benchmark.name, resumed.preset, resumed.config) == (
        "image_classification",
        "tiny",
        setup.config,
    )
    # The same config typed again is accepted, in full or in part.
    assert config.resume_setup(run_dir, "image_classification", None, ["training.epochs=3"])
    assert config.resume_setup(run_dir, None, None, ["training.epochs=3"])


@pytest.mark.parametrize(
    ("benchmark", "preset", "overrides"),
    [
        ("image_classification", "tiny", []),  # epochs 2, not 3
        (None, None, ["training.epochs=4"]),
        ("image_classification", "smoke", ["training.epochs=3"]),
        ("extreme_weather", "tiny", ["training.epochs=3"]),
    ],
)
def test_resume_with_another_config_is_refused(tmp_path, benchmark, preset, overrides):
    setup = config.prepare("image_classification", "tiny", ["training.epochs=3"])
    run_dir = _saved_run(tmp_path, setup)
    with pytest.raises(UserError, match="started with another config"):
        config.resume_setup(run_dir, benchmark, preset, overrides)


def test_an_older_run_directory_needs_its_benchmark_again(tmp_path):
    setup = config.prepare("image_classification", "tiny")
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(setup.config))  # before config.json named it
    with pytest.raises(UserError, match="does not name the benchmark"):
        config.resume_setup(run_dir, None, None, [])
    assert config.resume_setup(run_dir, "image_classification", "tiny", []).config == setup.config


def test_resume_refuses_what_is_not_a_run_directory(tmp_path):
    with pytest.raises(UserError, match="not a run directory"):
        config.resume_setup(tmp_path, None, None, [])
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(UserError, match="not JSON"):
        config.resume_setup(tmp_path, None, None, [])
