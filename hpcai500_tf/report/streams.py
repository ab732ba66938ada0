"""A run outlives its console: `train ... | head -3`, a closed terminal, a log reader that exits.

`keep_console()` puts `ConsoleStream`s in place of sys.stdout and sys.stderr. The first write
or flush to one that fails (a reader gone: BrokenPipeError; a hung-up terminal: EIO; any
OSError) points its file descriptor at os.devnull, so that what follows (rich's live view,
TensorFlow's and torch's C++ logs on fd 2, the child processes started later, Python's flush
at exit) goes nowhere instead of failing, and the stream is marked lost: `lost_warnings()`
gives the record's words for it (`LostStreams`, the run's observer). SIGPIPE stays ignored,
as Python sets it, so a closed pipe is an error on the write, never the end of the process.

Pure Python; imports neither rich nor a framework.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

from hpcai500_tf.run.observers import Observer

STREAMS = ("stdout", "stderr")


class ConsoleStream:
    """A text stream whose first failed write or flush ends its output, not the process."""

    def __init__(self, stream, name: str):
        self._stream = stream
        self.name = name
        self.lost: str | None = None  # what the failed write raised, and when

    def write(self, text: str) -> int:
        if self.lost is None:
            try:
                return self._stream.write(text)
            except OSError as error:
                self._lose(error)
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.lost is None:
            try:
                self._stream.flush()
            except OSError as error:
                self._lose(error)

    def __getattr__(self, name: str):  # fileno, isatty, encoding, buffer, ...
        return getattr(self._stream, name)

    def _lose(self, error: OSError) -> None:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.lost = f"{error.__class__.__name__}: {error.strerror or error} at {when}"
        with contextlib.suppress(OSError, ValueError):  # no descriptor (a test's capture)
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self._stream.fileno())
            finally:
                os.close(null)
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()  # what the failed write left buffered goes to os.devnull


def keep_console() -> None:
    """sys.stdout and sys.stderr as `ConsoleStream`s (once; a stream already one is kept)."""
    for name in STREAMS:
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, ConsoleStream):
            setattr(sys, name, ConsoleStream(stream, name))
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)


def _installed(stream) -> ConsoleStream | None:
    """The `ConsoleStream` behind sys.stdout or sys.stderr, also under rich's live view (which
    replaces them on a terminal with proxies naming the file they wrap)."""
    for _ in range(4):
        if stream is None or isinstance(stream, ConsoleStream):
            return stream
        stream = getattr(stream, "rich_proxied_file", None)
    return None


def lost_warnings() -> list[str]:
    """The record's warnings for the console streams lost so far in this process."""
    warnings = []
    for name in STREAMS:
        stream = _installed(getattr(sys, name))
        if stream is not None and stream.lost:
            warnings.append(
                f"the console's {name} went away during the run ({stream.lost}): the run went "
                f"on to its record; what it wrote to {name} after that was discarded"
            )
    return warnings


class LostStreams(Observer):
    """The run's observer that puts `lost_warnings()` in its record."""

    def on_record(self, artifacts: dict, warnings: list[str]) -> None:
        warnings += lost_warnings()
