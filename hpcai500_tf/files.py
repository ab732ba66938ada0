"""Reading the files a user names (records, logs, sidecars, meter logs, configs, a run
directory's files, caches), opening lock files and appending to logs: a leaf module, imported
by every reader and writer, importing nothing of the project's but its error type."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import BinaryIO, TextIO

from hpcai500_tf.errors import UserError

MAX_FILE_BYTES = 1 << 30  # records, logs and sidecars larger than this are refused
SHARD_NAME = re.compile(r"(?P<stem>.+)-(?P<index>[0-9]+)-of-(?P<total>[0-9]+)")


class NotRegularFile(UserError):
    """A path that names a symbolic link (where none is followed), a FIFO, a device or a
    directory where a regular file belongs."""


def open_regular_file(
    path: Path | str, what: str, max_bytes: int = MAX_FILE_BYTES, *, follow_symlinks: bool = True
) -> BinaryIO:
    """A binary handle on a regular file of at most `max_bytes`, its kind checked before
    anything is read; one line naming the file otherwise (a FIFO, a device, a directory, a
    symlink loop, a name too long, a file too large; with `follow_symlinks` False, a symbolic
    link)."""
    fd = _open_regular(path, what, os.O_RDONLY, follow_symlinks)
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise UserError(f"{path}: {size} bytes, larger than a {what} can be")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_lock_file(path: Path | str, what: str) -> BinaryIO:
    """A lock file opened for reading and writing (created where it is missing), never
    through a symbolic link and only where it is a regular file: what is written into a lock
    (its holder) never reaches a file of the user's, and a FIFO or a device is one line."""
    fd = _open_regular(path, what, os.O_RDWR | os.O_CREAT, follow_symlinks=False)
    try:
        return os.fdopen(fd, "r+b", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def _open_regular(path: Path | str, what: str, flags: int, follow_symlinks: bool) -> int:
    """The one opener of the files above: O_NONBLOCK so that a FIFO does not block the open,
    O_NOFOLLOW where no link is followed, then the kind of file from fstat (of the file that
    was opened, not of a name that may have changed since)."""
    flags |= os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, 0o666)
    except FileNotFoundError:
        raise UserError(f"{path}: no such {what}") from None
    except OSError as error:
        if not follow_symlinks and os.path.islink(path):  # ELOOP, as O_NOFOLLOW reports it
            raise NotRegularFile(
                f"{path}: is a symbolic link; a {what} is never read or written through one"
            ) from None
        raise UserError(f"{path}: cannot open {what} ({error.strerror or error})") from None
    try:
        mode = os.fstat(fd).st_mode  # the kind first: fdopen refuses a directory by raising
        if not stat.S_ISREG(mode):
            raise NotRegularFile(f"{path}: not a regular file; a {what} must be one")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular_file(
    path: Path | str, what: str, max_bytes: int = MAX_FILE_BYTES, *, follow_symlinks: bool = True
) -> str:
    """The text of a regular file of at most `max_bytes` (see `open_regular_file`)."""
    path = Path(path)
    with open_regular_file(path, what, max_bytes, follow_symlinks=follow_symlinks) as handle:
        try:
            data = handle.read(max_bytes + 1)
        except OSError as error:  # e.g. EIO from a special file that passes as regular
            raise UserError(f"{path}: cannot read {what} ({error.strerror or error})") from None
    if len(data) > max_bytes:
        raise UserError(f"{path}: larger than a {what} can be")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text; a {what} is") from None


def open_for_append(path: Path | str) -> TextIO:
    """A log opened for appending (created with the umask's mode), never through a symbolic
    link planted at `path`: one line (UserError) instead."""
    if os.path.islink(path):
        raise UserError(f"{path}: is a symbolic link; refusing to write a log through it")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o666)
    except OSError as error:
        raise UserError(f"{path}: cannot open the log for writing ({error.strerror})") from None
    return os.fdopen(fd, "a")


def naming(error: OSError, path: Path | str) -> OSError:
    """The error of a write (a full disk's has no file name) as one that names `path`, what
    the one line it becomes shows (run/status.classify_failure)."""
    return OSError(error.errno, error.strerror, str(path))


def check_output_directory(flag: str, path: Path | str) -> Path:
    """An output directory's path, checked before any work is done: refused, in one line
    naming `flag`, where a file holds it or a folder above it, where it is a dangling symbolic
    link (or a loop of them), or where the name is too long. It need not exist yet."""
    out = Path(path)
    try:
        if out.is_symlink() and not out.exists():
            raise UserError(f"{flag} {path}: a symlink to nothing (or a loop of symlinks)")
        if out.exists() and not out.is_dir():
            raise UserError(f"{flag} {path}: exists and is not a directory")
        existing = next(p for p in (out, *out.absolute().parents) if p.exists())
        if not existing.is_dir():
            raise UserError(f"{flag} {path}: {existing} is a file, not a directory")
    except OSError as error:  # e.g. a name too long
        raise UserError(f"{flag} {path}: {error.strerror}") from None
    return out


def shard_set_problem(names: list[str]) -> str | None:
    """Why file names of the form STEM-I-of-N (TensorFlow's sharded files: TFRecord shards,
    checkpoint data) are not one whole set: "missing NAME" (the first one missing), "shards of
    different sets" (two totals or two stems) or one numbered past its total; None for a whole
    set. Names not of that form are not judged."""
    shards = [m for m in map(SHARD_NAME.fullmatch, names) if m]
    sets = {(m["stem"], m["total"]) for m in shards}
    if len(sets) > 1:
        return "shards of different sets"
    if not sets:
        return None
    stem, total = sets.pop()
    if beyond := [m.string for m in shards if int(m["index"]) >= int(total)]:
        return f"{beyond[0]} numbered beyond its set of {int(total)}"
    present = {int(m["index"]) for m in shards}
    missing = [i for i in range(int(total)) if i not in present]
    if missing:
        return f"missing {stem}-{missing[0]:0{len(total)}d}-of-{total}"
    return None
