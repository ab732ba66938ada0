"""A disk that fills up mid-run: one line naming the file that could not be written and a
non-zero exit, never a traceback; the failed checkpoint's unfinished files are not left to
fill it further. The disk is a real one: a small tmpfs in a mount namespace of the test's own."""

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpcai500_tf import record as record_io


def _can_mount() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    probe = ["unshare", "--mount", "--propagation", "private", "true"]
    return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0


needs_mount = pytest.mark.skipif(
    not _can_mount(), reason="needs root and unshare for a small tmpfs of the test's own"
)


def _train_on_a_disk_of(size: str, disk: Path) -> subprocess.CompletedProcess:
    """A tiny one-epoch run whose --out is a tmpfs of `size`, mounted at `disk` for it alone;
    what it wrote there is copied to DISK-kept before the mount goes."""
    disk.mkdir()
    train = [
        sys.executable, "-m", "hpcai500_tf.cli", "train", "image_classification",
        "--preset", "tiny", "--set", "training.epochs=1", "--power-hz", "0",
        "--out", str(disk / "runs"),
    ]  # fmt: skip
    script = (
        f'mount -t tmpfs -o size={size} tmpfs "$1" || exit 99; disk=$1; shift; "$@"; '
        'code=$?; cp -r "$disk" "$disk-kept"; exit $code'
    )
    command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
    return subprocess.run(
        [*command, str(disk), *train], capture_output=True, text=True, timeout=300
    )


@needs_mount
def test_a_checkpoint_that_does_not_fit_fails_the_run_naming_it(tmp_path):
    # 400 KiB: the config, the logs and the record fit; the ~1 MiB checkpoint does not.
    done = _train_on_a_disk_of("400k", tmp_path / "disk")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    (run_dir,) = (tmp_path / "disk-kept" / "runs").iterdir()
    failed = record_io.load(run_dir / "record.json")
    assert failed["status"] == "failed"
    (warning,) = failed["warnings"]
    prefix = tmp_path / "disk" / "runs" / run_dir.name / "checkpoints" / "ckpt-1"
    assert warning.startswith(f"the run failed: {prefix}: cannot write the checkpoint ("), warning
    assert "No space left on device; " in warning and "MiB free on its filesystem" in warning
    assert list((run_dir / "checkpoints").iterdir()) == []  # its unfinished shards removed


@needs_mount
def test_a_log_that_does_not_fit_is_one_line(tmp_path):
    # 8 KiB: the config and the lock fit, the MLPerf log's first lines do not.
    done = _train_on_a_disk_of("8k", tmp_path / "disk")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert lines[-1].startswith("hpcai500-tf: error: "), lines
    assert lines[-1].endswith("mlperf.log: No space left on device"), lines


def test_a_record_that_cannot_be_written_is_named_and_leaves_nothing(tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(record_io.os, "fsync", full)
    path = tmp_path / "record.json"
    with pytest.raises(OSError) as failed:
        record_io.write_atomic(path, {"status": "completed"})
    assert failed.value.filename == str(path) and failed.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []  # no half record, no temp file
    record_io.write_atomic(path, {"status": "completed"})
    assert json.loads(path.read_text())["status"] == "completed"
