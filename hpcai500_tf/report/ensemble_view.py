"""How `score`, `rank` and `report` show an ensemble's throughput record (`train --instances
M --ensemble`, run/ensemble.py): the ensemble's quality, time, FLOPs and Valid FLOPS, and
each member's own quality beside it. Plain text rows, for a console table or a page's card.
"""

from __future__ import annotations

from rich.table import Table

from hpcai500_tf.report.console import duration, escape, si
from hpcai500_tf.run.ensemble import EnsembleScore


def score_rows(one: EnsembleScore) -> list[tuple[str, str]]:
    per_watt = one.valid_flops_per_watt
    reached = "reached" if one.reached_target else "missed"
    examples = "images" if one.saved == "detections" else "examples"
    rows = [
        ("Rule", one.rule),
        ("Merging", one.merging),
        ("Members", f"{one.members_in} of {one.instances} in the ensemble"),
        ("Ensemble quality", f"{one.quality:.4f} {one.quality_name} over "
         f"{one.evaluated_examples} {examples} ({reached} the target {one.target:g})"),
        ("Window", f"{duration(one.window_s)} (earliest run_start to latest run_stop)"),
        ("Total FLOPs", f"{one.total_flops:.4g} (every member in the ensemble)"),
        ("FLOPS", si(one.flops, "FLOPS")),
        ("Valid FLOPS", f"{si(one.valid_flops, 'FLOPS')} (quality factor "
         f"{one.quality_factor:.4g})"),
        ("Valid FLOPS per watt", si(per_watt, "FLOPS/W") if per_watt is not None
         else one.energy_note),
    ]  # fmt: skip
    for member in one.members:
        quality = "-" if member["quality"] is None else f"{member['quality']:.4f}"
        kept = member["quality_from_predictions"]
        own = f" (its saved {one.saved}: {kept:.4f})" if kept is not None else ""
        place = "in the ensemble" if member["in_ensemble"] else f"left out: {member['why']}"
        rows.append(
            (f"Member {member['index']}", f"{member['status']}, quality {quality}{own}; {place}")
        )
    return rows


def ensemble_table(path: str, one: EnsembleScore) -> Table:
    table = Table(title=escape(f"{one.benchmark} / {one.form}: {path}"), show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    for name, value in score_rows(one):
        table.add_row(name, escape(value))
    return table


def ranking_table(ranking) -> Table:
    """An ensemble ranking (throughput.ThroughputRanking of form ensemble), by Valid FLOPS."""
    table = Table(title=escape(f"{ranking.benchmark}: throughput ({ranking.form})"))
    for column in ("#", "Record", "Members", "Ensemble quality", "Window", "Valid FLOPS"):
        table.add_column(column)
    for position, (path, one) in enumerate(ranking.entries, start=1):
        table.add_row(
            str(position), escape(path), f"{one.members_in}/{one.instances}",
            f"{one.quality:.4f}", duration(one.window_s), si(one.valid_flops, "FLOPS"),
        )  # fmt: skip
    return table
