"""HTML report pages: one self-contained page per run; for several runs a ranking page
(`ranking_page`) and a page per ranked submission (`system_page`).

A page holds everything in itself (inline CSS, charts as inline SVG, nothing fetched: its
content security policy forbids it; the ranking page's one inline script sorts and
filters), so it can be mailed, archived or published as it is, read at 1280 px and printed
to A4 without clipped charts. Every text taken from a record, a path or a power-samples file is
escaped: records are user input. What a run lacks (a record, a quality curve, power samples,
TensorBoard events) is said on its page as a "missing: ..." note; the page shows the rest.
Scores are recomputed from the record (`scoring`), never read from it.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path

from hpcai500_tf import __version__, config
from hpcai500_tf.errors import UserError
from hpcai500_tf.files import check_output_directory
from hpcai500_tf.record import FLOP_BASES, training_throughput
from hpcai500_tf.report import charts, leaderboard, throughput_page
from hpcai500_tf.report.console import duration, si
from hpcai500_tf.report.html_parts import (
    INDEX,
    bullets,
    card,
    document,
    escape,
    figure,
    layers_section,
    missing,
    section,
    table,
)
from hpcai500_tf.report.ranking_page import index_page
from hpcai500_tf.report.run_files import RunFiles, load_run
from hpcai500_tf.report.system_page import system_page
from hpcai500_tf.results import scoring
from hpcai500_tf.run.directory import POWER_SAMPLES

READING = "the score's reading: the end of the last required epoch, SPEC section 3"
# ----------------------------------------------------------------------------- writing


def write_report(arguments: list[str], out: str | Path) -> list[Path]:
    """A page per run (and for several runs index.html, the ranking, and a page per ranked
    submission) in `out`, an empty or new directory; returns the pages written. A non-empty
    `out`, one that is not a directory, or an argument that is neither a run directory nor a
    record is refused (UserError) before anything is written; no file is ever overwritten."""
    out = Path(out)
    _check_out(out)
    found, arguments = throughput_page.split(arguments)  # throughput records: their own pages
    runs = [load_run(argument) for argument in _distinct(arguments)]
    pages = [(throughput_page.page_name(p), throughput_page.throughput_page(p)) for p in found]
    names = page_names(runs)
    with_index = len(runs) > 1
    # Every page rendered before the first is written: a record a page cannot show leaves no
    # report that looks whole but lacks its ranking.
    pages += [(name, run_page(run, with_index)) for run, name in zip(runs, names, strict=True)]
    if with_index:
        rows, refused = leaderboard.collect(runs)
        leaderboard.system_page_names(rows, set(names) | {INDEX})
        page_of = {run.argument: name for run, name in zip(runs, names, strict=True)}
        pages += [(row.page, system_page(row, page_of)) for ranking in rows for row in ranking]
        pages.append((INDEX, index_page(rows, refused, page_of)))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"--out {out}: cannot create it ({error.strerror or error})") from None
    return [_write_new(out / name, text) for name, text in pages]


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


# ----------------------------------------------------------------------------- run page


def run_page(run: RunFiles, with_index: bool = False) -> str:
    """The whole page of one run."""
    record = run.record
    parts = [_header(run, with_index), missing(run.notes("record"))]
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
            layers_section(record),
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
    return document(f"HPC AI500 run: {title}", "".join(parts))


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
        return section(
            "score", "Score", f'<p class="not-scored">not scored: {escape(error)}</p>', card(rows)
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
    return section("score", "Score", card(rows))


def _reading(score: scoring.Score) -> str:
    return score.reading if score.reading.startswith(scoring.MLPERF_READING) else READING


def _quality_section(record: dict) -> str:
    quality = record["quality"]
    if not quality["measured"]:
        note = "quality curve: a throughput-only run (quality was not measured)"
        return section("quality", "Quality against time", missing([note]))
    if not quality["curve"]:
        note = "quality curve: the record holds no evaluation"
        return section("quality", "Quality against time", missing([note]))
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
    return section("quality", "Quality against time", figure(svg, caption))


def _epoch_throughput(epochs: list[dict]) -> list[tuple[float, float]]:
    """(elapsed seconds at the epoch's end, examples per second of its training): the epoch's
    own training seconds where recorded, else the elapsed time since the previous epoch."""
    points, examples_before, elapsed_before = [], 0, 0.0
    for epoch in epochs:
        examples = epoch["examples"] - examples_before
        seconds = epoch.get("seconds") or epoch["elapsed_s"] - elapsed_before
        if examples > 0 and seconds > 0 and math.isfinite(examples / seconds):
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
            parts.append(figure(charts.epoch_throughput_chart(epochs), caption + "."))
        else:
            parts.append(missing(["per-epoch throughput: the record holds no epochs"]))
    if run.step_throughput:
        svg = charts.step_throughput_chart(run.step_throughput)
        caption = f"Per logged step, from TensorBoard ({len(run.step_throughput)} values)."
        parts.append(figure(svg, caption))
    parts.append(missing(run.notes("throughput")))
    return section("throughput", "Throughput", *parts)


def _power_section(run: RunFiles) -> str:
    parts = []
    energy = run.record["energy"] if run.record is not None else None
    if energy is not None and energy["measured"]:
        parts.append(card(_energy_rows(energy)))
    elif energy is not None:
        parts.append(missing([f"energy: not measured: {energy['reason']}"]))
    if energy is not None and energy["sources"]:
        parts.append(_sourcestable(energy["sources"]))
    if run.power:
        parts.append(_powerfigure(run))
    parts.append(missing(run.notes("power")))
    return section("power", "Power and energy", *parts)


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


def _sourcestable(sources: list[dict]) -> str:
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
    return table(["Source", "Measures", "Method", "Energy", "Average", "Coverage"], rows)


def _powerfigure(run: RunFiles) -> str:
    """Power per source against seconds since the run started (its timed segments shaded),
    or since the first reading where the record's clock does not match the samples'."""
    first = min(t for series in run.power for t, _ in series.points)
    timeline = run.record["timeline"] if run.record is not None else None
    if timeline is not None and abs(first - timeline["run_start"]) < 86_400:
        start = timeline["run_start"]
        spans = [(s["start"] - start, s["stop"] - start) for s in timeline["segments"]]
        xlabel = "time since the run started, timed run shaded (s)"
    else:
        start, spans, xlabel = first, [], "time since the first reading (s)"
    series = [(s.label, [(t - start, watts) for t, watts in s.points]) for s in run.power]
    caption = f"{len(series)} source(s), from {POWER_SAMPLES} (counters as energy / time)."
    return figure(charts.power_chart(series, spans, xlabel), caption)


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
    return section("flops", "FLOPs", card(rows))


def _warnings_section(record: dict) -> str:
    parts = []
    if record["rankable"]:
        parts.append("<p>Rankable: yes.</p>")
    else:
        reasons = bullets(record["not_rankable_reasons"])
        parts.append(f'<p class="refused">Not rankable:</p>{reasons}')
    parts.append(bullets(record["warnings"]) if record["warnings"] else "<p>No warnings.</p>")
    return section("warnings", "Warnings and rankability", *parts)
