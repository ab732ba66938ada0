"""Reading the files a user names (records, logs, sidecars, meter logs, configs, a run
directory's files) and appending to logs: a leaf module, imported by every reader and writer,
importing nothing of the project's but its error type."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO, TextIO

from hpcai500_tf.errors import UserError

MAX_FILE_BYTES = 1 << 30  # records, logs and sidecars larger than this are refused


def open_regular_file(path: Path | str, what: str, max_bytes: int = MAX_FILE_BYTES) -> BinaryIO:
    """A binary handle on a regular file of at most `max_bytes`, its kind checked before
    anything is read; one line naming the file otherwise (a FIFO, a device, a directory, a
    symlink loop, a name too long, a file too large)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
    except FileNotFoundError:
        raise UserError(f"{path}: no such {what}") from None
    except OSError as error:
        raise UserError(f"{path}: cannot open {what} ({error.strerror or error})") from None
    try:
        info = os.fstat(fd)  # the kind of file first: fdopen refuses a directory by raising
        if not stat.S_ISREG(info.st_mode):
            raise UserError(f"{path}: not a regular file; a {what} must be one")
        if info.st_size > max_bytes:
            raise UserError(f"{path}: {info.st_size} bytes, larger than a {what} can be")
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    return handle


def read_regular_file(path: Path | str, what: str, max_bytes: int = MAX_FILE_BYTES) -> str:
    """The text of a regular file of at most `max_bytes` (see `open_regular_file`)."""
    path = Path(path)
    with open_regular_file(path, what, max_bytes) as handle:
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
