"""Rich tables for the CLI: system layers, score cards, rankings, the cluster.

Text from records, logs and paths is shown literally (`escape`d: control characters and
unpaired surrogates as escapes, never read as markup)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape as escape_markup
from rich.table import Table
from rich.text import Text

from hpcai500_tf.report.text import printable
from hpcai500_tf.results.compare import Comparison
from hpcai500_tf.results.scaling import Series
from hpcai500_tf.results.scoring import MLPERF_READING, Ranking, Score

# The nine layers in words, as a reader says them (a record's keys: record.LAYER_KEYS).
LAYER_NAMES = {
    "L1": "hardware",
    "L2": "operating system",
    "L3": "communication",
    "L4": "accelerator libraries",
    "L5": "framework",
    "L6": "programming model",
    "L7": "workload",
    "L8": "hyperparameters",
    "L9": "problem",
}

console = Console()


def si(value: float | None, unit: str) -> str:
    """A number with an SI prefix: si(2.01e16, 'FLOPS') -> '20.10 PFLOPS'."""
    if value is None:
        return "-"
    for factor, prefix in (
        (1e18, "E"),
        (1e15, "P"),
        (1e12, "T"),
        (1e9, "G"),
        (1e6, "M"),
        (1e3, "k"),
    ):
        if abs(value) >= factor:
            return f"{value / factor:.2f} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min ({seconds:.0f} s)"
    return f"{seconds / 3600:.2f} h ({seconds:.0f} s)"


def escape(value) -> str:
    """Text from records, logs or paths as markup that shows it as it is."""
    return escape_markup(printable(value))


def _value(value) -> str:
    """A layer value as markup: the value itself escaped."""
    if value is None:
        return "[dim]not observed[/dim]"
    if isinstance(value, list):
        if value and isinstance(value[0], dict):
            text = "; ".join(", ".join(f"{k}={v}" for k, v in item.items()) for item in value)
        else:
            text = ", ".join(str(v) for v in value) or "-"
    elif isinstance(value, int) and not isinstance(value, bool) and value > 1 << 30:
        text = f"{value / (1 << 30):.1f} GiB"
    else:
        text = str(value)
    return escape(text)


def layers_table(layers: dict[str, dict], title: str = "The nine layers") -> Table:
    table = Table(title=title)
    table.add_column("Layer", style="bold", no_wrap=True)
    table.add_column("Field")
    table.add_column("Value", overflow="fold")
    for layer, fields in layers.items():
        name = f"{layer} {LAYER_NAMES[layer]}"
        if table.row_count:
            table.add_section()
        for index, (key, value) in enumerate(fields.items()):
            table.add_row(name if index == 0 else "", escape(key), _value(value))
    return table


def cluster_table(plan: dict) -> Table:
    """The cluster `cluster.cluster_plan` found: this task, then every worker's address."""
    table = Table(title=escape(f"Cluster: {plan['found']}"), show_header=False)
    table.add_column("", style="bold", no_wrap=True)
    table.add_column("", overflow="fold")
    here = f"{plan['host']}" + (f" ({plan['address']})" if plan["address"] else "")
    table.add_row("This task", escape(f"index {plan['index']} on {here}"))
    if plan["local_index"] is not None:
        table.add_row("On its node", f"local task {plan['local_index']} of {plan['tasks_on_node']}")
    gpus = ", ".join(plan["gpus"]) or "none"
    layout = f" ({plan['gpu_layout']})" if plan["gpu_layout"] else ""
    table.add_row("GPUs", escape(gpus + layout))
    table.add_row("CPUs", escape(f"{plan['cpus']} ({plan['cpus_from']})"))
    if plan["warning"]:
        table.add_row("Warning", Text(printable(plan["warning"]), style="yellow"))
    table.add_row("Collective", f"{plan['collective']} (communication.collective=auto)")
    port = escape(plan["ports"]["this_task"])
    if plan["address"]:
        port = f"{escape(plan['address'].rpartition(':')[2])}: {port}"
    if plan["port_free"] is False:
        port += " [red]in use here[/red]"
    table.add_row("Port", port)
    if plan["job_id"] is not None:
        table.add_row("Slurm job", escape(plan["job_id"]))
    for index, address in enumerate(plan["workers"]):
        mark = " [bold](this task)[/bold]" if index == plan["index"] else ""
        table.add_row("Workers" if index == 0 else "", f"{index}: {escape(address)}{mark}")
    return table


