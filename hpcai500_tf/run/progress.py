"""A run's progress: what a checkpoint carries to resume it, and the config fingerprint a
resume must match."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field


def fingerprint(config: dict) -> str:
    """What must match for --resume: the whole resolved config."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Progress:
    """Everything about a run's progress that a checkpoint must carry to resume it."""

    config_fingerprint: str
    epochs_done: int = 0
    examples: int = 0
    segments: list[dict] = field(default_factory=list)
    epochs: list[dict] = field(default_factory=list)
    curve: list[dict] = field(default_factory=list)
    init_start: float = 0.0
    run_start: float | None = None
    energy: list[list[dict]] = field(default_factory=list)  # per closed segment, per source
    checkpoints: list[dict] = field(default_factory=list)  # epoch, elapsed_s, write_s of each
    batches_done: int = 0  # batches done in epoch epochs_done + 1 (a stop mid-epoch)
    epoch_seconds_done: float = 0.0  # the training seconds those batches took

    def timed_span(self) -> tuple[float, float]:
        """(run_start, run_stop) of the timed run: its start (else the init's), and the end of
        its last segment (else now), kept after the start. The record's timeline and the
        MLPerf log's run_stop both read it."""
        start = self.run_start or self.init_start
        stop = self.segments[-1]["stop"] if self.segments else time.time()
        return start, max(stop, start + 1e-6)

    def elapsed(self, now: float | None = None, open_segment: float | None = None) -> float:
        closed = sum(s["stop"] - s["start"] for s in self.segments)
        return closed + ((now or time.time()) - open_segment if open_segment else 0.0)
