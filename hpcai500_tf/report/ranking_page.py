"""The ranking page (index.html) as a leaderboard: one row per submission, the list's metric
first and then the hardware, as TOP500 and MLPerf's tables show theirs; columns sortable and
rows filtered (benchmark, source, accelerator model, rankable) by a small inline script that
fetches nothing; the charts of the ranking below each table; the refused runs last.

No column is ever narrower than its header's longest word: nothing in the table breaks inside
a word, numbers do not wrap, and the table scrolls sideways in its own box on a narrow screen.
"""

from __future__ import annotations

from pathlib import Path

from hpcai500_tf import __version__
from hpcai500_tf.report import charts
from hpcai500_tf.report.console import duration, si
from hpcai500_tf.report.html_parts import bullets, document, escape, figure, missing, section, table
from hpcai500_tf.report.leaderboard import LEVEL, PUBLISHED_2020, Entry, benchmark
from hpcai500_tf.report.ranking_script import SCRIPT
from hpcai500_tf.results import scoring

STYLE = """
main { max-width: 1400px; padding-left: 16px; padding-right: 16px; }
@media (max-width: 600px) { main { padding: 12px 10px 30px; } }
.filters { display: flex; flex-wrap: wrap; gap: 6px 18px; margin: 0.6em 0; }
.filters label { white-space: nowrap; }
.scroll { overflow-x: auto; max-width: 100%; }
table.leaderboard { width: auto; min-width: 100%; font-size: 0.88em; }
table.leaderboard th, table.leaderboard td { overflow-wrap: normal; word-break: normal;
  hyphens: none; }
table.leaderboard th, table.leaderboard td { padding: 4px 6px; }
table.leaderboard th { vertical-align: bottom; }
table.leaderboard td:nth-child(2) { min-width: 9em; }
table.leaderboard .flag { color: #9a6700; font-size: 0.85em; white-space: nowrap; }
table.leaderboard th button { font: inherit; font-weight: 600; color: inherit; background: none;
  border: 0; padding: 0; cursor: pointer; text-align: left; }
table.leaderboard th[aria-sort=ascending] button::after { content: " \\25B2"; }
table.leaderboard th[aria-sort=descending] button::after { content: " \\25BC"; }
table.leaderboard .number { white-space: nowrap; text-align: right; }
table.leaderboard details ul { white-space: nowrap; padding-left: 1em; }
table.leaderboard summary { white-space: nowrap; cursor: pointer; }
"""
# (header, kind, first direction on a click): the columns of a row, in order
COLUMNS = [
    ("Rank", "number", "ascending"), ("System", "text", "ascending"),
    ("Submitter", "text", "ascending"), ("Accelerator", "text", "ascending"),
    ("Count", "number", "descending"), ("Nodes", "number", "descending"),
    ("Framework", "text", "ascending"), ("Valid FLOPS", "number", "descending"),
    ("FLOPS", "number", "descending"), ("Time to quality", "number", "ascending"),
    ("Quality", "number", "descending"), ("Valid FLOPS per accelerator", "number", "descending"),
    ("Valid FLOPS per watt", "number", "descending"), ("Runs", "number", "descending"),
]  # fmt: skip
FOLDED = 20  # more refused runs than this: their list is folded (an MLPerf round's are all)
FILTERS = [("benchmark", "Benchmark"), ("source", "Round or source"),
           ("accelerator", "Accelerator model"), ("rankable", "Rankable")]  # fmt: skip


def index_page(rows: list[list[Entry]], refused: list, page_of: dict[str, str]) -> str:
    """The whole ranking page: filters, a leaderboard and its charts per ranking, the
    refused runs."""
    entries = [row for ranking_rows in rows for row in ranking_rows]
    parts = [
        f"<h1>HPC AI500 V2.0 ranking: {len(entries)} submission(s)</h1>\n",
        _filters(entries) if entries else "",
    ]
    for ranking_rows in rows:
        parts.append(_ranking_section(ranking_rows, page_of))
    if refused:
        cells = [[_run_link(path, page_of), bullets(why)] for path, why in refused]
        listed = table(["Run", "Rule broken"], cells)
        if len(refused) > FOLDED:
            listed = f"<details><summary>{len(refused)} refused runs</summary>{listed}</details>"
        parts.append(section("refused", "Refused runs", listed))
    parts.append(
        f"<footer><p>Written by hpcai500-tf {escape(__version__)}. Ranked at the {LEVEL} level "
        "by Valid FLOPS = FLOPS x (quality / target)<sup>n</sup>, recomputed from each record; "
        "runs equal on all nine layers but the seed, and the results of one MLPerf system, are "
        "one submission. FLOPS, and Valid FLOPS per watt, are the means over the runs the "
        "submission's mean counts; per accelerator is the mean Valid FLOPS over the count. "
        "Click a column's header to sort by it.</p></footer>"
    )
    return document("HPC AI500 V2.0 ranking", "".join(parts), STYLE, SCRIPT)


