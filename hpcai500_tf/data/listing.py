"""Facts about a data directory's files, remembered while the files stay the same.

A split's files are fingerprinted by their names and sizes; facts found by reading them (record
counts, sampled labels) are kept in DATA_DIR/.hpcai500-counts.json under the split's name with
that fingerprint, and used only while it matches. A read-only data directory keeps them in the
user cache instead ($HPCAI500_CACHE/hpcai500-tf or ~/.cache/hpcai500-tf, keyed by the
directory's absolute path); when neither can be written, they are found again next time.

Finding them is done once per job: the first worker to arrive takes an exclusive lock (flock)
on a lock file beside the cache and finds them; the others wait for it, then read the cache.
Where no lock file can be opened or locked, every worker finds them itself.

The cache and its lock are opened by files.py's one opener of regular files, never through a
symbolic link: a link, a FIFO or a device in their place is refused in one line (nothing is
read from it or written through it); a cache too large or not the JSON this module writes is
ignored, found again and replaced.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from hpcai500_tf import record as record_io
from hpcai500_tf.errors import UserError
from hpcai500_tf.files import NotRegularFile, open_lock_file, read_regular_file

CACHE_FILE = ".hpcai500-counts.json"
LOCK_WAIT_S = 1800.0  # how long a worker waits for another to find the facts
FAILED = "failed: "  # how the lock file passes a holder's error on to the workers waiting
FINGERPRINT_METHOD = "sha256 over the JSON list of the sorted [file name, size in bytes] pairs"
MAX_CACHE_BYTES = 16 << 20  # a few hundred bytes a split: far more than any real cache's
MAX_HOLDER_BYTES = 4096  # what a lock file says about its holder (or a holder's error)


def cache_dir() -> Path:
    """The user cache: $HPCAI500_CACHE or $XDG_CACHE_HOME, else ~/.cache, + hpcai500-tf."""
    base = os.environ.get("HPCAI500_CACHE") or os.environ.get("XDG_CACHE_HOME")
    return Path(base) / "hpcai500-tf" if base else Path.home() / ".cache" / "hpcai500-tf"


def fingerprint(paths: list[Path]) -> str:
    pairs = sorted([p.name, p.stat().st_size] for p in paths)
    return hashlib.sha256(json.dumps(pairs).encode()).hexdigest()


def cache_files(data_dir: str | Path) -> list[Path]:
    """Where facts about `data_dir` are kept, in the order they are tried."""
    data_dir = Path(data_dir).resolve()
    key = hashlib.sha256(str(data_dir).encode()).hexdigest()[:16]
    return [data_dir / CACHE_FILE, cache_dir() / "data-facts" / f"{key}.json"]


def _read(path: Path) -> dict:
    """The cache at `path`, or {} where there is none, it is damaged (found again then) or a
    directory is in its place (the next place is used); one line where a link, FIFO or device
    is in its place."""
    if not os.path.lexists(path):
        return {}
    try:
        text = read_regular_file(path, "count cache", MAX_CACHE_BYTES, follow_symlinks=False)
        stored = record_io.parse_json(text, path, "count cache")
    except NotRegularFile as error:
        if path.is_dir() and not path.is_symlink():
            return {}
        raise UserError(f"{error}: remove it (it is written again)") from None
    except UserError:  # too large, unreadable, not JSON, nested too deeply
        return {}
    return stored if isinstance(stored, dict) and isinstance(stored.get("splits"), dict) else {}


def load(data_dir: str | Path, split: str, fingerprint: str) -> dict | None:
    """The facts kept for `split` if its files still have `fingerprint`."""
    for path in cache_files(data_dir):
        facts = _read(path).get("splits", {}).get(split)
        if isinstance(facts, dict) and facts.get("fingerprint") == fingerprint:
            return facts
    return None


def store(data_dir: str | Path, split: str, facts: dict) -> Path | None:
    """Keep `facts` (with their "fingerprint") for `split`; where they went, or None."""
    for path in cache_files(data_dir):
        stored = _read(path) or {"data_dir": str(Path(data_dir).resolve()), "splits": {}}
        stored["splits"][split] = facts
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            record_io.write_atomic(path, stored, overwrite=True)
            return path
        except OSError:
            continue
    return None


def lock_file(data_dir: str | Path) -> Path | None:
    """The lock file beside the cache file `store` would write (the first whose directory can
    be written and that is no directory itself), or None where there is none."""
    for path in cache_files(data_dir):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(path.parent, os.W_OK) and not path.is_dir():
            return path.with_suffix(".lock")
    return None


@contextlib.contextmanager
def finding(data_dir: str | Path) -> Iterator[None]:
    """Hold the lock beside the count cache while facts are found (load them again inside:
    another worker may have stored them meanwhile), so that one worker reads the files and
    the others wait for it. No lock where no cache can be written, the lock file cannot be
    opened or the filesystem has no flock. A UserError raised under the lock is passed on to
    the workers that waited for it."""
    path = lock_file(data_dir)
    handle = _open_lock(path) if path else None
    if handle is None:
        yield
        return
    with handle:
        waited = _lock(handle, path)
        if waited is None:  # the filesystem has no flock
            yield
            return
        if waited and (told := _said(handle)).startswith(FAILED):
            raise UserError(told.removeprefix(FAILED))
        _say(handle, f"held by pid {os.getpid()} on {socket.gethostname()}")
        try:
            yield
        except UserError as error:
            _say(handle, f"{FAILED}{error}")
            raise


def _open_lock(path: Path):
    """The lock file opened (files.open_lock_file), or None where it cannot be (the workers
    then find the facts each); one line where a link, FIFO or device is in its place."""
    try:
        return open_lock_file(path, "count cache lock")
    except NotRegularFile as error:
        raise UserError(f"{error}: remove it (it is made again)") from None
    except UserError:  # e.g. no permission
        return None


def _said(handle) -> str:
    """What the lock file says (its holder, or the holder's error), bounded."""
    try:
        return os.pread(handle.fileno(), MAX_HOLDER_BYTES, 0).decode(errors="replace").strip()
    except OSError:
        return ""


def _say(handle, text: str) -> None:
    """Replace what the lock file says with `text` (one line)."""
    data = (text[: MAX_HOLDER_BYTES - 1] + "\n").encode(errors="replace")
    with contextlib.suppress(OSError):  # saying it is a courtesy to the workers waiting
        os.ftruncate(handle.fileno(), 0)
        os.pwrite(handle.fileno(), data, 0)


def _lock(handle, path: Path) -> bool | None:
    """Take the exclusive lock, waiting up to LOCK_WAIT_S: whether it had to wait, or None
    where the filesystem cannot lock."""
    deadline = time.monotonic() + LOCK_WAIT_S
    delay, waited = 0.01, False
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return waited
        except BlockingIOError:
            waited = True
        except OSError:
            return None
        if time.monotonic() >= deadline:
            holder = _said(handle) or "another process"
            raise UserError(
                f"{path}: waited {LOCK_WAIT_S:g} s for another worker to verify the data "
                f"({holder}); it still holds this lock"
            )
        time.sleep(delay)
        delay = min(2 * delay, 1.0)
