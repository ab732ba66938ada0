"""Every one-line error is printed as text: a path or value holding ESC, CR, a bell or a line
break reaches the terminal escaped (errors.one_line, at the one place errors are printed), so
that a hostile name can neither drive the terminal nor split the line; and data.cache_dir says
whether it is missing or not a directory."""

import pytest

from hpcai500_tf.cli import main
from hpcai500_tf.errors import UserError, one_line

HOSTILE = "x\x1b[2J\ry\x07\nz"
SHOWN = "x\\x1b[2J\\x0dy\\x07\\nz"


def _error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    (line,) = lines
    assert "\x1b" not in line and "\r" not in line and "\x07" not in line
    assert "Traceback" not in captured.err
    return line


def test_one_line_escapes_control_characters_and_line_breaks():
    assert one_line(HOSTILE) == SHOWN
    assert one_line("plain: text") == "plain: text"
    assert one_line(UserError("a\tb")) == "a\\tb"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["score", f"{HOSTILE}.json"], f"hpcai500-tf: error: {SHOWN}.json: no such record file"),
        (["rank", f"{HOSTILE}.json"], f"hpcai500-tf: error: {SHOWN}.json: no such record file"),
        (
            ["train", "--config", f"{HOSTILE}.toml"],
            f"hpcai500-tf: error: {SHOWN}.toml: no such config file",
        ),
        (
            ["import-mlperf", f"{HOSTILE}.log"],
            f"hpcai500-tf: error: {SHOWN}.log: no such MLPerf log",
        ),
    ],
    ids=["score", "rank", "config", "import-mlperf"],
)
def test_a_hostile_path_in_an_error_is_printed_escaped(capsys, argv, expected):
    assert main(argv) == 2
    assert _error_line(capsys) == expected


def test_a_usage_error_with_a_hostile_value_is_printed_escaped(capsys):
    with pytest.raises(SystemExit) as ended:
        main(["train", "--framework", HOSTILE])
    assert ended.value.code == 2
    line = _error_line(capsys)
    assert line.startswith("hpcai500-tf train: error: argument --framework: invalid choice: ")
    assert "x\\x1b[2J" in line  # argparse quotes a choice with repr(); a path goes as it is
    with pytest.raises(SystemExit):
        main(["score", "--convention"])  # a missing value: nothing hostile to show
    _error_line(capsys)


def test_a_hostile_data_directory_is_printed_escaped(capsys, tmp_path):
    argv = ["train", "image_classification", "--preset", "tiny", "--set", "data.source=imagenet"]
    assert main([*argv, "--data", HOSTILE, "--out", str(tmp_path)]) == 2
    assert _error_line(capsys) == f"hpcai500-tf: error: {SHOWN}: data directory not found"


def test_data_cache_dir_says_whether_it_is_missing_or_a_file(tmp_path, capsys):
    from hpcai500_tf.data import imagenet

    where = ("train", ["train-00000-of-00001"], (0, 1))
    missing = tmp_path / HOSTILE
    with pytest.raises(UserError) as refused:
        imagenet.cache_prefix(str(missing), tmp_path, *where)
    assert str(refused.value) == f"data.cache_dir '{missing}' does not exist: make it first"
    a_file = tmp_path / "a-file"
    a_file.write_text("mine")
    with pytest.raises(UserError) as refused:
        imagenet.cache_prefix(str(a_file), tmp_path, *where)
    assert str(refused.value) == f"data.cache_dir '{a_file}' is not a directory"
    assert a_file.read_text() == "mine"
    assert one_line(f"data.cache_dir '{missing}'") == f"data.cache_dir '{tmp_path}/{SHOWN}'"
