"""Every kind of path a user may name, on every reader and output of the CLI: one line and
exit 2, never a traceback, a hang or a half-written file (checked before TensorFlow starts)."""

import os

import pytest

from hpcai500_tf.cli import main

READERS = [
    ["score", "{}"],
    ["rank", "{}"],
    ["compare", "{}", "{}"],
    ["scaling", "{}"],
    ["import-mlperf", "{}"],
    ["power", "--seconds", "0.1", "--meter-log", "{}"],
    ["roofline", "--record", "{}"],
    ["report", "{}", "--out", "{out}"],
    ["train", "--config", "{}"],
    ["train", "--resume", "{}"],
]
OUTPUTS = [
    ["train", "image_classification", "--preset", "tiny", "--out", "{}"],
    ["report", "{record}", "--out", "{}"],
    ["scaling", "{record}", "--out", "{}"],
]


def path_kinds(tmp_path) -> dict[str, str]:
    """A path of each hostile kind."""
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "a_dir").mkdir()
    os.mkfifo(tmp_path / "a_fifo")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    return {
        "directory": str(tmp_path / "a_dir"),
        "empty": "",
        "root": "/",
        "special file": "/proc/self/mem",
        "fifo": str(tmp_path / "a_fifo"),
        "name too long": str(tmp_path / ("n" * 300)),
        "path too long": "/".join([str(tmp_path)] + ["d" * 200] * 30),
        "symlink loop": str(tmp_path / "loop"),
        "dangling symlink": str(tmp_path / "dangling"),
        "under a file": str(tmp_path / "a_file" / "sub"),
    }


KIND_NAMES = ["directory", "empty", "root", "special file", "fifo", "name too long",
              "path too long", "symlink loop", "dangling symlink", "under a file"]  # fmt: skip


# A directory is what report takes (its page says what the run lacks): not a bad input there.
READER_CASES = [
    pytest.param(command, kind, id=f"{' '.join(command[:2])}-{kind}")
    for command in READERS
    for kind in KIND_NAMES
    if not (command[0] == "report" and kind in ("directory", "empty", "root"))
]


@pytest.mark.parametrize("command, kind", READER_CASES)
def test_every_reader_refuses_every_path_kind_in_one_line(command, kind, tmp_path, capsys):
    path = path_kinds(tmp_path)[kind]
    argv = [a.format(path, out=tmp_path / "pages") for a in command]
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("hpcai500-tf: error:"), err


@pytest.mark.parametrize("kind", ["name too long", "path too long", "dangling symlink",
                                  "under a file", "symlink loop"])  # fmt: skip
@pytest.mark.parametrize("command", OUTPUTS, ids=lambda c: " ".join(c[:2]))
def test_every_output_refuses_a_path_it_cannot_write_in_one_line(
    command, kind, tmp_path, published_record, capsys
):
    import json

    record = tmp_path / "record.json"
    record.write_text(json.dumps(published_record))
    path = path_kinds(tmp_path)[kind]
    argv = [a.format(path, record=record) for a in command]
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("hpcai500-tf: error:"), err
