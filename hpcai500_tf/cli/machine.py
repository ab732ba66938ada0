"""What this machine offers: `sysinfo` (layers L1-L5), `cluster` (the workers it would join),
`power` (its power sources), `roofline` (its measured ceilings) and `flops` (a train step's
count here)."""

from __future__ import annotations

import argparse
import functools
import json

from hpcai500_tf.cli.train import add_allow_cpu, add_run_arguments
from hpcai500_tf.errors import UserError
from hpcai500_tf.tensorflow_import import import_tensorflow

MAX_POWER_SECONDS = 86_400


def _sysinfo(args: argparse.Namespace) -> int:
    from hpcai500_tf import backends

    observed = backends.get("tensorflow").system_layers()
    if args.json:
        print(json.dumps(observed, indent=2))
        return 0
    from hpcai500_tf.report.console import console, layers_table

    console.print(layers_table(observed, "This machine: layers L1-L5"))
    console.print(
        "[dim]L6-L9 (programming model, workload, hyperparameters, problem) are set "
        "by each run and recorded in its result file.[/dim]"
    )
    return 0


def _cluster(args: argparse.Namespace) -> int:
    from hpcai500_tf.cluster import workers

    plan = workers.cluster_plan()
    if args.json:
        print(json.dumps(plan, indent=2))
        return 0
    from hpcai500_tf.report.console import cluster_table, console

    console.print(cluster_table(plan))
    return 0


def _power(args: argparse.Namespace) -> int:
    from hpcai500_tf.energy import sampler, sources

    sampler.check_rate("--hz", args.hz, may_be_off=False)
    if not 0 < args.seconds <= MAX_POWER_SECONDS:
        raise UserError(f"--seconds must be in (0, {MAX_POWER_SECONDS}], got {args.seconds}")
    found, notes = sources.discover()
    measurements = sampler.live_reading(found, args.seconds, args.hz) if found else []
    meter, meter_warnings = (
        sampler.meter_log_summary(args.meter_log) if args.meter_log is not None else (None, [])
    )
    if args.json:
        report = {"sources": measurements, "missing": notes, "meter_log": meter}
        print(json.dumps({**report, "meter_log_warnings": meter_warnings}, indent=2))
        return 0
    from hpcai500_tf.report.console import console, escape, power_table

    if measurements or meter:
        console.print(power_table(measurements, meter))
    for warning in meter_warnings:
        console.print(f"[yellow]warning[/yellow]: {escape(warning)}")
    for note in notes:
        console.print(f"[yellow]not available[/yellow]: {escape(note)}")
    if not found and not meter:
        console.print(
            "[yellow]No power source here: a run on this machine records energy as not "
            "measured. A node meter log can be given with train --meter-log.[/yellow]"
        )
    return 0


def _flops(args: argparse.Namespace) -> int:
    from hpcai500_tf import config

    setup = config.without_data(
        config.run_setup(args.benchmark, args.preset, args.set, args.config)
    )
    from hpcai500_tf import backends

    report = backends.get("tensorflow").load().flops_report(setup, args.allow_cpu)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    from hpcai500_tf.report.console import console, flops_table

    console.print(flops_table(setup.benchmark.name, setup.preset, report))
    return 0


def _roofline(args: argparse.Namespace) -> int:
    from hpcai500_tf import config
    from hpcai500_tf.files import check_output_directory

    setup, run_record = config.roofline_setup(
        args.record, args.benchmark, args.preset, args.set, args.batch
    )
    out = check_output_directory("--out", args.out)
    import_tensorflow()
    from hpcai500_tf.report.console import ceilings_table, console, workload_table
    from hpcai500_tf.roofline import sweep

    plan_name, plan = sweep.choose_plan(args.quick, args.dtypes)
    say = functools.partial(console.print, markup=False)  # measurement text, not markup
    result, images = sweep.run_sweep(
        setup, plan_name, plan, out, not args.no_workload, run_record, args.record, say
    )
    console.print(ceilings_table(result))
    if result["workload"]:
        console.print(workload_table(result))
    console.print(
        f"record: {out / 'roofline.json'}\nchart: {', '.join(map(str, images))}", markup=False
    )
    return 0


def _flops_arguments(flops: argparse.ArgumentParser) -> None:
    add_run_arguments(flops, reads_data=False)
    flops.add_argument("--json", action="store_true")
    add_allow_cpu(flops)
    flops.set_defaults(handler=_flops)


def _roofline_arguments(roofline: argparse.ArgumentParser) -> None:
    roofline.add_argument("--quick", action="store_true", help="a sweep of under a minute")
    roofline.add_argument("--dtypes", help="comma-separated: fp64,fp32,tf32,bf16,fp16")
    roofline.add_argument("--benchmark", default="image_classification")
    roofline.add_argument("--preset", default="smoke", help="whose model is placed")
    roofline.add_argument("--batch", type=int, help="batch per replica for the workload")
    roofline.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    roofline.add_argument("--record", help="place this finished training run on the roofline")
    roofline.add_argument("--no-workload", action="store_true", help="ceilings only")
    roofline.add_argument("--out", default="runs/roofline", help="output directory")
    roofline.set_defaults(handler=_roofline)


def _power_arguments(power: argparse.ArgumentParser) -> None:
    power.add_argument("--seconds", type=float, default=2.0, help="reading length (default 2)")
    power.add_argument("--hz", type=float, default=10.0, help="sampling rate (default 10)")
    power.add_argument("--meter-log", metavar="FILE", help="check a node meter log's format")
    power.add_argument("--json", action="store_true")
    power.set_defaults(handler=_power)


def _sysinfo_arguments(sysinfo: argparse.ArgumentParser) -> None:
    sysinfo.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sysinfo.set_defaults(handler=_sysinfo)


def _cluster_arguments(cluster: argparse.ArgumentParser) -> None:
    cluster.add_argument("--json", action="store_true", help="print JSON instead of a table")
    cluster.set_defaults(handler=_cluster)


PARSERS = {
    "flops": _flops_arguments,
    "roofline": _roofline_arguments,
    "power": _power_arguments,
    "sysinfo": _sysinfo_arguments,
    "cluster": _cluster_arguments,
}
