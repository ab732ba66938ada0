"""Facts about a data directory's files, remembered while the files stay the same.

A split's files are fingerprinted by their names and sizes; facts found by reading them (record
counts, sampled labels) are kept in DATA_DIR/.hpcai500-counts.json under the split's name with
that fingerprint, and used only while it matches. A read-only data directory keeps them in the
user cache instead ($HPCAI500_CACHE/hpcai500-tf or ~/.cache/hpcai500-tf, keyed by the
directory's absolute path); when neither can be written, they are found again next time.

Finding them is done once per job: the first worker to arrive takes an exclusive lock (flock)
on a lock file beside the cache and finds them; the others wait for it, then read the cache.
Where no lock file can be opened or locked, every worker finds them itself.
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

CACHE_FILE = ".hpcai500-counts.json"
LOCK_WAIT_S = 1800.0  # how long a worker waits for another to find the facts
FAILED = "failed: "  # how the lock file passes a holder's error on to the workers waiting
FINGERPRINT_METHOD = "sha256 over the JSON list of the sorted [file name, size in bytes] pairs"


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
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
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
    try:
        handle = path.open("a+") if path else None
    except OSError:
        handle = None
    if handle is None:
        yield
        return
    with handle:
        waited = _lock(handle, path)
        if waited is None:  # the filesystem has no flock
            yield
            return
        handle.seek(0)
        if waited and (told := handle.read().strip()).startswith(FAILED):
            raise UserError(told.removeprefix(FAILED))
        handle.truncate(0)
        handle.write(f"held by pid {os.getpid()} on {socket.gethostname()}\n")
        handle.flush()
        try:
            yield
        except UserError as error:
            handle.truncate(0)
            handle.write(f"{FAILED}{error}\n")
            handle.flush()
            raise


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
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise UserError(
                f"{path}: waited {LOCK_WAIT_S:g} s for another worker to verify the data "
                f"({holder}); it still holds this lock"
            )
        time.sleep(delay)
        delay = min(2 * delay, 1.0)
