"""A system's page: one ranked submission with its nine layers as imported, the quality curve
of each of its runs on one chart, and its mean worked through, run by run, to the number the
ranking shows (the same row object: see `leaderboard`)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from hpcai500_tf import __version__
from hpcai500_tf.report import charts
from hpcai500_tf.report.console import duration, si
from hpcai500_tf.report.html_parts import (
    INDEX,
    card,
    document,
    escape,
    figure,
    layers_section,
    missing,
    section,
    table,
)
from hpcai500_tf.report.leaderboard import COUNTED, Entry, Run, benchmark


def system_page(row: Entry, page_of: dict[str, str]) -> str:
    """The whole page of one submission."""
    s = row.submission
    first = row.runs[0].record
    facts = [
        f"rank <b>{row.position}</b> of {len(row.ranking.submissions)} in "
        f"{escape(row.ranking.benchmark)} ({escape(row.ranking.convention)})",
        escape(row.source),
    ]
    if row.submitter:
        facts.append(f"submitter {escape(row.submitter)}")
    imported = "MLPerf" in row.source
    layers_title = (
        "The nine layers as imported (L1-L5 from the system description, L6-L9 from the log)"
        if imported
        else "The nine layers (of its first run)"
    )
    body = [
        f'<nav><a href="{INDEX}">&larr; ranking</a></nav>\n<h1>{escape(s.label)}</h1>\n',
        f'<p class="meta">{" &middot; ".join(facts)}</p>\n',
        _score(row),
        _mean_section(row, page_of),
        _curves_section(row),
        layers_section(first, layers_title),
        f"<footer><p>Written by hpcai500-tf {escape(__version__)}; every score recomputed "
        "from the records.</p></footer>",
    ]
    return document(f"HPC AI500 system: {s.label}", "".join(body))


def _score(row: Entry) -> str:
    s = row.submission
    rows = [
        ("Valid FLOPS", f'<span class="headline">{si(s.valid_flops, "FLOPS")}</span>'),
        ("FLOPS", si(row.flops, "FLOPS")),
        ("Time to quality", duration(s.time_to_quality_s)),
        ("Quality", f"{s.quality:.4f}"),
        ("Valid FLOPS per accelerator", si(row.per_accelerator, "FLOPS")),
        ("Valid FLOPS per watt", si(row.per_watt, "FLOPS/W") if row.per_watt else "not measured"),
        ("Rankable at HPC AI500's problem", "yes" if row.rankable else "no"),
    ]
    rows += [(key.capitalize(), escape(value)) for key, value in s.system.items() if value]
    notes = "".join(f'<p class="flags">{escape(note)}</p>' for note in s.notes)
    return section("score", "Score", card(rows), notes)


def _run_name(run: Run, page_of: dict[str, str]) -> str:
    name = escape(Path(run.path).stem)
    return f'<a href="{escape(page_of[run.path])}">{name}</a>' if run.path in page_of else name


def _mean_section(row: Entry, page_of: dict[str, str]) -> str:
    """Every run with its score and its part in the mean; the sums the mean is."""
    s = row.submission
    mlperf = s.rule == "mlperf"
    order = sorted(
        row.runs,
        key=lambda run: (
            math.inf
            if run.score is None
            else run.score.time_to_quality_s
            if mlperf
            else run.score.valid_flops
        ),
    )
    cells = []
    for run in order:
        x = run.score
        cells.append([
            _run_name(run, page_of), escape(run.record["status"]),
            "-" if x is None else duration(x.time_to_quality_s),
            "-" if x is None else f"{x.quality:.4f}",
            "-" if x is None else f"{x.quality_factor:.4f}",
            "-" if x is None else si(x.valid_flops, "FLOPS"),
            escape(run.choice),
        ])  # fmt: skip
    head = ["Run", "Status", "Time to quality", "Quality", "Quality factor", "Valid FLOPS",
            "In the mean"]  # fmt: skip
    counted = [run.score for run in row.counted]
    mean = statistics.fmean(x.valid_flops for x in counted)
    terms = " + ".join(si(x.valid_flops, "FLOPS") for x in counted)
    rule = (
        "MLPerf's rule: the runs sorted by time, the fastest and the slowest dropped, a run that "
        "did not converge counting as the slowest (at most one may)"
        if mlperf
        else "the project's rule (levels.toml): the runs sorted by time, the fastest and the "
        "slowest dropped once there are enough runs; the time to quality and the quality are "
        "the means of the same runs"
    )
    worked = (
        f"<p>{escape(rule)}.</p><p>Valid FLOPS = ({terms}) / {len(counted)} = "
        f'<b id="olympic-mean" data-value="{mean!r}">{si(mean, "FLOPS")}</b>; '
        f"the ranking's: {si(s.valid_flops, 'FLOPS')}.</p>"
    )
    if mlperf:
        times = " + ".join(f"{x.time_to_quality_s:.1f} s" for x in counted)
        worked += f"<p>Time to quality = ({times}) / {len(counted)} = "
        worked += f"{duration(s.time_to_quality_s)}.</p>"
    return section("mean", "The mean, worked through", table(head, cells, "words"), worked)


def _curves_section(row: Entry) -> str:
    runs = [
        (Path(run.path).stem + ("" if run.choice == COUNTED else " (left out)"),
         [(p["elapsed_s"], p["value"]) for p in run.record["quality"]["curve"]],
         run.choice == COUNTED)
        for run in row.runs
    ]  # fmt: skip
    drawn = [run for run in runs if run[1]]
    if not drawn:
        note = "quality curves: the records hold no evaluations (a published table's entry)"
        return section("runs", "The runs' quality curves", missing([note]))
    quality = row.runs[0].record["quality"]
    metric = benchmark(row.ranking.benchmark).quality_metric
    svg = charts.runs_chart(drawn, quality["target"], metric)
    caption = (
        f"{len(drawn)} run(s) on one chart; dashed: runs the mean leaves out; the red line "
        f"is the run's target ({quality['target']:g})."
    )
    return section("runs", "The runs' quality curves", figure(svg, escape(caption)))
