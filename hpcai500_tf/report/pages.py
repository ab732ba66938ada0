"""HTML report pages: one self-contained page per run, and a ranking page for several runs.

A page holds everything in itself (inline CSS, charts as inline SVG, no script, nothing
fetched), so it can be mailed, archived or published as it is, read at 1280 px and printed to
A4 without clipped charts. Every text taken from a record, a path or a power-samples file is
escaped: records are user input. What a run lacks (a record, a quality curve, power samples,
TensorBoard events) is said on its page as a "missing: ..." note; the page shows the rest.
Scores are recomputed from the record (`scoring`), never read from it.
"""

from __future__ import annotations

import functools
import html
import re
from pathlib import Path

from hpcai500_tf import __version__, config, scoring
from hpcai500_tf.errors import UserError
from hpcai500_tf.files import check_output_directory
from hpcai500_tf.record import FLOP_BASES, training_throughput
from hpcai500_tf.report import charts
from hpcai500_tf.report.console import LAYER_NAMES, duration, si
from hpcai500_tf.report.run_files import RunFiles, load_run
from hpcai500_tf.report.text import printable
from hpcai500_tf.run_directory import POWER_SAMPLES

INDEX = "index.html"
LEVEL = "free"
READING = "the score's reading: the end of the last required epoch, SPEC section 3"
STYLE = """
body { margin: 0; color: #1f2328; background: #fff;
  font: 15px/1.45 system-ui, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
main { max-width: 1100px; margin: 0 auto; padding: 20px 32px 40px; }
h1 { font-size: 1.55em; margin: 0.2em 0; overflow-wrap: anywhere; }
h2 { font-size: 1.2em; margin: 1.6em 0 0.5em; padding-bottom: 3px; border-bottom: 1px solid #d0d7de;
  break-after: avoid; }
nav, .meta, footer { color: #57606a; font-size: 0.92em; }
nav a { margin-right: 0.9em; }
code { overflow-wrap: anywhere; }
table { border-collapse: collapse; width: 100%; margin: 0.4em 0; }
th, td { text-align: left; vertical-align: top; padding: 4px 8px; border-bottom: 1px solid #eaeef2;
  overflow-wrap: anywhere; }
thead th { background: #f6f8fa; }
tr { break-inside: avoid; }
.card th { width: 13em; font-weight: 600; }
.layers td:first-child { width: 13em; } .layers td:nth-child(2) { width: 16em; }
.headline { font-size: 1.3em; font-weight: 700; color: #1a7f37; }
.missing, .not-scored, .refused { padding: 6px 12px; margin: 0.5em 0; border-left: 4px solid; }
.missing { background: #fff8c5; border-color: #d4a72c; }
.not-scored, .refused { background: #ffebe9; border-color: #cf222e; }
.flags { color: #9a6700; font-size: 0.88em; }
ul { margin: 0.3em 0; padding-left: 1.4em; }
figure { margin: 0.6em 0; break-inside: avoid; page-break-inside: avoid; }
figcaption { color: #57606a; font-size: 0.9em; }
svg { display: block; width: 100%; height: auto; }
@media print {
  @page { size: A4; margin: 12mm; }
  body { font-size: 10pt; }
  main { max-width: none; padding: 0; }
  nav { display: none; }
  a { color: inherit; text-decoration: none; }
  section { break-before: auto; }
}
"""


def escape(value) -> str:
    """Any value as HTML text: records, paths and sensor names are user input."""
    return html.escape(printable(value), quote=True)


# ----------------------------------------------------------------------------- writing


def write_report(arguments: list[str], out: str | Path) -> list[Path]:
    """A page per run (and index.html, the ranking, for several runs) in `out`, an empty or
    new directory; returns the pages written. A non-empty `out`, one that is not a directory,
    or an argument that is neither a run directory nor a record is refused (UserError) before
    anything is written; no file is ever overwritten."""
    out = Path(out)
    _check_out(out)
    runs = [load_run(argument) for argument in _distinct(arguments)]
    names = page_names(runs)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"--out {out}: cannot create it ({error.strerror or error})") from None
    with_index = len(runs) > 1
    written = [
        _write_new(out / name, run_page(run, with_index))
        for run, name in zip(runs, names, strict=True)
    ]
    if with_index:
        written.append(_write_new(out / INDEX, index_page(runs, names)))
    return written


