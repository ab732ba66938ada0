"""The report's page of a throughput record (`train --instances M`): its score as
run/throughput.py derives it, the members listed with how each ended, and their quality
curves side by side on one chart. The members' own runs get their pages as any run does,
when they are given to `report` too.
"""

from __future__ import annotations

from pathlib import Path

from hpcai500_tf.errors import UserError
from hpcai500_tf.report import charts, ensemble_view
from hpcai500_tf.report.console import duration, si
from hpcai500_tf.report.html_parts import (
    card,
    document,
    escape,
    figure,
    layers_section,
    missing,
    section,
    table,
)
from hpcai500_tf.run import ensemble, throughput


def split(arguments: list[str]) -> tuple[list[Path], list[str]]:
    """(throughput records, the other arguments): a throughput record given as its file or
    as the parent directory that holds it."""
    found, others = [], []
    for argument in arguments:
        path = Path(argument)
        candidate = path / throughput.FILE if path.is_dir() else path
        if candidate.is_file() and throughput.is_throughput(candidate):
            found.append(candidate)
        else:
            others.append(argument)
    return found, others


def page_name(path: Path) -> str:
    return f"throughput-{path.parent.name}.html"


def throughput_page(path: Path) -> str:
    data = throughput.load(path)
    title = f"{data['benchmark']} / {data['preset']}: {data['instances']} instances"
    parts = [f"<h1>{escape(title)}</h1>\n", _score_section(path, data)]
    parts.append(_members_section(path, data))
    parts.append(_layers_section(path, data))
    return document(title, "".join(parts))


def _layers_section(path: Path, data: dict) -> str:
    """The nine layers every instance shares (the first's; seeds apart), or why there are
    none to show."""
    records = [throughput.read_member(path.parent, m)["record"] for m in data["members"]]
    records = [rec for rec in records if rec is not None]
    if not records:
        return section("layers", "The nine layers", missing(["no instance wrote a record"]))
    difference = throughput.layer_difference(records)
    if difference:
        return section("layers", "The nine layers", missing([difference]))
    return layers_section(records[0], "The nine layers (every instance's; seeds apart)")


def _score_section(path: Path, data: dict) -> str:
    try:
        one = throughput.score(path, data)
    except UserError as error:
        return section("score", "Throughput", missing([str(error)]))
    if isinstance(one, ensemble.EnsembleScore):
        rows = [(name, escape(value)) for name, value in ensemble_view.score_rows(one)]
        return section("score", "Ensemble", card(rows))
    per_watt = one.valid_flops_per_watt
    rows = [
        ("Rule", escape(one.rule)),
        ("Instances", f"{one.counted} of {one.instances} reached the target"),
        ("Window", f"{duration(one.window_s)} (earliest run_start to latest run_stop)"),
        ("Throughput", f"{one.models_per_minute:.4g} models/min"),
        ("Aggregate FLOPS", si(one.aggregate_flops, "FLOPS")),
        ("Aggregate Valid FLOPS", si(one.aggregate_valid_flops, "FLOPS")),
        ("Valid FLOPS per watt", si(per_watt, "FLOPS/W") if per_watt else escape(one.energy_note)),
    ]
    return section("score", "Throughput", card(rows))


def _members_section(path: Path, data: dict) -> str:
    rows, curves, target, metric = [], [], None, ""
    for member in data["members"]:
        seen = throughput.read_member(path.parent, member)
        rec = seen["record"]
        quality = "-" if rec is None or rec["quality"]["achieved"] is None else (
            f"{rec['quality']['achieved']:.4f}"
        )  # fmt: skip
        status = rec["status"] if rec else escape(seen["problem"] or "no record")
        rows.append(
            [str(member["index"]), str(member["seed"]), escape(", ".join(member["hosts"])),
             escape(member["ended"]), escape(status), quality]
        )  # fmt: skip
        if rec is not None and rec["quality"]["curve"]:
            target, metric = rec["quality"]["target"], rec["quality"]["metric"]
            curve = [(p["elapsed_s"], p["value"]) for p in rec["quality"]["curve"]]
            counted = rec["status"] == "completed" and rec["quality"]["reached_target"]
            curves.append((f"instance {member['index']} (seed {member['seed']})", curve, counted))
    head = ["Instance", "Seed", "Hosts", "Process", "Status", "Quality"]
    parts = [table(head, rows)]
    if curves:
        svg = charts.runs_chart(curves, target, metric)
        parts.append(figure(svg, "Each instance's quality curve; dashed: not counted."))
    else:
        parts.append(missing(["quality curves: no instance wrote a record with evaluations"]))
    return section("members", "Instances", *parts)
