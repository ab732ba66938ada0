"""One run directory, named once: a new run gets a fresh BENCHMARK-PRESET-TIMESTAMP directory
and never reuses one; every output directory is checked by one function, in one line naming
its flag; every path of a run lies inside it, and is the one a resume checks."""

import ast
import re
from datetime import datetime
from pathlib import Path

import pytest

from hpcai500_tf.errors import UserError
from hpcai500_tf.files import check_output_directory
from hpcai500_tf.run import directory as run_directory
from hpcai500_tf.run.directory import RunDirectory
from hpcai500_tf.run.state import RUN_FILES

PACKAGE = Path(run_directory.__file__).resolve().parents[1]
STAMP = r"\d{8}-\d{6}"
# Every file and directory a run directory holds, by its property.
PROPERTIES = [
    "config", "state", "record", "mlperf_log", "power_samples", "error_log", "checkpoints",
    "tensorboard", "workers", "lock",
]  # fmt: skip


class FrozenClock:
    """datetime with a now() that never moves: two runs started in one second."""

    @staticmethod
    def now():
        return datetime(2024, 5, 6, 7, 8, 9)


# ----------------------------------------------------------------------------- a new run


def test_a_new_run_gets_a_fresh_empty_directory_named_for_it(tmp_path):
    out = tmp_path / "runs" / "nested"  # made where it does not exist yet
    run = RunDirectory.new(out, "image_classification", "tiny")
    assert run.path.parent == out and run.path.is_dir() and not any(run.path.iterdir())
    assert re.fullmatch(rf"image_classification-tiny-{STAMP}", run.name)
    assert str(run) == str(run.path)


def test_a_taken_name_gets_the_next_suffix_and_the_run_there_is_left_untouched(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(run_directory, "datetime", FrozenClock)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    taken = tmp_path / "image_classification-tiny-20240506-070809"
    taken.mkdir()
    (taken / "record.json").write_text("mine")
    (tmp_path / f"{taken.name}-2").write_text("a file, not a run")
    run = RunDirectory.new(tmp_path, "image_classification", "tiny")
    assert run.name == f"{taken.name}-3" and not any(run.path.iterdir())
    assert [p.name for p in taken.iterdir()] == ["record.json"]
    assert (taken / "record.json").read_text() == "mine"
    assert (tmp_path / f"{taken.name}-2").read_text() == "a file, not a run"


@pytest.mark.parametrize("preset", ["p" * 400, "é" * 200, "x" * 161])
def test_a_long_preset_name_keeps_the_directory_name_under_255_bytes(tmp_path, preset):
    run = RunDirectory.new(tmp_path, "extreme_weather", preset)
    assert run.path.is_dir() and len(run.name.encode()) < 255
    assert run.name.startswith("extreme_weather-") and re.search(rf"-{STAMP}$", run.name)


def test_two_long_presets_alike_at_the_start_get_different_directories(tmp_path, monkeypatch):
    monkeypatch.setattr(run_directory, "datetime", FrozenClock)
    first = RunDirectory.new(tmp_path, "extreme_weather", "a" * 300 + "1")
    second = RunDirectory.new(tmp_path, "extreme_weather", "a" * 300 + "2")
    assert first.path != second.path and first.path.is_dir() and second.path.is_dir()


def test_a_new_run_under_a_bad_out_is_refused_before_anything_is_made(tmp_path):
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(UserError, match=r"^--out .*a_file is a file, not a directory$"):
        RunDirectory.new(tmp_path / "a_file" / "runs", "image_classification", "tiny")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


# ----------------------------------------------------------------------------- the one check


def bad_outputs(tmp_path) -> dict[str, tuple[Path, str]]:
    """An output path of each kind that cannot be written, and what its refusal says."""
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    return {
        "a file": (tmp_path / "a_file", "exists and is not a directory"),
        "under a file": (tmp_path / "a_file" / "sub" / "dir", "is a file, not a directory"),
        "dangling symlink": (tmp_path / "dangling", "a symlink to nothing"),
        "name too long": (tmp_path / ("n" * 300), "too long"),
    }


@pytest.mark.parametrize("kind", ["a file", "under a file", "dangling symlink", "name too long"])
@pytest.mark.parametrize("flag", ["--out", "--pages"])
def test_an_output_directory_that_cannot_be_written_is_refused_in_one_line(tmp_path, kind, flag):
    path, reason = bad_outputs(tmp_path)[kind]
    with pytest.raises(UserError) as refused:
        check_output_directory(flag, path)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{flag} {path}: ") and reason in message


def test_an_output_directory_that_is_new_or_exists_is_accepted_as_given(tmp_path):
    for path in (tmp_path, tmp_path / "new" / "deeper"):
        assert check_output_directory("--out", str(path)) == path
    assert not (tmp_path / "new").exists()  # checking makes nothing


# ----------------------------------------------------------------------------- the layout


def test_every_path_of_a_run_lies_inside_its_directory(tmp_path):
    run = RunDirectory(tmp_path / "run")
    paths = [getattr(run, name) for name in PROPERTIES]
    paths += [run.checkpoint(3), run.worker_log(1), *map(run.worker_power_samples, (0, 2))]
    for path in paths:
        assert path.is_relative_to(run.path) and path != run.path, path
    assert run.checkpoint(3).parent == run.checkpoints and run.checkpoint(3).name == "ckpt-3"
    assert run.worker_log(1).parent == run.workers
    assert run.worker_power_samples(0) == run.power_samples
    assert run.worker_power_samples(2).parent == run.workers


def test_the_layout_is_what_a_resume_checks(tmp_path):
    """Every file a run directory holds is one `train --resume` checks the kind of, and the
    other way round: the two cannot drift apart."""
    run = RunDirectory(tmp_path)
    names = {name: getattr(run, name).relative_to(tmp_path).as_posix() for name in PROPERTIES}
    assert sorted(names.values()) == sorted(RUN_FILES)
    assert all("/" not in name for name in names.values())
    directories = {names[name] for name in ("checkpoints", "tensorboard", "workers")}
    assert {name for name, kind in RUN_FILES.items() if kind == "directory"} == directories


# ----------------------------------------------------------------------------- named once

SPELLED_ONCE = ("record.json", "state.json", "mlperf.log", "power-samples.csv")
NAMED = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, SPELLED_ONCE)) + r")(?![\w-])")
# (module relative to the package, the literal): user-facing text that must spell a name
# itself. Empty: a message takes the name from run_directory too (f"no {RECORD_FILE} in ...").
ALLOWED: set[tuple[str, str]] = set()


