"""The hpcai500-tf command: parses arguments, dispatches, prints. The logic lives elsewhere."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path

from hpcai500_tf import __version__
from hpcai500_tf.errors import ArgumentParser, UserError, one_line
from hpcai500_tf.report.text import printable
from hpcai500_tf.tensorflow_import import import_tensorflow, keep_tensorflow_quiet

MAX_POWER_SECONDS = 86_400


def _sysinfo(args: argparse.Namespace) -> int:
    import_tensorflow()
    from hpcai500_tf import benchmark_layers

    observed = benchmark_layers.system_layers()
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
    from hpcai500_tf.engine import cluster

    plan = cluster.cluster_plan()
    if args.json:
        print(json.dumps(plan, indent=2))
        return 0
    from hpcai500_tf.report.console import cluster_table, console

    console.print(cluster_table(plan))
    return 0


def _load_records(paths: list[str]) -> list[tuple[str, dict]]:
    from hpcai500_tf import record

    return [(path, record.load(path)) for path in paths]


def _score(args: argparse.Namespace) -> int:
    from hpcai500_tf import config
    from hpcai500_tf.results import scoring

    results = []
    for path, rec in _load_records(args.records):
        benchmark = config.load_benchmark(rec["benchmark"])
        results.append((path, rec, scoring.score(rec, benchmark, args.cap, args.convention)))
    if args.json:
        from dataclasses import asdict

        print(json.dumps([{"record": p, **asdict(s)} for p, _, s in results], indent=2))
        return 0
    from hpcai500_tf.report.console import console, escape, score_table

    for path, rec, score in results:
        console.print(score_table(path, rec, score))
    warning = scoring.mixed_bases([score for *_, score in results])
    if warning:
        console.print(f"Warning: {escape(warning)}", style="yellow")
    return 0


def _rank(args: argparse.Namespace) -> int:
    from hpcai500_tf.results import scoring

    rankings = scoring.rank_records(
        _load_records(args.records),
        args.benchmark,
        args.level,
        args.cap,
        args.convention,
        args.max_cv,
        args.published,
    )
    if args.json:
        rendered = [scoring.ranking_to_json(r) for r in rankings]
        print(json.dumps(rendered[0] if len(rendered) == 1 else rendered, indent=2))
        return 0
    from hpcai500_tf.report.console import console, ranking_table, refused_table

    for ranking in rankings:
        console.print(ranking_table(ranking))
    if rankings[-1].refused:
        console.print(refused_table(rankings[-1].refused))
    return 0


def _directory(flag: str, path: str) -> Path:
    """files.check_output_directory: the one output-directory check."""
    from hpcai500_tf.files import check_output_directory

    return check_output_directory(flag, path)


def _framework(args: argparse.Namespace) -> str:
    """The framework a run trains with: --framework, or a resumed run's own (from its state);
    one line where they disagree."""
    if not args.resume:
        return args.framework or "tensorflow"
    from hpcai500_tf.run import run_state
    from hpcai500_tf.run.run_directory import CONFIG_FILE

    run_dir = Path(args.resume)
    if not (run_dir / CONFIG_FILE).is_file():
        raise UserError(f"{args.resume}: not a run directory (no {CONFIG_FILE})")
    run_state.check_run_files(run_dir)
    trained = run_state.read_state(run_dir)["framework"]
    if args.framework and args.framework != trained:
        raise UserError(
            f"{args.resume}: it was trained with {trained}; resume it with --framework "
            f"{trained} (or --resume alone)"
        )
    return trained


def _backend(framework: str):
    """The framework's module, whose `run(setup, options, view)` trains; for PyTorch, in a
    process that then refuses TensorFlow (pytorch/feeder.py says why)."""
    if framework == "tensorflow":
        import_tensorflow()
        from hpcai500_tf.engine import run

        return run
    sys.modules["tensorflow"] = None  # an import of it fails here, loudly, not in triton later
    # c10d's C++ warnings (a rendezvous retrying, say: dozens of lines) kept off stderr; its
    # errors reach the run's one line. Read when torch loads; a setting of the user's is kept.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from hpcai500_tf.pytorch import build, train

    build.import_torch()  # a missing or unusable torch is one line naming the extra
    return train


def _train(args: argparse.Namespace) -> int:
    from hpcai500_tf import config
    from hpcai500_tf.energy.sampler import check_rate
    from hpcai500_tf.engine.cluster import strategy_overrides
    from hpcai500_tf.lifecycle import RunOptions, WorkerRunEnded, exit_code
    from hpcai500_tf.report.streams import keep_console
    from hpcai500_tf.run import segments

    keep_console()  # a console that goes away (`| head`) ends the output, never the run
    check_rate("--power-hz", args.power_hz, may_be_off=True)
    segments.resolve(args)  # --resume-or-start: --resume, or a new run in that directory
    if not args.resume:
        _directory("--out", args.out)
    framework = _framework(args)
    if args.device != "auto" and framework != "pytorch":
        raise UserError("--device is for --framework pytorch (TensorFlow uses what it sees)")
    launching = args.workers is not None
    overrides = [*args.set, *strategy_overrides(launching, framework)]
    if args.resume:  # validated before any framework loads
        setup = config.resume_setup(
            args.resume, args.benchmark, args.preset, overrides, args.config
        )
        from hpcai500_tf.run import run_state

        run_state.check_resumable(args.resume, setup.training.epochs)
    else:
        setup = config.run_setup(args.benchmark, args.preset, overrides, args.config)
    if launching:
        from hpcai500_tf import launch

        worker_args = launch.worker_args(args)
        return launch.launch(
            setup, worker_args, args.workers, args.out, args.resume, framework=framework
        )
    options = RunOptions(
        data_dir=args.data,
        out_dir=args.out,
        resume=args.resume,
        power_hz=args.power_hz,
        meter_log=args.meter_log,
        run_dir=args.run_dir,
        tensorboard=args.tensorboard,
        profile_steps=args.profile_steps,
        allow_cpu=args.allow_cpu,
        device=args.device,
    )
    backend = _backend(framework)
    from hpcai500_tf.report.console import console, escape, score_table
    from hpcai500_tf.report.live import LiveView
    from hpcai500_tf.results import scoring

    title = f"[bold]{escape(setup.benchmark.title)}[/bold], preset '{escape(setup.preset)}'"
    console.print(title + (" (PyTorch)" if framework == "pytorch" else ""))
    view = LiveView()
    try:
        record, path = backend.run(setup, options, view)
    except WorkerRunEnded as ended:
        print(f"hpcai500-tf: {one_line(ended)}", file=sys.stderr, flush=True)
        backend.end_worker(ended.code)  # TensorFlow's shutdown would wait for a peer
        return ended.code
    finally:
        view.close()
    code = 0
    if record is None:
        pass  # a worker other than the chief: the chief reports the run
    elif record["status"] != "completed":
        _print_record_line(record, path)
        warnings = escape("; ".join(record["warnings"]))
        console.print(f"[red]run {record['status']}[/red]: {warnings}")
        code = exit_code(record)  # 143 when SIGTERM stopped it
    elif not record["quality"]["measured"]:
        _print_record_line(record, path)
        console.print("throughput-only run (random data): quality not measured, no score")
    else:
        _print_record_line(record, path)
        benchmark = config.load_benchmark(record["benchmark"])
        console.print(score_table(str(path), record, scoring.score(record, benchmark)))
    if setup.training.strategy == "multi_worker":
        backend.end_worker(code)  # TensorFlow's shutdown waits for a lost peer; see each backend
    return code


def _print_record_line(record: dict, path) -> None:
    from hpcai500_tf.report.console import console

    console.print(f"record: {path}\nMLPerf log: {record['artifacts']['mlperf_log']}", markup=False)


def _scaling(args: argparse.Namespace) -> int:
    from hpcai500_tf.files import check_output_directory
    from hpcai500_tf.results import scaling

    series = scaling.analyse(_load_records(args.records))
    out = check_output_directory("--out", args.out)
    taken = [p for p in (out / "scaling.png", out / "scaling.svg") if p.exists()]
    if taken:
        raise UserError(f"{taken[0]}: already exists; choose another --out")
    images = scaling.chart(series, out)
    if args.json:
        print(json.dumps(scaling.to_json(series), indent=2))
        return 0
    from hpcai500_tf.report.console import console, scaling_table

    for one in series:
        console.print(scaling_table(one))
    console.print(f"chart: {', '.join(map(str, images))}", markup=False)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from hpcai500_tf import config
    from hpcai500_tf.results import compare

    (path_a, a), (path_b, b) = _load_records([args.a, args.b])
    for rec in (a, b):
        config.load_benchmark(rec["benchmark"])  # an unknown benchmark is refused
    comparison = compare.compare(a, b, cap=args.cap)
    if args.json:
        print(json.dumps(compare.to_json(comparison, path_a, path_b), indent=2))
        return 0
    from hpcai500_tf.report.console import comparison_tables, console

    for table in comparison_tables(comparison, path_a, path_b):
        console.print(table)
    return 0


def _import_mlperf_tree(args: argparse.Namespace) -> int:
    """import-mlperf of an MLPerf results tree: a record per ResNet result file in --out."""
    from hpcai500_tf.files import check_output_directory
    from hpcai500_tf.mlperf import mlperf_tree

    for flag, value in (("--sidecar", args.sidecar), ("--benchmark", args.benchmark)):
        if value is not None:
            raise UserError(
                f"{flag} is for one log; a results tree takes its layers from its system "
                "descriptions and is ResNet (image_classification)"
            )
    if args.out is None:
        raise UserError(
            f"{args.log}: a results tree needs --out DIR, the directory for its records"
        )
    out = check_output_directory("--out", args.out)
    given = {
        key: getattr(args, key)
        for key in ("framework", "framework_version", "flops_per_example")
        if getattr(args, key) is not None
    }
    done = mlperf_tree.import_tree(Path(args.log), out, given)
    for path, reason in done.skipped:
        shown = reason if reason.startswith(str(path)) else f"{path}: {reason}"
        print(f"skipped {printable(shown)}")
    for path, warning in done.warnings:
        shown = warning if warning.startswith(str(path)) else f"{path}: {warning}"
        print(f"warning {printable(shown)}")
    if not done.written and not done.existing:
        raise UserError(
            f"{args.log}: nothing imported: none of its {done.found} result file(s) could be "
            "(each is listed above with the reason)"
        )
    shown = printable(out)
    if done.written:
        already = f"{len(done.existing)} already imported; " if done.existing else ""
        print(
            f"imported {len(done.written)} of {done.found} result file(s) into {shown}; "
            f"{already}{len(done.skipped)} skipped"
        )
    else:  # every result that could be read was imported before: nothing is wrong
        print(
            f"nothing new: {len(done.existing)} of {done.found} result file(s) already imported "
            f"into {shown} (kept, not rewritten); {len(done.skipped)} skipped"
        )
    return 0


def _import_mlperf(args: argparse.Namespace) -> int:
    from hpcai500_tf import record as record_io
    from hpcai500_tf.mlperf import mlperf_import

    try:
        tree = Path(args.log).is_dir()
    except OSError as error:  # e.g. a name too long: said in one line
        raise UserError(f"{args.log}: {error.strerror or error}") from None
    if tree:
        return _import_mlperf_tree(args)
    sidecar = mlperf_import.read_sidecar(args.sidecar)
    for key in ("framework", "framework_version", "flops_per_example"):
        if getattr(args, key) is not None:
            sidecar[key] = getattr(args, key)
    rec, warnings = mlperf_import.build_record(args.log, sidecar, args.benchmark)
    out = args.out or f"{args.log}.record.json"
    record_io.save(out, rec)
    from hpcai500_tf.report.console import console, escape

    for warning in warnings:
        console.print(f"[yellow]warning[/yellow]: {escape(warning)}")
    console.print(f"record: {out}", markup=False)
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
    import_tensorflow()
    from hpcai500_tf.engine import run

    report = run.flops_report(setup, args.allow_cpu)
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


def _step_range(text: str) -> tuple[int, int]:
    """`A-B` (or `A`): global train steps, counted from 1."""
    first, _, last = text.partition("-")
    try:
        steps = int(first), int(last or first)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A-B (train steps), got '{text}'") from None
    if not 1 <= steps[0] <= steps[1]:
        raise argparse.ArgumentTypeError(f"expected 1 <= A <= B, got '{text}'")
    return steps


def _report(args: argparse.Namespace) -> int:
    from hpcai500_tf.report import pages

    for page in pages.write_report(args.runs, args.out):
        print(page)
    return 0


def _add_run_arguments(parser: argparse.ArgumentParser, reads_data: bool = True) -> None:
    parser.add_argument(
        "benchmark",
        nargs="?",
        help="image_classification or extreme_weather (not needed with --config or --resume)",
    )
    parser.add_argument("--preset", help="reference, smoke or tiny (default smoke: built-in data)")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="your own TOML config: benchmark = ..., inherits = PRESET, then sections to change",
    )
    if reads_data:
        parser.add_argument(
            "--data", help="dataset: ImageNet TFRecords or ExtremeWeather .h5 files ('reference')"
        )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value, e.g. training.epochs=3 (repeatable)",
    )


def _add_allow_cpu(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-cpu",
        action="store_true",
        help="run even where TensorFlow sees fewer GPUs than this machine has (e.g. CUDA's "
        "libraries did not load); the record says so",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="hpcai500-tf",
        description="HPC AI500 V2.0 benchmark in TensorFlow/Keras.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = commands.add_parser("train", help="run a benchmark to its epoch budget and score it")
    _add_run_arguments(train)
    train.add_argument("--out", default="runs", help="where run directories go (default runs/)")
    train.add_argument(
        "--resume", metavar="RUN_DIR", help="continue a stopped run with the config saved in it"
    )
    train.add_argument(
        "--power-hz",
        type=float,
        default=10.0,
        help="power sampling rate during the run (default 10; 0 switches sampling off)",
    )
    train.add_argument(
        "--meter-log",
        metavar="FILE",
        help="a node power meter's log (timestamp,watts lines), read when the run ends",
    )
    train.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="start N worker processes on this machine (MultiWorkerMirroredStrategy)",
    )
    train.add_argument(
        "--tensorboard",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write TensorBoard scalars and HParams to RUN_DIR/tensorboard/ (default on)",
    )
    train.add_argument(
        "--profile-steps",
        type=_step_range,
        metavar="A-B",
        help="trace global train steps A to B with the TensorFlow profiler (TensorBoard's "
        "profile plugin); those steps run slower, and the record says so",
    )
    _add_allow_cpu(train)
    train.add_argument(
        "--framework",
        choices=("tensorflow", "pytorch"),
        help="tensorflow (default; a resumed run: its own), or pytorch: the same preset in "
        "plain PyTorch, for comparing L5 (needs the torch extra)",
    )
    train.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="with --framework pytorch: auto (default) trains on the GPU where torch sees one, "
        "else the CPU (refused where this machine's NVIDIA GPUs are not usable by this torch)",
    )
    train.add_argument(
        "--resume-or-start",
        metavar="RUN_DIR",
        help="resume the run in RUN_DIR, or start one there: every segment of a job that "
        "requeues itself (tools/slurm_train.sbatch)",
    )
    train.add_argument("--run-dir", help=argparse.SUPPRESS)  # set by the --workers launcher
    train.set_defaults(handler=_train)

    flops = commands.add_parser(
        "flops", help="FLOPs per example of a benchmark's train step (reads no data)"
    )
    _add_run_arguments(flops, reads_data=False)
    flops.add_argument("--json", action="store_true")
    _add_allow_cpu(flops)
    flops.set_defaults(handler=_flops)

    roofline = commands.add_parser(
        "roofline", help="measure GEMM, convolution and bandwidth ceilings; place a workload"
    )
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

    compare = commands.add_parser(
        "compare", help="two records side by side: differing layers, fairness, B/A ratios"
    )
    compare.add_argument("a", metavar="A", help="the baseline record")
    compare.add_argument("b", metavar="B", help="the record compared with it")
    compare.add_argument("--cap", action="store_true", help="cap the quality factor at 1")
    compare.add_argument("--json", action="store_true")
    compare.set_defaults(handler=_compare)

    importer = commands.add_parser(
        "import-mlperf",
        help="a record from an MLPerf training log of any framework, or one per ResNet result "
        "of an MLPerf results tree",
    )
    importer.add_argument(
        "log",
        metavar="LOG|TREE",
        help="one log, or a results tree: a repository (ORG/results/SYSTEM/resnet/"
        "result_N.txt, ORG/systems/SYSTEM.json), one submitter's folder or one system's",
    )
    importer.add_argument("--benchmark", help="default: from the log's submission_benchmark")
    importer.add_argument("--sidecar", help="JSON or TOML with what the log does not carry")
    importer.add_argument("--framework", help="e.g. pytorch (a tree: replaces the descriptions')")
    importer.add_argument("--framework-version")
    importer.add_argument(
        "--flops-per-example",
        type=float,
        help="training FLOPs per example (a tree: default ResNet-50 v1.5's analytical count)",
    )
    importer.add_argument(
        "--out",
        help="the record to write (default LOG.record.json); for a tree, the directory for its "
        "records (a record already there is kept, its result skipped)",
    )
    importer.set_defaults(handler=_import_mlperf)

    scaling = commands.add_parser(
        "scaling", help="throughput and time-to-quality against worker count, with efficiency"
    )
    scaling.add_argument("records", nargs="+", metavar="RECORD")
    scaling.add_argument("--out", default="runs/scaling", help="where the chart goes")
    scaling.add_argument("--json", action="store_true")
    scaling.set_defaults(handler=_scaling)

    power = commands.add_parser(
        "power", help="list the power sources here and take a short live reading"
    )
    power.add_argument("--seconds", type=float, default=2.0, help="reading length (default 2)")
    power.add_argument("--hz", type=float, default=10.0, help="sampling rate (default 10)")
    power.add_argument("--meter-log", metavar="FILE", help="check a node meter log's format")
    power.add_argument("--json", action="store_true")
    power.set_defaults(handler=_power)

    sysinfo = commands.add_parser("sysinfo", help="show the observable layers of this machine")
    sysinfo.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sysinfo.set_defaults(handler=_sysinfo)

    cluster = commands.add_parser(
        "cluster",
        help="show the multi-worker cluster this process would join (Slurm, TF_CONFIG or a "
        "single worker), without joining it",
    )
    cluster.add_argument("--json", action="store_true", help="print JSON instead of a table")
    cluster.set_defaults(handler=_cluster)

    score = commands.add_parser("score", help="recompute FLOPS and Valid FLOPS of result records")
    score.add_argument("records", nargs="+", metavar="RECORD")
    score.add_argument(
        "--cap",
        action="store_true",
        help="cap the quality factor at 1 (off by default, as published)",
    )
    score.add_argument(
        "--convention",
        default="stated",
        help="scoring convention from the benchmark config (default: stated)",
    )
    score.add_argument("--json", action="store_true")
    score.set_defaults(handler=_score)

    rank = commands.add_parser("rank", help="rank comparable result records by Valid FLOPS")
    rank.add_argument("records", nargs="+", metavar="RECORD")
    rank.add_argument("--level", default="free", help="free, system or hardware (default free)")
    rank.add_argument("--benchmark", help="rank this benchmark; other records are refused")
    rank.add_argument("--cap", action="store_true", help="cap the quality factor at 1")
    rank.add_argument(
        "--max-cv", type=float, help="flag submissions whose run-to-run variation exceeds this"
    )
    rank.add_argument(
        "--convention",
        default="stated",
        help="scoring convention from the benchmark config (default: stated, the rule as "
        "published; published-2020: what the July 2020 ranking's figures imply, the records "
        "placed among its nine entries)",
    )
    rank.add_argument(
        "--published",
        action="store_true",
        help="place the records among the nine entries of the July 2020 image-classification "
        "ranking (examples/published_2020/), scored by the stated rule and by the ranking's own "
        "conventions",
    )
    rank.add_argument("--json", action="store_true")
    rank.set_defaults(handler=_rank)

    report = commands.add_parser(
        "report", help="an HTML page per run (score, charts, layers) and a ranking page"
    )
    report.add_argument(
        "runs", nargs="+", metavar="RUN_DIR", help="run directories (or record files)"
    )
    report.add_argument(
        "--out",
        default="runs/report",
        metavar="DIR",
        help="a new or empty directory for the pages (default runs/report)",
    )
    report.set_defaults(handler=_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    keep_tensorflow_quiet()  # before any TensorFlow starts, here or in a worker process
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.handler(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except UserError as error:
        print(f"hpcai500-tf: error: {one_line(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:  # Ctrl-C: 130; SIGTERM (lifecycle.Terminated): 143
        print(f"hpcai500-tf: {one_line(stop) or 'interrupted'}", file=sys.stderr)
        return getattr(stop, "exit_code", 130)
    except BrokenPipeError:  # the reader left (e.g. `| head`): end quietly, as Python's docs say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as error:  # a path a user gave that no check above caught: still one line
        if error.filename is None:
            raise
        print(f"hpcai500-tf: error: {one_line(error.filename)}: {error.strerror}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
