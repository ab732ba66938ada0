"""The rows of the ranking page: each ranked submission with what a leaderboard shows of it
(submitter, source, FLOPS, Valid FLOPS per accelerator and per watt) and which of its runs
the olympic mean counted, dropped or left out as not converged. The ranking page and the
system pages both read these rows, so that a system page's mean is the ranking's own.

Every number is recomputed by `scoring` from the records; the means here are taken over the
runs the ranking's rule keeps (MLPerf's: the fastest and the slowest time dropped, a run that
did not converge being the slowest; the project's: the fastest and the slowest dropped once a
submission has levels.toml's olympic_min_runs runs), the same runs for every mean.
"""

from __future__ import annotations

import functools
import re
import statistics
from dataclasses import dataclass

from hpcai500_tf import config
from hpcai500_tf.errors import UserError
from hpcai500_tf.report.run_files import RunFiles
from hpcai500_tf.results import scoring

LEVEL = "free"
OWN = "this project's runs"
PUBLISHED_2020 = "published 2020"
COUNTED = "counted"
NOT_CONVERGED = "did not converge (counts as the slowest; dropped)"


@dataclass
class Run:
    """One run of a submission and the olympic mean's choice for it."""

    path: str
    record: dict
    score: scoring.Score | None  # None: an MLPerf run that did not converge
    choice: str  # COUNTED, "dropped: ...", NOT_CONVERGED


@dataclass
class Entry:
    """One row of the leaderboard: a ranked submission."""

    ranking: scoring.Ranking
    submission: scoring.Submission
    position: int
    runs: list[Run]
    source: str
    submitter: str | None
    rankable: bool  # every run rankable at HPC AI500's own problem (the record's verdict)
    flops: float | None = None  # the mean FLOPS over the runs counted
    per_accelerator: float | None = None
    per_watt: float | None = None  # the mean over the runs counted, all of them measured
    page: str = ""  # the system page's file name

    @property
    def counted(self) -> list[Run]:
        return [run for run in self.runs if run.choice == COUNTED]

    @property
    def accelerator(self) -> str | None:
        return self.submission.system.get("accelerator")

    @property
    def accelerators(self) -> int | None:
        count = self.submission.system.get("accelerators")
        return count if isinstance(count, int) and count > 0 else None


@functools.cache
def benchmark(name: str) -> config.Benchmark:
    return config.load_benchmark(name)


def source_of(record: dict) -> str:
    """Where a record comes from: an MLPerf round, the published 2020 table, or this project."""
    identity = scoring.mlperf_result(record)
    if identity is not None:
        return f"MLPerf Training v{identity.get('round') or '?'}"
    if "published" in record["config"]:
        return PUBLISHED_2020
    return OWN


def _submitter(record: dict) -> str | None:
    identity = scoring.mlperf_result(record)
    if identity is not None:
        return identity.get("submitter")
    if "published" in record["config"]:
        return record["layers"]["L1"].get("summary")
    return None


def olympic_choices(submission: scoring.Submission) -> dict[str, str]:
    """Each run's part in the submission's mean, by path, as the ranking's rule chose."""
    scores = dict(zip(submission.paths, submission.scores, strict=True))
    choices = {path: COUNTED for path in submission.paths}
    choices.update(dict.fromkeys(submission.not_converged, NOT_CONVERGED))
    by_time = sorted(submission.paths, key=lambda path: scores[path].time_to_quality_s)
    for path in submission.dropped:  # both rules drop by time-to-quality
        if path in scores:
            fastest = path == by_time[0]
            choices[path] = "dropped: the fastest" if fastest else "dropped: the slowest"
    return choices


def entry(
    ranking: scoring.Ranking, position: int, submission: scoring.Submission, record_of: dict
) -> Entry:
    """The leaderboard row of one ranked submission."""
    choices = olympic_choices(submission)
    scores = dict(zip(submission.paths, submission.scores, strict=True))
    runs = [
        Run(path, record_of[path], scores.get(path), choices[path])
        for path in submission.paths + submission.not_converged
    ]
    first = record_of[submission.paths[0]]
    row = Entry(
        ranking, submission, position, runs, source_of(first), _submitter(first),
        all(run.record["rankable"] for run in runs),
    )  # fmt: skip
    counted = [run.score for run in row.counted]
    row.flops = statistics.fmean(s.flops for s in counted) if counted else None
    if row.accelerators:
        row.per_accelerator = submission.valid_flops / row.accelerators
    watts = [s.valid_flops_per_watt for s in counted]
    if counted and all(w is not None for w in watts):
        row.per_watt = statistics.fmean(watts)
    return row


def collect(runs: list[RunFiles]) -> tuple[list[list[Entry]], list[tuple[str, list[str]]]]:
    """The rankings to show, as rows, one list per ranking: each benchmark's at the stated
    convention, and beside it the published 2020 table's reading where that ranks runs the
    stated one refuses (MLPerf results); and the refused runs with the rules they break."""
    own = {run.argument: run.record for run in runs if run.record is not None}
    refused = [(run.argument, run.notes("record")) for run in runs if run.record is None]
    groups: dict[str, list[tuple[str, dict]]] = {}
    for path, record in own.items():
        groups.setdefault(record["benchmark"], []).append((path, record))
    rankings = []
    for _, records in sorted(groups.items()):
        try:
            (ranking,) = scoring.rank_records(records, None, LEVEL)
        except UserError as error:
            refused += [(path, [str(error)]) for path, _ in records]
            continue
        rankings.append(ranking)
        refused += ranking.refused
        beside = _published_reading(records, ranking)
        if beside is not None:
            rankings.append(beside)
            shown = {path for path, _ in refused}
            refused += [
                (path, [f"{beside.convention}: {reason}" for reason in reasons])
                for path, reasons in beside.refused
                if path in own and path not in shown
            ]
    record_of = dict(own)
    if any(ranking.convention == scoring.PUBLISHED for ranking in rankings):
        record_of.update(scoring.published_records())
    rows = [
        [
            entry(ranking, position, s, record_of)
            for position, s in enumerate(ranking.submissions, 1)
        ]
        for ranking in rankings
    ]
    return rows, refused


def _published_reading(records: list[tuple[str, dict]], ranking: scoring.Ranking):
    """The ranking under the published 2020 table's conventions, where it ranks runs the
    stated one refuses; None otherwise (or where the benchmark has no such convention)."""
    if scoring.PUBLISHED not in benchmark(ranking.benchmark).conventions:
        return None
    (beside,) = scoring.rank_records(records, None, LEVEL, convention=scoring.PUBLISHED)
    refused = {path for path, _ in ranking.refused}
    placed = {p for s in beside.submissions for p in s.paths + s.not_converged}
    return beside if placed & refused else None


def system_page_names(rows: list[list[Entry]], taken: set[str]) -> None:
    """Give each row its system page's file name: safe characters, unique among `taken`."""
    for ranking_rows in rows:
        for row in ranking_rows:
            label = (
                f"system-{row.ranking.benchmark}-{row.ranking.convention}-{row.submission.label}"
            )
            stem = re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip(".-")[:120]
            name, number = f"{stem}.html", 1
            while name in taken:
                number += 1
                name = f"{stem}-{number}.html"
            taken.add(name)
            row.page = name