def score_table(path: str, record: dict, score: Score) -> Table:
    table = Table(
        title=escape(f"{record['benchmark']} / {record['preset']}: {path}"), show_header=False
    )
    table.add_column("", style="bold")
    table.add_column("")
    quality = record["quality"]
    reached = "reached" if quality["reached_target"] else "[red]not reached[/red]"
    table.add_row("Status", escape(record["status"]))
    table.add_row(
        "Quality",
        f"{score.quality:.4f} {escape(quality['metric'])} (target {score.target}, {reached})",
    )
    reading = (
        score.reading
        if score.reading.startswith(MLPERF_READING)
        else "the score's reading: the end of the last required epoch, SPEC section 3"
    )
    table.add_row("Time to quality", f"{duration(score.time_to_quality_s)} ({escape(reading)})")
    crossing = quality["first_crossing"]
    table.add_row(
        "First on target",
        "never"
        if crossing is None
        else f"{duration(crossing['elapsed_s'])} at epoch {crossing['epoch']:g}, quality "
        f"{crossing['value']:.4f} (MLPerf's reading; not scored)",
    )
    method = (
        record["flops"]["method"]
        if score.flop_basis == record["flops"]["basis"]
        else (f"recounted on the {score.flop_basis} basis of the '{score.convention}' convention")
    )
    table.add_row("Total FLOPs", f"{score.total_flops:.4g} ({escape(method)})")
    table.add_row("FLOP basis", escape(f"{score.flop_basis} (convention: {score.convention})"))
    table.add_row("FLOPS", si(score.flops, "FLOPS"))
    penalty = f"(q/target)^{score.penalty_exponent:g} = {score.quality_factor:.4f}"
    if score.capped:
        penalty += " (capped at 1)"
    table.add_row("Quality factor", penalty)
    table.add_row("Valid FLOPS", f"[bold green]{si(score.valid_flops, 'FLOPS')}[/bold green]")
    if score.valid_flops_per_watt is not None:
        scope = escape(record["energy"]["scope"])
        table.add_row("Average power", f"{si(score.average_watts, 'W')} ({scope})")
        table.add_row(
            "Valid FLOPS per watt",
            f"[bold green]{si(score.valid_flops_per_watt, 'FLOPS/W')}[/bold green] ({scope})",
        )
    table.add_row("Energy", escape(score.energy_note))
    if not record["rankable"]:
        reasons = escape("; ".join(record["not_rankable_reasons"]))
        table.add_row("Rankable", f"[yellow]no[/yellow]: {reasons}")
    for warning in record["warnings"]:
        table.add_row("Warning", Text(printable(warning), style="yellow"))
    return table


def runs_text(submission) -> str:
    """How many runs a submission has, and of them how many did not converge (MLPerf's)."""
    runs = str(len(submission.paths) + len(submission.not_converged))
    if submission.not_converged:
        runs += f" ({len(submission.not_converged)} did not converge)"
    return runs


def accelerators_text(system: dict) -> str:
    """'16 x NVIDIA H100' from a submission's system facts; '-' where they do not say."""
    model, count = system.get("accelerator"), system.get("accelerators")
    if model is None:
        return "none" if count == 0 else "-"
    return f"{count} x {model}" if count is not None else str(model)


