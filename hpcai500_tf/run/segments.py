"""`train --resume-or-start RUN_DIR`: one command for every segment of a run a scheduler
starts again and again (a Slurm job that requeues itself, tools/slurm_train.sbatch).

The first start trains a new run in RUN_DIR (made if missing); each later one resumes it from
the checkpoint its state names: every task of the job decides alike, from what RUN_DIR holds
before any framework loads. A run that ended (its record there without a resume state) is
never started again; a start that ended before its first checkpoint is started anew, its
files kept in RUN_DIR/unsaved-start-N (the run's writer sets them aside, under its lock).
Pure Python: no framework is imported here.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpcai500_tf.errors import UserError
from hpcai500_tf.run.directory import RunDirectory
from hpcai500_tf.run.state import record_status


def resume_or_start(path: str | Path) -> tuple[str | None, str | None]:
    """(the run to resume, the directory to start a new run in): one of them is None."""
    directory = RunDirectory(path)
    if os.path.lexists(directory.state):
        return str(path), None  # checked like any --resume, before a framework loads
    status = record_status(directory.path)  # of any version: still an ended run
    if status is not None:
        raise UserError(
            f"{path}: its run ended ({status}, {directory.record}) with no checkpoint to "
            "resume: start a new run in another directory"
        )
    if os.path.lexists(path) and not os.path.isdir(path):
        raise UserError(f"{path}: not a directory; --resume-or-start needs one for the run")
    Path(path).mkdir(parents=True, exist_ok=True)
    return None, str(path)


def resolve(args) -> None:
    """`--resume-or-start` as `--resume` or the run directory to start in, on `args`."""
    if not getattr(args, "resume_or_start", None):
        return
    if args.resume or args.run_dir or args.workers is not None:
        raise UserError(
            "--resume-or-start is for a run whose tasks a scheduler starts: use it alone, "
            "without --resume or --workers"
        )
    args.resume, args.run_dir = resume_or_start(args.resume_or_start)
