"""How `score` and `rank` show throughput records (`train --instances M`): their own tables,
one ranking per form and benchmark, never mixed with the time-to-quality records beside them.

`score_apart(args)` and `rank_apart(args)` print what the throughput records among
`args.records` give and return the other paths, for the command's own path to take on.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from rich.table import Table

from hpcai500_tf.errors import UserError
from hpcai500_tf.report import ensemble_view
from hpcai500_tf.report.console import console, duration, escape, refused_table, si
from hpcai500_tf.run import ensemble, throughput


def split(paths: list[str]) -> tuple[list[str], list[str]]:
    """(throughput records, the others), each in the order given."""
    found = [path for path in paths if throughput.is_throughput(path)]
    return found, [path for path in paths if path not in found]


def throughput_table(path: str, one: throughput.ThroughputScore) -> Table:
    if isinstance(one, ensemble.EnsembleScore):
        return ensemble_view.ensemble_table(path, one)
    table = Table(title=escape(f"{one.benchmark} / {one.form}: {path}"), show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    table.add_row("Rule", escape(one.rule))
    table.add_row("Instances", f"{one.counted} of {one.instances} reached the target")
    table.add_row("Window", f"{duration(one.window_s)} (earliest run_start to latest run_stop)")
    table.add_row("Throughput", f"{one.models_per_minute:.4g} models/min")
    table.add_row("Aggregate FLOPS", si(one.aggregate_flops, "FLOPS"))
    table.add_row("Aggregate Valid FLOPS", si(one.aggregate_valid_flops, "FLOPS"))
    per_watt = one.valid_flops_per_watt
    table.add_row(
        "Valid FLOPS per watt",
        si(per_watt, "FLOPS/W") if per_watt is not None else escape(one.energy_note),
    )
    for member in one.members:
        quality = "-" if member["quality"] is None else f"{member['quality']:.4f}"
        counted = "counted" if member["counted"] else f"not counted: {member['why']}"
        table.add_row(
            f"Instance {member['index']}",
            escape(f"seed {member['seed']}, {member['status']}, quality {quality}; {counted}"),
        )
    return table


def score_apart(args) -> list[str]:
    """The throughput records' scores printed (JSON with --json); the other paths returned.
    Mixed with other records under --json, the two kinds are refused together."""
    found, others = split(args.records)
    if not found:
        return others
    if args.json and others:
        raise UserError("score --json: give throughput records and run records separately")
    scores = [(path, throughput.score(path)) for path in found]
    if args.json:
        print(json.dumps([{"record": p, **asdict(s)} for p, s in scores], indent=2))
    else:
        for path, one in scores:
            console.print(throughput_table(path, one))
    return others


def ranking_table(ranking: throughput.ThroughputRanking) -> Table:
    if ranking.form == ensemble.FORM:
        return ensemble_view.ranking_table(ranking)
    table = Table(title=escape(f"{ranking.benchmark}: throughput ({ranking.form})"))
    for column in ("#", "Record", "Instances", "Models/min", "Window", "Aggregate Valid FLOPS"):
        table.add_column(column)
    for position, (path, one) in enumerate(ranking.entries, start=1):
        table.add_row(
            str(position), escape(path), f"{one.counted}/{one.instances}",
            f"{one.models_per_minute:.4g}", duration(one.window_s),
            si(one.aggregate_valid_flops, "FLOPS"),
        )  # fmt: skip
    return table


def rank_apart(args) -> list[str]:
    """The throughput records ranked (per form and benchmark) and printed; the other paths
    returned for the time-to-quality ranking."""
    found, others = split(args.records)
    if not found:
        return others
    if args.json and others:
        raise UserError("rank --json: give throughput records and run records separately")
    rankings = throughput.rank(found, args.benchmark, args.level)
    if args.json:
        rendered = [
            {"form": r.form, "benchmark": r.benchmark,
             "entries": [{"rank": i, "record": p, **asdict(s)}
                         for i, (p, s) in enumerate(r.entries, start=1)],
             "refused": [{"record": p, "reasons": why} for p, why in r.refused]}
            for r in rankings
        ]  # fmt: skip
        print(json.dumps(rendered, indent=2))
        return others
    for ranking in rankings:
        console.print(ranking_table(ranking))
        if ranking.refused:
            console.print(refused_table(ranking.refused))
    return others