def _filters(entries: list[Entry]) -> str:
    values = {
        "benchmark": sorted({row.ranking.benchmark for row in entries}),
        "source": sorted({row.source for row in entries}),
        "accelerator": sorted({row.accelerator or "none recorded" for row in entries}),
        "rankable": ["yes", "no"],
    }
    fields = []
    for key, label in FILTERS:
        options = "".join(f'<option value="{escape(v)}">{escape(v)}</option>' for v in values[key])
        fields.append(
            f'<label>{escape(label)} <select data-filter="{key}"><option value="">all</option>'
            f"{options}</select></label>"
        )
    return (
        f'<div class="filters" role="search">{"".join(fields)}'
        '<span class="meta" id="shown"></span></div>\n'
    )


def _run_link(path: str, page_of: dict[str, str]) -> str:
    if path not in page_of:  # a published table's entry: no page of its own
        return escape(Path(path).stem)
    return f'<a href="{escape(page_of[path])}">{escape(path)}</a>'


def _cell(kind: str, value, shown: str) -> str:
    """A cell: its HTML and the value it sorts by ("" where there is none: always last)."""
    sort = "" if value is None else (f"{value!r}" if kind == "number" else str(value).lower())
    css = ' class="number"' if kind == "number" else ""
    return f'<td data-sort="{escape(sort)}"{css}>{shown}</td>'


def _runs_cell(row: Entry, page_of: dict[str, str]) -> str:
    items = "".join(
        f"<li>{_run_link(run.path, page_of)}: {escape(run.choice)}</li>" for run in row.runs
    )
    count = len(row.runs)
    return (
        f"<details><summary>{count} run{'s' if count != 1 else ''}</summary><ul>{items}</ul>"
        f'<a href="{escape(row.page)}">the mean, worked through</a></details>'
    )


NOT_MEASURED = '<span title="energy not measured in every run the mean counts">-</span>'


def _time(seconds: float) -> str:
    """The time short (the table is wide): minutes or hours, the seconds on hover."""
    short = duration(seconds).split(" (")[0]
    return f'<span title="{seconds:.1f} s">{short}</span>'


def _row(row: Entry, page_of: dict[str, str]) -> str:
    s, system = row.submission, row.submission.system
    label = s.label + (" (published 2020)" if row.source == PUBLISHED_2020 else "")
    flags = (
        f' <a class="flag" href="{escape(row.page)}#score" title="{escape("; ".join(s.notes))}">'
        f"&#9873; {len(s.notes)} note{'s' if len(s.notes) > 1 else ''}</a>"
        if s.notes
        else ""
    )
    accelerator = system.get("accelerator")
    values = [
        (row.position, str(row.position)),
        (label, f'<a href="{escape(row.page)}">{escape(label)}</a>{flags}'),
        (row.submitter, escape(row.submitter or "-")),
        (accelerator, escape(accelerator or "-")),
        (system.get("accelerators"), escape(system.get("accelerators") or "-")),
        (system.get("nodes"), escape(system.get("nodes") or "-")),
        (system.get("framework"), escape(system.get("framework") or "-")),
        (s.valid_flops, si(s.valid_flops, "FLOPS")),
        (row.flops, si(row.flops, "FLOPS")),
        (s.time_to_quality_s, _time(s.time_to_quality_s)),
        (s.quality, f"{s.quality:.4f}"),
        (row.per_accelerator, si(row.per_accelerator, "FLOPS")),
        (row.per_watt, si(row.per_watt, "FLOPS/W") if row.per_watt else NOT_MEASURED),
        (len(row.runs), _runs_cell(row, page_of)),
    ]
    cells = "".join(
        _cell(kind, value, shown)
        for (_, kind, _), (value, shown) in zip(COLUMNS, values, strict=True)
    )
    data = {
        "benchmark": row.ranking.benchmark,
        "source": row.source,
        "accelerator": accelerator or "none recorded",
        "rankable": "yes" if row.rankable else "no",
    }
    attributes = "".join(f' data-{key}="{escape(value)}"' for key, value in data.items())
    return f"<tr{attributes}>{cells}</tr>\n"