def ranking_table(ranking: Ranking) -> Table:
    """The ranking, one row per submission; its flags as numbered notes under the table."""
    bases = sorted({x.flop_basis for s in ranking.submissions for x in s.scores})
    notes = list(dict.fromkeys(note for s in ranking.submissions for note in s.notes))
    caption = [f"FLOP basis: {', '.join(bases)}"] if bases else []
    caption += [f"[{number}] {note}" for number, note in enumerate(notes, start=1)]
    table = Table(
        title=escape(
            f"{ranking.benchmark}: {ranking.level} level, convention {ranking.convention}"
        ),
        caption=escape("\n".join(caption + ranking.warnings)) or None,
    )
    for column in ("#", "System", "Accelerators", "Nodes", "Framework", "Runs", "Valid FLOPS",
                   "Time to quality", "Quality", "Flags"):  # fmt: skip
        table.add_column(column)
    for position, s in enumerate(ranking.submissions, start=1):
        nodes, framework = s.system.get("nodes"), s.system.get("framework")
        flags = " ".join(f"[{notes.index(note) + 1}]" for note in s.notes)
        table.add_row(
            str(position),
            escape(s.label),
            escape(accelerators_text(s.system)),
            "-" if nodes is None else escape(nodes),
            "-" if framework is None else escape(framework),
            runs_text(s),
            si(s.valid_flops, "FLOPS"),
            duration(s.time_to_quality_s),
            f"{s.quality:.4f}",
            Text(flags, style="red") if flags else "-",
        )
    return table


def refused_table(refused: list[tuple[str, list[str]]]) -> Table:
    table = Table(title="Refused records", show_lines=True)
    table.add_column("Record", overflow="fold")
    table.add_column("Rule broken", overflow="fold")
    for path, reasons in refused:
        table.add_row(escape(path), escape("\n".join(reasons)))
    return table


def flops_table(benchmark: str, preset: str, report: dict) -> Table:
    table = Table(
        title=f"{benchmark} / {preset}: FLOPs per example "
        f"(global batch {report['global_batch']}, {report['precision']})"
    )
    table.add_column("Pass")
    table.add_column("Profiled (TF op statistics)", justify="right")
    table.add_column("Analytical (conv + dense)", justify="right")
    forward, analytical = report["per_example_forward"], report["analytical_per_example_forward"]
    table.add_row("forward", si(forward, "FLOPs"), si(analytical, "FLOPs"))
    table.add_row(
        "training (fwd + bwd + update)",
        si(report["per_example_training"], "FLOPs"),
        si(3 * analytical, "FLOPs") + " (3 x forward)",
    )
    table.caption = escape("uncounted op types: " + ", ".join(report["uncounted_op_types"]))
    return table


def ceilings_table(result: dict) -> Table:
    table = Table(title=f"Ceilings ({result['plan']} sweep)")
    for column in (
        "dtype",
        "GEMM",
        "conv",
        "bandwidth",
        "ridge (FLOP/B)",
        "theoretical",
        "efficiency",
    ):
        table.add_column(column)
    bandwidth = result["bandwidth_ceiling"]
    for dtype, r in result["dtypes"].items():
        efficiency = f"{r['efficiency']:.0%}" if r["efficiency"] else "-"
        ridge = f"{r['ridge_point']:.1f}" if r["ridge_point"] else "-"
        table.add_row(
            dtype,
            si(r["gemm_ceiling"], "FLOPS"),
            si(r["conv_ceiling"], "FLOPS"),
            si(bandwidth, "B/s"),
            ridge,
            si(r["theoretical_peak"], "FLOPS"),
            efficiency,
        )
    notes = [
        f"{dtype}: {r['peak_warning']}"
        for dtype, r in result["dtypes"].items()
        if r.get("peak_warning")
    ]
    if result["skipped"]:
        notes.append(
            "skipped: "
            + "; ".join(f"{what}: {reason}" for what, reason in result["skipped"].items())
        )
    if notes:
        table.caption = escape("\n".join(notes))
    return table


def workload_table(result: dict) -> Table:
    work = result["workload"]
    roof = result["dtypes"].get(work["dtype"], {})
    compute = max(
        (v for v in (roof.get("gemm_ceiling"), roof.get("conv_ceiling")) if v), default=None
    )
    bandwidth = result["bandwidth_ceiling"]
    table = Table(
        title=escape(
            f"{result['benchmark']} / {result['preset']} on the roofline "
            f"({work['dtype']}, batch {work['batch']})"
        )
    )
    for column in ("layer", "count", "FLOP/B", "achieved", "bound", "of roof"):
        table.add_column(column)
    rows = [
        (p["layer"], str(p["count"]), p["operational_intensity"], p["achieved_flops"])
        for p in work["layers"]
    ]
    step = work["step"]
    rows.append(("whole train step", "1", step["operational_intensity"], step["achieved_flops"]))
    for name, count, intensity, achieved in rows:
        if compute and bandwidth:
            roof_here = min(compute, bandwidth * intensity)
            bound = "memory" if bandwidth * intensity < compute else "compute"
            share = f"{achieved / roof_here:.0%}"
        else:
            bound, share = "-", "-"
        table.add_row(escape(name), count, f"{intensity:.1f}", si(achieved, "FLOPS"), bound, share)
    return table


