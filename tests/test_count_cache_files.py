"""The count cache (DATA/.hpcai500-counts.json) and its lock are opened by files.py's one
opener of regular files and never followed through a symbolic link: a link, a FIFO or a device
in their place is one line, with nothing read from it or written through it; a cache too large
or too deeply nested is ignored and replaced, never a hang, a huge read or a traceback."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcai500_tf.data import listing
from hpcai500_tf.errors import UserError
from hpcai500_tf.files import NotRegularFile, open_lock_file, read_regular_file

ROOT = Path(__file__).resolve().parents[1]
FACTS = {"fingerprint": "f" * 64, "records": 12}


@pytest.fixture(autouse=True)
def _user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCAI500_CACHE", str(tmp_path / "user-cache"))


@pytest.fixture
def data(tmp_path):
    directory = tmp_path / "data"
    directory.mkdir()
    return directory


@pytest.fixture
def notes(tmp_path):
    """A file of the user's, which a link in the data directory points at."""
    path = tmp_path / "notes"
    path.write_text("my notes\n")
    return path


def _refused_in_one_line(call) -> str:
    with pytest.raises(UserError) as refused:
        call()
    message = str(refused.value)
    assert "\n" not in message and message, message
    return message


def _in_a_process(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`code` run by a fresh Python under a 1 GiB address-space cap, within `timeout`."""
    capped = f"import resource; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n{code}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", capped], capture_output=True, text=True, timeout=timeout, env=env
    )


# ----------------------------------------------------------------------------- the lock


def test_a_lock_linked_to_a_users_file_is_refused_and_the_file_left_as_it_was(data, notes):
    (data / ".hpcai500-counts.lock").symlink_to(notes)
    with_lock = listing.finding(data)
    message = _refused_in_one_line(with_lock.__enter__)
    assert message == (
        f"{data / '.hpcai500-counts.lock'}: is a symbolic link; a count cache lock is never "
        "read or written through one: remove it (it is made again)"
    )
    assert notes.read_text() == "my notes\n"


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo", "dangling"])
def test_a_lock_that_is_a_device_fifo_or_dangling_link_is_one_line(data, tmp_path, kind):
    lock = data / ".hpcai500-counts.lock"
    if kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.symlink_to(tmp_path / "nowhere" if kind == "dangling" else kind)
    started = time.monotonic()
    message = _refused_in_one_line(listing.finding(data).__enter__)
    assert message.startswith(f"{lock}: ") and message.endswith("remove it (it is made again)")
    assert time.monotonic() - started < 5
    assert not (tmp_path / "nowhere").exists()  # a dangling link is never created through


def test_the_lock_says_who_holds_it_in_a_regular_file(data):
    with listing.finding(data):
        said = (data / ".hpcai500-counts.lock").read_text()
    assert said == f"held by pid {os.getpid()} on {socket.gethostname()}\n"


# ----------------------------------------------------------------------------- the cache


def test_a_cache_linked_to_a_users_file_is_refused_and_the_file_left_as_it_was(data, notes):
    notes.write_text(json.dumps({"splits": {"train": FACTS}}))  # even a cache-like one
    (data / ".hpcai500-counts.json").symlink_to(notes)
    kept = notes.read_text()
    for call in (
        lambda: listing.load(data, "train", FACTS["fingerprint"]),
        lambda: listing.store(data, "train", FACTS),
    ):
        message = _refused_in_one_line(call)
        assert message == (
            f"{data / '.hpcai500-counts.json'}: is a symbolic link; a count cache is never "
            "read or written through one: remove it (it is written again)"
        )
    assert notes.read_text() == kept and (data / ".hpcai500-counts.json").is_symlink()


def test_a_cache_that_is_a_fifo_is_refused_without_waiting_for_a_writer(data):
    os.mkfifo(data / ".hpcai500-counts.json")
    done = _in_a_process(
        "from hpcai500_tf.data import listing\n"
        f"try:\n    listing.load({str(data)!r}, 'train', 'x')\n"
        "except Exception as error:\n    print(type(error).__name__, error)",
        timeout=30,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout == (
        f"UserError {data / '.hpcai500-counts.json'}: not a regular file; a count cache must "
        "be one: remove it (it is written again)\n"
    )


def test_a_cache_linked_to_dev_zero_is_refused_without_reading_it(data):
    (data / ".hpcai500-counts.json").symlink_to("/dev/zero")
    started = time.monotonic()
    done = _in_a_process(
        "from hpcai500_tf.data import listing\n"
        f"try:\n    listing.load({str(data)!r}, 'train', 'x')\n"
        "except Exception as error:\n    print(type(error).__name__, error)",
        timeout=30,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.startswith("UserError ") and "symbolic link" in done.stdout
    assert time.monotonic() - started < 30


@pytest.mark.parametrize(
    "text",
    [
        "[" * 200_000 + "]" * 200_000,  # deeper than Python's parser goes
        '{"splits": ' * 100_000 + "{}" + "}" * 100_000,
        "not json",
        json.dumps({"splits": {}}) + " " * (listing.MAX_CACHE_BYTES + 1),  # too large
        "\udcff",  # not UTF-8 once written
    ],
    ids=["deep-list", "deep-object", "not-json", "too-large", "not-utf8"],
)
def test_a_damaged_cache_is_ignored_and_replaced(data, text):
    cache = data / ".hpcai500-counts.json"
    cache.write_bytes(text.encode(errors="surrogateescape"))
    assert listing.load(data, "train", FACTS["fingerprint"]) is None
    assert listing.store(data, "train", FACTS) == cache
    assert listing.load(data, "train", FACTS["fingerprint"]) == FACTS


# ----------------------------------------------------------------------------- the opener


def test_the_one_opener_refuses_links_only_where_asked(tmp_path, notes):
    link = tmp_path / "link"
    link.symlink_to(notes)
    assert read_regular_file(link, "note") == "my notes\n"  # a record may be a link
    with pytest.raises(NotRegularFile, match="is a symbolic link"):
        read_regular_file(link, "note", follow_symlinks=False)
    with pytest.raises(NotRegularFile, match="is a symbolic link"):
        open_lock_file(link, "lock")
    assert notes.read_text() == "my notes\n"
    with open_lock_file(tmp_path / "new.lock", "lock") as handle:  # made where missing
        handle.write(b"x")
    assert (tmp_path / "new.lock").read_bytes() == b"x"


# ----------------------------------------------------------------------------- train


@pytest.mark.slow
def test_train_with_a_lock_linked_to_a_users_file_is_one_line_and_leaves_it(tmp_path, notes):
    from .test_data import IMAGENET_FIXTURE_SETTINGS
    from .test_dataset_verification import _write_split

    data = _write_split(tmp_path / "data", "train", [[1, 2, 3, 1]])
    _write_split(data, "validation", [[1, 2]])
    (data / ".hpcai500-counts.lock").symlink_to(notes)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HPCAI500_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "hpcai500_tf.cli", "train", "image_classification",
         "--preset", "tiny", "--data", str(data), "--out", str(tmp_path / "runs"),
         "--power-hz", "0", *(f"--set={one}" for one in IMAGENET_FIXTURE_SETTINGS)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("hpcai500-tf:")]
    assert errors == [
        f"hpcai500-tf: error: {data / '.hpcai500-counts.lock'}: is a symbolic link; a count "
        "cache lock is never read or written through one: remove it (it is made again)"
    ]
    assert notes.read_text() == "my notes\n"