def documentation(tree: ast.AST) -> set[int]:
    """The ids of string constants that are statements of their own: docstrings, and strings
    used as comments."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }


def spelled_names(path: Path) -> list[tuple[int, str, str]]:
    """Each run-directory name written out in a string literal of the module (an f-string's
    fixed parts included; docstrings and comments left out): (line, name, literal)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = documentation(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            for match in NAMED.finditer(node.value):
                found.append((node.lineno, node.col_offset, match.group(1), node.value))
    return [(line, name, literal) for line, _, name, literal in sorted(found)]


def test_no_module_but_run_directory_spells_a_run_file_name():
    """Every module takes the names of a run's files from run_directory: one place to change
    them, and no module writing a file another reads under a different name."""
    spelled = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative == "run/directory.py":
            continue
        found = [
            f"line {line}: {literal!r}"
            for line, _, literal in spelled_names(path)
            if (relative, literal) not in ALLOWED
        ]
        if found:
            spelled[relative] = found
    assert spelled == {}


def test_the_spelling_check_finds_a_name_and_leaves_documentation_alone(tmp_path):
    module = tmp_path / "module.py"
    module.write_text(
        '"""Writes record.json."""\n'
        "def f(run_dir, log):\n"
        '    """Reads state.json."""\n'
        "    # mlperf.log\n"
        '    default = f"{log}.record.json"\n'
        '    return run_dir / "power-samples.csv", f"{run_dir}/mlperf.log: bad"\n'
    )
    assert spelled_names(module) == [
        (6, "power-samples.csv", "power-samples.csv"),
        (6, "mlperf.log", "/mlperf.log: bad"),
    ]