def _check_out(out: Path) -> None:
    """The one output-directory check (a file, a file above, a dangling link, a name too
    long: see files.check_output_directory), and the report's own rule: new or empty."""
    check_output_directory("--out", out)
    if not out.exists():
        return
    try:
        if any(out.iterdir()):
            raise UserError(f"--out {out}: not empty; give a new or empty directory")
    except OSError as error:
        raise UserError(f"--out {out}: cannot read it ({error.strerror or error})") from None


def _distinct(arguments: list[str]) -> list[str]:
    """The arguments without repeats of one path (a run given twice is one run)."""
    seen, distinct = set(), []
    for argument in arguments:
        try:
            key = Path(argument).resolve()
        except (RuntimeError, OSError):  # a symlink loop, a name too long: load_run says so
            key = argument
        if key not in seen:
            seen.add(key)
            distinct.append(argument)
    return distinct


def page_names(runs: list[RunFiles]) -> list[str]:
    """One file name per run, from its directory's or record's name: safe characters only,
    unique, never the index's."""
    names, taken = [], {INDEX}
    for run in runs:
        stem = re.sub(r"[^A-Za-z0-9._-]+", "-", run.name).strip(".-")[:100] or "run"
        name, number = f"{stem}.html", 1
        while name in taken:
            number += 1
            name = f"{stem}-{number}.html"
        taken.add(name)
        names.append(name)
    return names


def _write_new(path: Path, text: str) -> Path:
    try:
        with path.open("x", encoding="utf-8") as handle:
            handle.write(text)
    except FileExistsError:
        raise UserError(f"{path}: already exists; refusing to overwrite it") from None
    except OSError as error:
        raise UserError(f"{path}: cannot write it ({error.strerror or error})") from None
    return path


# ----------------------------------------------------------------------------- HTML pieces


def _document(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n"
        f"<body>\n<main>\n{body}\n</main>\n</body>\n</html>\n"
    )


def _section(anchor: str, title: str, *parts: str) -> str:
    return (
        f'<section id="{escape(anchor)}">\n<h2>{escape(title)}</h2>\n'
        + "\n".join(parts)
        + "</section>\n"
    )


def _missing(notes: list[str]) -> str:
    """The visible "missing: ..." notes of a section."""
    return "".join(f'<p class="missing">missing: {escape(note)}</p>\n' for note in notes)


def _card(rows: list[tuple[str, str]]) -> str:
    """Label-value rows; values are HTML already (escaped where they hold record text)."""
    body = "".join(f"<tr><th>{escape(label)}</th><td>{value}</td></tr>\n" for label, value in rows)
    return f'<table class="card">\n{body}</table>\n'


