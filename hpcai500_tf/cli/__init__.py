"""The hpcai500-tf command: parses arguments, dispatches, prints. The logic lives elsewhere.

Each command's arguments and handler live in one module of this package (train.py; machine.py:
sysinfo, cluster, power, roofline, flops; results.py: score, rank, compare, scaling; mlperf.py:
import-mlperf; report.py), whose `PARSERS` maps the command to the function that adds its
arguments and sets its handler. COMMANDS below lists the commands in `--help`'s order, with
each one's module and help line; a command's module is imported only when that command is the
one parsed, so `hpcai500-tf train --help` loads train.py alone."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from hpcai500_tf import __version__
from hpcai500_tf.errors import ArgumentParser, UserError, one_line
from hpcai500_tf.tensorflow_import import keep_tensorflow_quiet

# command: (its module in this package, its line in `hpcai500-tf --help`)
COMMANDS = {
    "train": ("train", "run a benchmark to its epoch budget and score it"),
    "flops": ("machine", "FLOPs per example of a benchmark's train step (reads no data)"),
    "roofline": (
        "machine",
        "measure GEMM, convolution and bandwidth ceilings; place a workload",
    ),
    "compare": ("results", "two records side by side: differing layers, fairness, B/A ratios"),
    "import-mlperf": (
        "mlperf",
        "a record from an MLPerf training log of any framework, or one per ResNet result "
        "of an MLPerf results tree",
    ),
    "scaling": (
        "results",
        "throughput and time-to-quality against worker count, with efficiency",
    ),
    "power": ("machine", "list the power sources here and take a short live reading"),
    "sysinfo": ("machine", "show the observable layers of this machine"),
    "cluster": (
        "machine",
        "show the multi-worker cluster this process would join (Slurm, TF_CONFIG or a "
        "single worker), without joining it",
    ),
    "score": ("results", "recompute FLOPS and Valid FLOPS of result records"),
    "rank": ("results", "rank comparable result records by Valid FLOPS"),
    "report": ("report", "an HTML page per run (score, charts, layers) and a ranking page"),
}


class _Commands(argparse._SubParsersAction):
    """argparse's subcommands, each given its arguments by its module as it is parsed."""

    def __call__(self, parser, namespace, values, option_string=None):
        chosen = self._name_parser_map.get(values[0])
        if chosen is not None and chosen.get_default("handler") is None:
            module = importlib.import_module(f"{__name__}.{COMMANDS[values[0]][0]}")
            module.PARSERS[values[0]](chosen)
        super().__call__(parser, namespace, values, option_string)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="hpcai500-tf",
        description="HPC AI500 V2.0 benchmark in TensorFlow/Keras.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", action=_Commands
    )
    for name, (_, line) in COMMANDS.items():
        commands.add_parser(name, help=line)
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
