"""`train`: one benchmark run to its epoch budget, scored. The setup is checked and resolved
here, before any framework loads; the backend from the registry (backends.py) trains it
(`lifecycle.run`); this prints the outcome. `flops` shares the run's arguments
(add_run_arguments, add_allow_cpu)."""

from __future__ import annotations

import argparse
import sys

from hpcai500_tf.errors import one_line

# backends.NAMES, written out: the registry is loaded by a run, not by `train --help`
# (tests/test_cli.py holds the two equal)
FRAMEWORKS = ("tensorflow", "pytorch")


def _train(args: argparse.Namespace) -> int:
    from hpcai500_tf.energy.sampler import check_rate
    from hpcai500_tf.files import check_output_directory
    from hpcai500_tf.report.streams import keep_console
    from hpcai500_tf.run import segments
    from hpcai500_tf.run.status import WorkerRunEnded

    keep_console()  # a console that goes away (`| head`) ends the output, never the run
    check_rate("--power-hz", args.power_hz, may_be_off=True)
    segments.resolve(args)  # --resume-or-start: --resume, or a new run in that directory
    if not args.resume:
        check_output_directory("--out", args.out)
    backend = _backend(args)
    backend.check_arguments(device=args.device)
    if args.ensemble:  # the members' form (run/ensemble.py): what it cannot go with, first
        from hpcai500_tf.run import ensemble

        ensemble.check_arguments(args, backend)
    if args.instances is not None:  # M runs at once, scored as one throughput
        from hpcai500_tf.run import instance_launch

        return instance_launch.train(args)
    setup, plan = _setup(args, backend)
    if args.workers is not None:
        from hpcai500_tf.run import launch

        worker_args = launch.worker_args(args)
        return launch.launch(
            setup, worker_args, args.workers, args.out, args.resume, framework=backend.name
        )
    options = _options(args, plan)
    backend.load()  # a missing or unusable framework is one line, before the title
    from hpcai500_tf.report.console import console, escape
    from hpcai500_tf.report.live import LiveView
    from hpcai500_tf.report.streams import LostStreams
    from hpcai500_tf.report.tensorboard import TensorBoard

    title = f"[bold]{escape(setup.benchmark.title)}[/bold], preset '{escape(setup.preset)}'"
    console.print(title + backend.title)
    view = LiveView()
    try:
        board = TensorBoard() if args.tensorboard else None
        record, path = backend.run(setup, options, [view, board, LostStreams()])
    except WorkerRunEnded as ended:
        print(f"hpcai500-tf: {one_line(ended)}", file=sys.stderr, flush=True)
        backend.end_worker(ended.code)  # TensorFlow's shutdown would wait for a peer
        return ended.code
    finally:
        view.close()
    code = _print_outcome(record, path)
    if setup.training.strategy == "multi_worker":
        backend.end_worker(code)  # TensorFlow's shutdown waits for a lost peer; see each backend
    return code


def _backend(args: argparse.Namespace):
    """The backend a run trains with (backends.py): --framework's, or a resumed run's own
    (from its state); one line where they disagree."""
    from hpcai500_tf import backends

    if not args.resume:
        return backends.get(args.framework or backends.DEFAULT)
    from hpcai500_tf.run import resume

    return backends.get(resume.trained_with(args.resume, args.framework))


def _setup(args: argparse.Namespace, backend):
    """The run's config resolved and checked, before any framework loads; for a resumed run,
    from its directory, with the resume plan (`run/resume.py`: its directory checked once)."""
    from hpcai500_tf import config

    overrides = [*args.set, *backend.strategy_overrides(args.workers is not None)]
    if not args.resume:
        return config.run_setup(args.benchmark, args.preset, overrides, args.config), None
    setup = config.resume_setup(args.resume, args.benchmark, args.preset, overrides, args.config)
    from hpcai500_tf.run import resume

    return setup, resume.plan(args.resume, setup.training.epochs)


def _options(args: argparse.Namespace, plan):
    from hpcai500_tf.run.options import RunOptions

    return RunOptions(
        data_dir=args.data,
        out_dir=args.out,
        resume=plan,
        power_hz=args.power_hz,
        meter_log=args.meter_log,
        run_dir=args.run_dir,
        start_over_unsaved=bool(args.resume_or_start),
        profile_steps=args.profile_steps,
        allow_cpu=args.allow_cpu,
        device=args.device,
    )


def _print_outcome(record: dict | None, path) -> int:
    """The record's path and its score (or why there is none); the exit code of the run."""
    from hpcai500_tf import config
    from hpcai500_tf.report.console import console, escape, score_table
    from hpcai500_tf.results import scoring
    from hpcai500_tf.run.status import exit_code

    if record is None:
        return 0  # a worker other than the chief: the chief reports the run
    console.print(f"record: {path}\nMLPerf log: {record['artifacts']['mlperf_log']}", markup=False)
    if record["status"] != "completed":
        warnings = escape("; ".join(record["warnings"]))
        console.print(f"[red]run {record['status']}[/red]: {warnings}")
        return exit_code(record)  # 143 when SIGTERM stopped it
    if not record["quality"]["measured"]:
        console.print("throughput-only run (random data): quality not measured, no score")
        return 0
    benchmark = config.load_benchmark(record["benchmark"])
    console.print(score_table(str(path), record, scoring.score(record, benchmark)))
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


def add_run_arguments(parser: argparse.ArgumentParser, reads_data: bool = True) -> None:
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


def add_allow_cpu(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-cpu",
        action="store_true",
        help="run even where TensorFlow sees fewer GPUs than this machine has (e.g. CUDA's "
        "libraries did not load); the record says so",
    )


def _train_arguments(train: argparse.ArgumentParser) -> None:
    add_run_arguments(train)
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
        "--instances",
        type=int,
        metavar="M",
        help="train M independent instances at once (each its own run; --workers N: N in all), "
        "scored as one throughput in models per minute (docs/throughput.md)",
    )
    train.add_argument(
        "--ensemble",
        action="store_true",
        help="with --instances M: train M ensemble members, each on its bootstrap sample of "
        "the training data, scored by the ensemble's quality (docs/throughput.md)",
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
    add_allow_cpu(train)
    train.add_argument(
        "--framework",
        choices=FRAMEWORKS,
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


PARSERS = {"train": _train_arguments}