def _table(head: list[str], rows: list[list[str]], css_class: str = "") -> str:
    """A table with a header; cells are HTML already."""
    header = "".join(f"<th>{escape(cell)}</th>" for cell in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>\n" for row in rows)
    opening = f'<table class="{css_class}">' if css_class else "<table>"
    return f"{opening}\n<thead><tr>{header}</tr></thead>\n<tbody>\n{body}</tbody>\n</table>\n"


def _list(items: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{escape(item)}</li>" for item in items) + "</ul>"


def _figure(svg: str, caption: str = "") -> str:
    caption = f"<figcaption>{caption}</figcaption>" if caption else ""
    return f"<figure>\n{svg}\n{caption}</figure>\n"


# ----------------------------------------------------------------------------- run page


def run_page(run: RunFiles, with_index: bool = False) -> str:
    """The whole page of one run."""
    record = run.record
    parts = [_header(run, with_index), _missing(run.notes("record"))]
    if record is None:
        parts.append(
            "<p>Without a record there is no score card, quality curve, layer table or FLOP "
            "count; what the run directory holds besides is shown below.</p>\n"
        )
        parts += [_throughput_section(run), _power_section(run)]
    else:
        parts += [
            _score_section(record),
            _quality_section(record),
            _throughput_section(run),
            _power_section(run),
            _layers_section(record),
            _flops_section(record),
            _warnings_section(record),
        ]
    source = run.record_path if record is not None else run.run_dir
    parts.append(
        f"<footer><p>Written by hpcai500-tf {escape(__version__)} from "
        f"<code>{escape(source)}</code>. Scores are recomputed from the record "
        "(convention: stated), never read from it.</p></footer>"
    )
    title = f"{record['benchmark']} / {record['preset']}: {run.name}" if record else run.name
    return _document(f"HPC AI500 run: {title}", "".join(parts))


def _header(run: RunFiles, with_index: bool) -> str:
    links = ["score", "quality", "throughput", "power", "layers", "flops", "warnings"]
    if run.record is None:
        links = ["throughput", "power"]
    nav = "".join(f'<a href="#{anchor}">{anchor}</a>' for anchor in links)
    if with_index:
        nav = f'<a href="{INDEX}">&larr; ranking</a>' + nav
    record = run.record
    if record is None:
        return f"<nav>{nav}</nav>\n<h1>{escape(run.name)}</h1>\n"
    system = record["layers"]["L1"].get("summary") or "system not recorded"
    facts = [
        f"status <b>{escape(record['status'])}</b>",
        f"level {escape(record['level'])}",
        f"system {escape(system)}",
        f"framework {escape(record['source']['framework'])}",
    ]
    imported = record["source"].get("imported_from")
    if imported:
        facts.append(f"imported from {escape(imported)}")
    title = f"{record['benchmark']} / {record['preset']}: {run.name}"
    return (
        f"<nav>{nav}</nav>\n<h1>{escape(title)}</h1>\n"
        f'<p class="meta">{" &middot; ".join(facts)}</p>\n'
    )


@functools.cache
def _benchmark(name: str) -> config.Benchmark:
    return config.load_benchmark(name)


def _score_section(record: dict) -> str:
    quality = record["quality"]
    try:
        score = scoring.score(record, _benchmark(record["benchmark"]))
    except UserError as error:
        rows = [
            ("Status", escape(record["status"])),
            ("Quality", "measured" if quality["measured"] else "not measured (throughput only)"),
            ("Target", f"{quality['target']:g} {escape(quality['metric'])}"),
        ]
        return _section(
            "score", "Score", f'<p class="not-scored">not scored: {escape(error)}</p>', _card(rows)
        )
    reached = "reached" if quality["reached_target"] else "<b>not reached</b>"
    crossing = quality["first_crossing"]
    first = (
        "never"
        if crossing is None
        else f"{duration(crossing['elapsed_s'])} at epoch {crossing['epoch']:g}, quality "
        f"{crossing['value']:.4f} (MLPerf's reading; not scored)"
    )
    penalty = (
        f"(quality / target)<sup>{score.penalty_exponent:g}</sup> = {score.quality_factor:.4f}"
    )
    per_watt = (
        f'<span class="headline">{si(score.valid_flops_per_watt, "FLOPS/W")}</span> '
        f"({escape(record['energy']['scope'])})"
        if score.valid_flops_per_watt is not None
        else escape(score.energy_note)
    )
    rows = [
        ("Valid FLOPS", f'<span class="headline">{si(score.valid_flops, "FLOPS")}</span>'),
        ("Status", escape(record["status"])),
        (
            "Quality",
            f"{score.quality:.4f} {escape(quality['metric'])} (target {score.target:g}, {reached})",
        ),
        ("Time to quality", f"{duration(score.time_to_quality_s)} ({escape(_reading(score))})"),
        ("First on target", first),
        (
            "Total FLOPs",
            f"{si(score.total_flops, 'FLOPs')} ({score.total_flops:.4g}; basis: "
            f"{escape(score.flop_basis)})",
        ),
        ("FLOPS", si(score.flops, "FLOPS")),
        ("Quality factor", penalty),
        ("Valid FLOPS per watt", per_watt),
    ]
    if score.average_watts is not None:
        rows.append(("Average power", si(score.average_watts, "W")))
    rows.append(("Energy", escape(score.energy_note)))
    return _section("score", "Score", _card(rows))


def _reading(score: scoring.Score) -> str:
    return score.reading if score.reading.startswith(scoring.MLPERF_READING) else READING


def _quality_section(record: dict) -> str:
    quality = record["quality"]
    if not quality["measured"]:
        note = "quality curve: a throughput-only run (quality was not measured)"
        return _section("quality", "Quality against time", _missing([note]))
    if not quality["curve"]:
        note = "quality curve: the record holds no evaluation"
        return _section("quality", "Quality against time", _missing([note]))
    crossing = quality["first_crossing"]
    svg = charts.quality_chart(
        [(point["elapsed_s"], point["value"]) for point in quality["curve"]],
        quality["target"],
        quality["metric"],
        quality["time_to_quality_s"],
        None if crossing is None else (crossing["elapsed_s"], crossing["value"]),
    )
    caption = (
        f"{len(quality['curve'])} evaluation(s); target {quality['target']:g} "
        f"{escape(quality['metric'])}; the score reads the last evaluation."
    )
    return _section("quality", "Quality against time", _figure(svg, caption))


def _epoch_throughput(epochs: list[dict]) -> list[tuple[float, float]]:
    """(elapsed seconds at the epoch's end, examples per second of its training): the epoch's
    own training seconds where recorded, else the elapsed time since the previous epoch."""
    points, examples_before, elapsed_before = [], 0, 0.0
    for epoch in epochs:
        examples = epoch["examples"] - examples_before
        seconds = epoch.get("seconds") or epoch["elapsed_s"] - elapsed_before
        if examples > 0 and seconds > 0:
            points.append((epoch["elapsed_s"], examples / seconds))
        examples_before, elapsed_before = epoch["examples"], epoch["elapsed_s"]
    return points


def _throughput_section(run: RunFiles) -> str:
    parts = []
    if run.record is not None:
        epochs = _epoch_throughput(run.record["timeline"]["epochs"])
        if epochs:
            overall = training_throughput(run.record)
            caption = "Per epoch, from the record's timeline" + (
                "" if overall is None else f"; {overall:,.1f} examples/s over the whole run"
            )
            parts.append(_figure(charts.epoch_throughput_chart(epochs), caption + "."))
        else:
            parts.append(_missing(["per-epoch throughput: the record holds no epochs"]))
    if run.step_throughput:
        svg = charts.step_throughput_chart(run.step_throughput)
        caption = f"Per logged step, from TensorBoard ({len(run.step_throughput)} values)."
        parts.append(_figure(svg, caption))
    parts.append(_missing(run.notes("throughput")))
    return _section("throughput", "Throughput", *parts)


def _power_section(run: RunFiles) -> str:
    parts = []
    energy = run.record["energy"] if run.record is not None else None
    if energy is not None and energy["measured"]:
        parts.append(_card(_energy_rows(energy)))
    elif energy is not None:
        parts.append(_missing([f"energy: not measured: {energy['reason']}"]))
    if energy is not None and energy["sources"]:
        parts.append(_sources_table(energy["sources"]))
    if run.power:
        parts.append(_power_figure(run))
    parts.append(_missing(run.notes("power")))
    return _section("power", "Power and energy", *parts)


def _energy_rows(energy: dict) -> list[tuple[str, str]]:
    rate = energy["sample_hz"]
    rows = [
        ("Energy", f"{energy['joules']:,.1f} J over {duration(energy['interval_s'])}"),
        ("Average power", si(energy["average_watts"], "W")),
        ("Coverage", f"{energy['coverage']:.1%} of the timed run"),
        ("Scope", escape(energy["scope"])),
        ("Sample rate", "-" if rate is None else f"{rate:.3g} samples/s"),
        ("Parts measured", escape(", ".join(energy["parts_measured"]) or "-")),
        ("Not measured", escape("; ".join(energy["parts_not_measured"]) or "-")),
    ]
    if energy["quality_flags"]:
        rows.append(("Quality flags", escape("; ".join(energy["quality_flags"]))))
    return rows


def _sources_table(sources: list[dict]) -> str:
    """The record's per-source measurements (plain dicts: read with care)."""

    def number(value, unit: str) -> str:
        return si(value, unit) if isinstance(value, int | float) else "-"

    def share(value) -> str:
        return f"{value:.1%}" if isinstance(value, int | float) else "-"

    rows = [
        [
            escape(source.get("name", "-")),
            escape(source.get("part", "-")),
            escape(source.get("method", "-")),
            number(source.get("joules"), "J"),
            number(source.get("average_watts"), "W"),
            share(source.get("coverage")),
        ]
        for source in sources
    ]
    return _table(["Source", "Measures", "Method", "Energy", "Average", "Coverage"], rows)


def _power_figure(run: RunFiles) -> str:
    """Power per source against seconds since the run started (its timed segments shaded),
    or since the first reading where the record's clock does not match the samples'."""
    first = min(t for series in run.power for t, _ in series.points)
    timeline = run.record["timeline"] if run.record is not None else None
    if timeline is not None and abs(first - timeline["run_start"]) < 86_400:
        start = timeline["run_start"]
        spans = [(s["start"] - start, s["stop"] - start) for s in timeline["segments"]]
        xlabel = "seconds since the run started (timed run shaded)"
    else:
        start, spans, xlabel = first, [], "seconds since the first reading"
    series = [(s.label, [(t - start, watts) for t, watts in s.points]) for s in run.power]
    caption = f"{len(series)} source(s), from {POWER_SAMPLES} (counters as energy / time)."
    return _figure(charts.power_chart(series, spans, xlabel), caption)


def _layer_value(value) -> str:
    if value is None:
        return "not observed"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "-"
    if isinstance(value, int) and not isinstance(value, bool) and value > 1 << 30:
        return f"{value / (1 << 30):.1f} GiB"
    return str(value)


def _layers_section(record: dict) -> str:
    rows = []
    for layer, name in LAYER_NAMES.items():
        fields = record["layers"][layer] or {"": "nothing recorded"}
        label = f"<b>{layer}</b> {escape(name)}"
        for index, (key, value) in enumerate(fields.items()):
            rows.append([label if index == 0 else "", escape(key), escape(_layer_value(value))])
    table = _table(["Layer", "Field", "Value"], rows, "layers")
    return _section("layers", "The nine layers", table)


def _flops_section(record: dict) -> str:
    flops = record["flops"]

    def count(value) -> str:
        return "-" if value is None else f"{si(value, 'FLOPs')} ({value:.4g})"

    def types(names: list[str]) -> str:
        return f"{len(names)}: {escape(', '.join(names))}" if names else "none"

    basis = FLOP_BASES.get(flops["basis"], "")
    rows = [
        ("Training, per example", count(flops["per_example_training"])),
        ("Forward, per example", count(flops["per_example_forward"])),
        ("Forward, analytical", count(flops["analytical_per_example_forward"])),
        ("Total to quality", count(flops["total"])),
        ("Method", escape(flops["method"])),
        ("Basis", escape(flops["basis"] + (f": {basis}" if basis else ""))),
        ("Counted op types", types(flops["counted_op_types"])),
        ("Uncounted op types", types(flops["uncounted_op_types"])),
    ]
    return _section("flops", "FLOPs", _card(rows))


def _warnings_section(record: dict) -> str:
    parts = []
    if record["rankable"]:
        parts.append("<p>Rankable: yes.</p>")
    else:
        parts.append('<p class="refused">Not rankable:</p>' + _list(record["not_rankable_reasons"]))
    parts.append(_list(record["warnings"]) if record["warnings"] else "<p>No warnings.</p>")
    return _section("warnings", "Warnings and rankability", *parts)


# ----------------------------------------------------------------------------- ranking page


def index_page(runs: list[RunFiles], names: list[str]) -> str:
    """The ranking of the runs in the form of the published HPC AI500 ranking, a table per
    benchmark, each row linking to its run pages; where runs refused at the benchmark's own
    problem rank under the published 2020 table's reading (MLPerf results), that ranking too,
    beside the table's nine entries; then the refused runs with the rule each breaks (runs
    without a record among them)."""
    page_of = {run.argument: name for run, name in zip(runs, names, strict=True)}
    record_of = {run.argument: run.record for run in runs}
    refused = [(run.argument, run.notes("record")) for run in runs if run.record is None]
    groups: dict[str, list[tuple[str, dict]]] = {}
    for run in runs:
        if run.record is not None:
            groups.setdefault(run.record["benchmark"], []).append((run.argument, run.record))
    parts = [f"<h1>HPC AI500 V2.0 ranking of {len(runs)} runs</h1>\n"]
    for _, records in sorted(groups.items()):
        try:
            (ranking,) = scoring.rank_records(records, None, LEVEL)
        except UserError as error:
            refused += [(path, [str(error)]) for path, _ in records]
            continue
        parts.append(_ranking_table(ranking, page_of, record_of))
        refused += ranking.refused
        beside = _published_reading(records, ranking)
        if beside is not None:
            parts.append(_ranking_table(beside, page_of, record_of))
            shown = {path for path, _ in refused}
            refused += [
                (path, [f"{beside.convention}: {reason}" for reason in reasons])
                for path, reasons in beside.refused
                if path in page_of and path not in shown
            ]
    if refused:
        rows = [[_run_link(path, page_of), _list(reasons)] for path, reasons in refused]
        parts.append(_section("refused", "Refused runs", _table(["Run", "Rule broken"], rows)))
    parts.append(
        f"<footer><p>Written by hpcai500-tf {escape(__version__)}. Ranked at the {LEVEL} level "
        "by Valid FLOPS = FLOPS x (quality / target)<sup>n</sup>, recomputed from each record; "
        "runs equal on all nine layers but the seed, and the results of one MLPerf system, are "
        "one submission.</p></footer>"
    )
    return _document("HPC AI500 V2.0 ranking", "".join(parts))


def _published_reading(records: list[tuple[str, dict]], ranking: scoring.Ranking):
    """The ranking under the published 2020 table's conventions, where it ranks runs the
    stated one refuses; None otherwise (or where the benchmark has no such convention)."""
    if scoring.PUBLISHED not in _benchmark(ranking.benchmark).conventions:
        return None
    (beside,) = scoring.rank_records(records, None, LEVEL, convention=scoring.PUBLISHED)
    refused = {path for path, _ in ranking.refused}
    placed = {p for s in beside.submissions for p in s.paths + s.not_converged}
    return beside if placed & refused else None


def _run_link(path: str, page_of: dict[str, str]) -> str:
    return f'<a href="{escape(page_of[path])}">{escape(path)}</a>'


def _ranking_table(ranking: scoring.Ranking, page_of: dict, record_of: dict) -> str:
    rows = []
    for position, submission in enumerate(ranking.submissions, start=1):
        first = submission.paths[0]
        system = submission.label if first in page_of else f"{submission.label} (published 2020)"
        if first in record_of and scoring.mlperf_result(record_of[first]) is None:
            system = record_of[first]["layers"]["L1"].get("summary") or "unknown system"
        flags = "".join(f'<div class="flags">{escape(note)}</div>' for note in submission.notes)
        link = (
            f'<a href="{escape(page_of[first])}">{escape(system)}</a>'
            if first in page_of
            else escape(system)
        )
        runs = ", ".join(
            f'<a href="{escape(page_of[path])}">{escape(Path(page_of[path]).stem)}</a>'
            + (" (did not converge)" if path in submission.not_converged else "")
            for path in submission.paths + submission.not_converged
            if path in page_of
        )
        facts = submission.system
        rows.append(
            [
                str(position),
                link + flags,
                *(
                    "-" if facts.get(key) is None else escape(facts[key])
                    for key in ("accelerator", "accelerators", "nodes", "framework")
                ),
                si(submission.valid_flops, "FLOPS"),
                duration(submission.time_to_quality_s),
                f"{submission.quality:.4f}",
                escape(ranking.level),
                runs or "-",
            ]
        )
    head = ["Rank", "System", "Accelerator", "Count", "Nodes", "Framework", "Valid FLOPS",
            "Time to quality", "Quality", "Level", "Runs"]  # fmt: skip
    metric = _benchmark(ranking.benchmark).quality_metric
    caption = (
        f'<p class="meta">{escape(ranking.benchmark)}: {escape(ranking.level)} level, '
        f"convention {escape(ranking.convention)}, quality as {escape(metric)}.</p>"
    )
    if ranking.convention == scoring.PUBLISHED:
        rule = _benchmark(ranking.benchmark).convention(ranking.convention)
        caption += (
            f'<p class="meta">The July 2020 ranking\'s reading ({escape(rule.description)}; '
            "every run scored at the benchmark's problem: quality against its target, the FLOPs "
            "of its epochs), beside that ranking's nine entries. An MLPerf result is timed as "
            "MLPerf times it (run_stop - run_start), a system's time MLPerf's olympic mean.</p>"
        )
    warnings = _list(ranking.warnings) if ranking.warnings else ""
    table = _table(head, rows) if rows else "<p>No run of this benchmark could be ranked.</p>"
    anchor = f"ranking-{ranking.benchmark}-{ranking.convention}"
    title = f"{ranking.benchmark} ({ranking.convention})"
    return _section(anchor, title, caption, table, warnings)
