"""`train --resume`: a stopped run's directory checked once, before any framework loads, into
the plan the lifecycle continues (run/state.py holds the checks themselves)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpcai500_tf.errors import UserError
from hpcai500_tf.run import state as run_state
from hpcai500_tf.run.directory import RunDirectory


@dataclass(frozen=True)
class Plan:
    """A stopped run to continue: its directory, checked, and the framework it trained with."""

    run_dir: RunDirectory
    framework: str


def trained_with(path: str | Path, asked: str | None = None) -> str:
    """The framework the stopped run at `path` was trained with (its state says), checked
    against the one `asked` for (--framework; None: any)."""
    run_dir = _run_directory(path)
    run_state.check_run_files(run_dir.path)
    trained = run_state.read_state(run_dir.path)["framework"]
    if asked and asked != trained:
        raise other_framework(path, trained)
    return trained


def plan(path: str | Path, epochs: int) -> Plan:
    """Everything about the stopped run at `path` that can be checked before a framework
    loads (`state.check_resumable`); `epochs`: the run's budget, from its saved config."""
    run_dir = _run_directory(path)
    state = run_state.check_resumable(run_dir.path, epochs)
    return Plan(run_dir, state["framework"])


def plan_of(resume: Plan | str | Path | None, epochs: int) -> Plan | None:
    """The plan the CLI made, or one made now from a library caller's run directory."""
    if resume is None or isinstance(resume, Plan):
        return resume
    return plan(resume, epochs)


def other_framework(where: object, trained: str) -> UserError:
    """The refusal of a resume on another framework than the run's own."""
    return UserError(
        f"{where}: it was trained with {trained}; resume it with --framework {trained} "
        "(or --resume alone)"
    )


def _run_directory(path: str | Path) -> RunDirectory:
    run_dir = RunDirectory(path)
    if not run_dir.config.is_file():
        raise UserError(f"{path}: not a run directory (no {run_dir.config.name})")
    return run_dir
