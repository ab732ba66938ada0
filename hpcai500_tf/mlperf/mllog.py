""":::MLLOG lines in MLPerf's format beside the record, so MLPerf tooling can read a run.

Each line is `:::MLLOG {json}` with namespace, time_ms, event_type, key, value, metadata.
Written and flushed line by line: a crashed run still leaves its log up to the crash.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Any

from hpcai500_tf.files import naming, open_for_append

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
            "metadata": {"file": "hpcai500_tf/run/lifecycle.py", "lineno": 0, **(metadata or {})},
        }
        try:
            self._file.write(":::MLLOG " + json.dumps(line) + "\n")
            self._file.flush()
        except OSError as error:  # a full disk: the log's path in the one line it becomes
            raise naming(error, self.path) from None

    # What MLPerf's logger calls its three kinds of line.
    event = functools.partialmethod(_emit, "POINT_IN_TIME")
    start = functools.partialmethod(_emit, "INTERVAL_START")
    end = functools.partialmethod(_emit, "INTERVAL_END")

    def close(self) -> None:
        if self._file is not None:
            handle, self._file = self._file, None
            try:
                handle.close()
            except OSError as error:
                raise naming(error, self.path) from None
