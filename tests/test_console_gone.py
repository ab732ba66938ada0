"""A run survives its console (`train ... | head -1`, a closed terminal): the first failed
write ends the output of that stream, never the run, which goes on to a completed record that
says so (hpcai500_tf/report/streams.py)."""

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcai500_tf import record
from hpcai500_tf.report import streams

TINY_RUN = ["train", "image_classification", "--preset", "tiny", "--power-hz", "0",
            "--set", "training.epochs=3"]  # fmt: skip


def _closed_pipe_stream():
    """A text stream on the write end of a pipe whose reader is gone, and its descriptor."""
    read, write = os.pipe()
    os.close(read)
    return io.TextIOWrapper(io.FileIO(write, "w"), line_buffering=True), write


@pytest.mark.parametrize("name", ["stdout", "stderr"])
def test_a_closed_pipe_ends_the_streams_output_not_the_process(name, monkeypatch):
    raw, fd = _closed_pipe_stream()
    stream = streams.ConsoleStream(raw, name)
    monkeypatch.setattr(sys, name, stream)
    print("a line nobody reads", file=sys.stdout if name == "stdout" else sys.stderr)
    assert stream.lost and stream.lost.startswith("BrokenPipeError"), stream.lost
    assert os.write(fd, b"C++ log line\n") == 13  # the descriptor is os.devnull now
    stream.write("more\n")
    stream.flush()  # nothing raised, as at exit
    (warning,) = streams.lost_warnings()
    assert f"the console's {name} went away during the run (BrokenPipeError" in warning
    raw.close()


def test_an_open_console_gives_no_warning(monkeypatch):
    monkeypatch.setattr(sys, "stdout", streams.ConsoleStream(io.StringIO(), "stdout"))
    print("read by someone")
    assert streams.lost_warnings() == []


def _train_into_head(tmp_path: Path, extra: list[str]) -> tuple[int, str, dict]:
    """`hpcai500-tf train ... | head -1`: the reader takes the first line and goes away."""
    out = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen(
        [sys.executable, "-m", "hpcai500_tf.cli", *TINY_RUN, *extra, "--out", str(out)],
        stdout=subprocess.PIPE, stderr=(tmp_path / "stderr").open("w"), env=env,
    )  # fmt: skip
    try:
        first = child.stdout.readline()
        child.stdout.close()  # as `head -1` exits
        code = child.wait(300)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
    assert first, "no first line"
    (path,) = out.glob("*/record.json")
    return code, (tmp_path / "stderr").read_text(), record.load(path)


@pytest.mark.slow  # ~15 s alone on 2 cores
def test_train_into_head_ends_in_a_completed_record(tmp_path):
    code, err, rec = _train_into_head(tmp_path, [])
    assert code == 0, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert rec["status"] == "completed", rec["warnings"]
    assert any(w.startswith("the console's stdout went away") for w in rec["warnings"])
    assert (Path(rec["artifacts"]["run_dir"]) / "state.json").is_file()


@pytest.mark.slow  # ~30 s alone on 2 cores
def test_two_workers_into_head_end_in_a_completed_record(tmp_path):
    code, err, rec = _train_into_head(tmp_path, ["--workers", "2"])
    assert code == 0, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert rec["status"] == "completed", rec["warnings"]
    assert any(w.startswith("the console's stdout went away") for w in rec["warnings"])
