""":::MLLOG lines in MLPerf's format beside the record, so MLPerf tooling can read a run.

Each line is `:::MLLOG {json}` with namespace, time_ms, event_type, key, value, metadata.
Written and flushed line by line: a crashed run still leaves its log up to the crash.
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path
from typing import Any, TextIO

from hpcai500_tf.errors import UserError

# This project's benchmark names and MLPerf's `submission_benchmark` for the same problem;
# a benchmark MLPerf does not have keeps its own name in both directions.
MLPERF_BENCHMARK_NAMES = {"image_classification": "resnet"}


def mlperf_benchmark_name(benchmark: str) -> str:
    """MLPerf's name for one of this project's benchmarks (the log's submission_benchmark)."""
    return MLPERF_BENCHMARK_NAMES.get(benchmark, benchmark)


def benchmark_from_mlperf(name: str) -> str:
    """This project's benchmark for a log's submission_benchmark."""
    ours = {mlperf: benchmark for benchmark, mlperf in MLPERF_BENCHMARK_NAMES.items()}
    return ours.get(name, name)


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


class MLLogger:
    def __init__(self, path: Path | str | None, enabled: bool = True):
        self.path = Path(path) if path else None
        self._file = open_for_append(self.path) if (self.path and enabled) else None

    def _emit(
        self,
        event_type: str,
        key: str,
        value: Any = None,
        metadata: dict | None = None,
        time_ms: float | None = None,
    ) -> None:
        if self._file is None:
            return
        line = {
            "namespace": "",
            "time_ms": int(time_ms if time_ms is not None else time.time() * 1000),
            "event_type": event_type,
            "key": key,
            "value": value,
            "metadata": {"file": "hpcai500_tf/engine/loop.py", "lineno": 0, **(metadata or {})},
        }
        self._file.write(":::MLLOG " + json.dumps(line) + "\n")
        self._file.flush()

    # What MLPerf's logger calls its three kinds of line.
    event = functools.partialmethod(_emit, "POINT_IN_TIME")
    start = functools.partialmethod(_emit, "INTERVAL_START")
    end = functools.partialmethod(_emit, "INTERVAL_END")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
