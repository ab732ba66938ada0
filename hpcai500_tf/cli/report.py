"""`report`: an HTML page per run and a ranking page."""

from __future__ import annotations

import argparse


def _report(args: argparse.Namespace) -> int:
    from hpcai500_tf.report import pages

    for page in pages.write_report(args.runs, args.out):
        print(page)
    return 0


def _report_arguments(report: argparse.ArgumentParser) -> None:
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


PARSERS = {"report": _report_arguments}