def power_table(measurements: list[dict], meter: dict | None) -> Table:
    table = Table(title="Power sources on this machine")
    for column in ("Source", "Measures", "Method", "Average power", "Readings", "Coverage"):
        table.add_column(column, overflow="fold")
    rows = [*measurements, *([meter] if meter else [])]
    for item in rows:
        readings = f"{item['samples']} ({item['sample_hz']:.3g}/s)"
        if item["failed_reads"]:
            failed = escape(f"{item['failed_reads']} failed: {item['first_error']}")
            readings += f", [red]{failed}[/red]"
        table.add_row(
            escape(item["name"]),
            escape(item["part"]),
            escape(item["method"]),
            si(item["average_watts"], "W"),
            readings,
            f"{item['coverage']:.1%}",
        )
    return table


def scaling_table(series: Series) -> Table:
    table = Table(title=escape(f"{series.kind.capitalize()} scaling: {series.label}"))
    for column in (
        "Replicas",
        "Workers",
        "Runs",
        "Batch",
        "Per replica",
        "Examples/s",
        "Speedup",
        "Efficiency",
        "TTQ",
        "TTQ eff.",
    ):
        table.add_column(column)
    for row in series.rows:
        p = row.point
        table.add_row(
            str(p.replicas),
            str(p.workers),
            str(len(p.paths)),
            str(p.global_batch),
            str(p.batch_per_replica),
            f"{p.throughput:,.0f}",
            f"{row.speedup:.2f}x",
            f"{row.efficiency:.1%}",
            duration(p.time_to_quality_s) if p.time_to_quality_s else "-",
            "-" if row.ttq_efficiency is None else f"{row.ttq_efficiency:.1%}",
        )
    return table


def comparison_tables(comparison: Comparison, path_a: str, path_b: str) -> list:
    layers = Table(title="Layers that differ (A -> B)")
    for column in ("Layer", "Field", "A", "B"):
        layers.add_column(column, overflow="fold")
    for d in comparison.differences:
        layers.add_row(
            f"{d.layer} {LAYER_NAMES[d.layer]}", escape(d.field), _value(d.a), _value(d.b)
        )
    if comparison.unknown:
        fields = ", ".join(f"{u.layer}.{u.field}" for u in comparison.unknown[:8])
        more = f" and {len(comparison.unknown) - 8} more" if len(comparison.unknown) > 8 else ""
        layers.caption = escape(f"recorded by one side only (equality unknown): {fields}{more}")
    verdict = Text(printable(comparison.verdict), style="green" if comparison.valid else "yellow")
    results = Table(
        title=escape(f"A: {path_a}\nB: {path_b}"),
        caption=escape(
            "\n".join(
                [f"FLOP basis: A {comparison.flop_bases[0]}, B {comparison.flop_bases[1]}"]
                + [f"Warning: {w}" for w in comparison.warnings]
            )
        ),
    )
    for column in ("Result", "A", "B", "B/A"):
        results.add_column(column)
    for m in comparison.metrics:
        unit = m.unit if m.unit not in ("s",) else ""

        def show(value, unit=unit, m=m):
            if value is None:
                return "-"
            if m.unit == "s":
                return duration(value)
            if m.name.endswith("quality"):
                return f"{value:.4f}"
            return (
                si(value, unit) if unit in ("FLOPS", "FLOPS/W", "FLOPs", "W") else f"{value:,.1f}"
            )

        ratio = "-" if m.ratio is None else f"{m.ratio:.3f}x"
        results.add_row(escape(f"{m.name} ({m.unit})"), show(m.a), show(m.b), ratio)
    return [layers if comparison.differences else "[dim]no layer differs[/dim]", verdict, results]
