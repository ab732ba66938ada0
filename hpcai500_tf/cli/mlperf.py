"""`import-mlperf`: a record from an MLPerf training log, or one per result of a results tree."""

from __future__ import annotations

import argparse
from pathlib import Path

from hpcai500_tf.errors import UserError
from hpcai500_tf.report.text import printable


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
    from hpcai500_tf.mlperf import mlperf_import, mlperf_tree

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
    rec, warnings = mlperf_tree.single_log_record(args.log, sidecar, args.benchmark)
    out = args.out or f"{args.log}.record.json"
    record_io.save(out, rec)
    from hpcai500_tf.report.console import console, escape

    for warning in warnings:
        console.print(f"[yellow]warning[/yellow]: {escape(warning)}")
    console.print(f"record: {out}", markup=False)
    return 0


def _import_mlperf_arguments(importer: argparse.ArgumentParser) -> None:
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


PARSERS = {"import-mlperf": _import_mlperf_arguments}