def _ranking_section(rows: list[Entry], page_of: dict[str, str]) -> str:
    if not rows:
        return ""
    ranking = rows[0].ranking
    head = "".join(
        f'<th data-kind="{kind}" data-first="{first}"><button type="button">{escape(name)}'
        "</button></th>"
        for name, kind, first in COLUMNS
    )
    body = "".join(_row(row, page_of) for row in rows)
    leaderboard = (
        f'<div class="scroll"><table class="leaderboard">\n<thead><tr>{head}</tr></thead>\n'
        f"<tbody>\n{body}</tbody>\n</table></div>\n"
    )
    metric = benchmark(ranking.benchmark).quality_metric
    caption = (
        f'<p class="meta">{escape(ranking.benchmark)}: {escape(ranking.level)} level, '
        f"convention {escape(ranking.convention)}, quality as {escape(metric)}.</p>"
    )
    if ranking.convention == scoring.PUBLISHED:
        rule = benchmark(ranking.benchmark).convention(ranking.convention)
        caption += (
            f'<p class="meta">The July 2020 ranking\'s reading ({escape(rule.description)}; '
            "every run scored at the benchmark's problem: quality against its target, the FLOPs "
            "of its epochs), beside that ranking's nine entries. An MLPerf result is timed as "
            "MLPerf times it (run_stop - run_start), a system's time MLPerf's olympic mean.</p>"
        )
    warnings = bullets(ranking.warnings) if ranking.warnings else ""
    anchor = f"ranking-{ranking.benchmark}-{ranking.convention}"
    title = f"{ranking.benchmark} ({ranking.convention})"
    html = section(anchor, title, caption, leaderboard, warnings, *_charts(rows))
    return html.replace("<section ", f'<section data-benchmark="{escape(ranking.benchmark)}" ', 1)


def _charts(rows: list[Entry]) -> list[str]:
    """The ranking's charts: scaling, per accelerator, and its order against MLPerf's."""
    placed = [row for row in rows if row.accelerators and row.accelerator]
    unplaced = len(rows) - len(placed)
    old = [row.source == PUBLISHED_2020 for row in placed]
    parts = ['<h3 id="charts">Charts</h3>\n']
    if not placed:
        return [*parts, missing(["charts by accelerator: no submission records its accelerators"])]
    note = (
        f" {unplaced} submission(s) whose records give no accelerator model or count "
        "(CPU systems; the 2020 table's entries, which give a name only) are not placed."
        if unplaced
        else ""
    )
    points = [
        (row.accelerators, row.submission.valid_flops, row.accelerator, o)
        for row, o in zip(placed, old, strict=True)
    ]
    parts.append(figure(charts.scaling_chart(points), (
        "Valid FLOPS against accelerators, one point per submission, coloured by accelerator "
        "model (2020 entries as stars); dashed: ideal linear scaling from each model's smallest "
        f"system.{escape(note)}"
    )))  # fmt: skip
    per = [(row.accelerator, row.per_accelerator, o) for row, o in zip(placed, old, strict=True)]
    parts.append(figure(charts.per_accelerator_chart(per), (
        "Valid FLOPS per accelerator, by accelerator model: how much each accelerator "
        "delivers of the submission's Valid FLOPS."
    )))  # fmt: skip
    parts.append(_rank_comparison(rows))
    return parts


def _rank_comparison(rows: list[Entry]) -> str:
    """HPC AI500's order of the MLPerf systems against MLPerf's own (by time to train)."""
    mlperf = [row for row in rows if row.submission.rule == "mlperf"]
    if len(mlperf) < 2:
        return ""
    by_time = sorted(mlperf, key=lambda row: row.submission.time_to_quality_s)
    mlperf_rank = {id(row): index for index, row in enumerate(by_time, start=1)}
    points = [
        (mlperf_rank[id(row)], index, row.submission.label)
        for index, row in enumerate(mlperf, start=1)
    ]
    differ = [(a, b, label) for a, b, label in points if a != b]
    rule = benchmark(mlperf[0].ranking.benchmark).convention(mlperf[0].ranking.convention)
    why = (
        f"{len(differ)} of {len(points)} MLPerf systems rank differently. MLPerf orders by time "
        "to train alone; HPC AI500 by Valid FLOPS, FLOPs over that time times the quality factor "
        f"(quality / target)^{rule.penalty_exponent:g}: a system that ends further above the "
        "target climbs, one just on it falls. The FLOPs are on one basis here (the problem's "
        "fixed epochs), so the quality factor is the whole difference; on the stated basis the "
        "epochs each run took would differ too."
    )
    return figure(charts.rank_chart(points), escape(why))
