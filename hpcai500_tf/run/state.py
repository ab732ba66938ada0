"""A stopped run's directory, trusted only once checked: what `train --resume` reads.

`check_resumable` runs in pure Python before any framework loads and before any worker starts:
every file and directory a resume reads or writes must be of its kind (a FIFO, a device or a
directory where a file belongs is refused, never opened), the resume state (state.json) must
match its schema, agree with itself (one epoch entry per epoch done, segments forward in time,
evaluations within the timed run) and with the run's budget, and the checkpoint it names must
be whole on disk (TensorFlow's index and data files, or PyTorch's ckpt-N.pt, whose every zip
member's CRC-32 is checked here). The framework's trainer then checks what only it can read,
before any training starts: the epoch count the checkpoint itself holds, and every tensor
(TensorFlow: its checksum; PyTorch: the file loads).

A resume refused here changes nothing in the run directory: its last record stays as it was.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path

from hpcai500_tf import backends
from hpcai500_tf import record as record_io
from hpcai500_tf.errors import UserError
from hpcai500_tf.files import read_regular_file, shard_set_problem
from hpcai500_tf.run.directory import (
    CHECKPOINTS,  # re-exported
    CONFIG_FILE,
    ERROR_LOG,
    LOCK_FILE,
    MLPERF_LOG,
    POWER_SAMPLES,
    RECORD_FILE,
    STATE_FILE,  # re-exported
    TENSORBOARD,
    WORKERS,
    RunDirectory,
)
from hpcai500_tf.validation import compile_shape, invalid

MAX_STATE_BYTES = 64 << 20  # a few hundred bytes an epoch: far more than any real run's
# ckpt-N: N epochs; ckpt-N-bB: and B batches of the next (a stop); ckpt: before numbering
PREFIX = re.compile(r"ckpt(?:-(\d+)(?:-b(\d+))?)?")

# What a resume reads, appends to or replaces, and the kind each must be where it exists.
# Logs are appended to, and the lock written, never through a symbolic link (files.py).
RUN_FILES = {
    CONFIG_FILE: "file",
    STATE_FILE: "file",
    RECORD_FILE: "file",
    MLPERF_LOG: "log",
    POWER_SAMPLES: "log",
    ERROR_LOG: "file",
    CHECKPOINTS: "directory",
    TENSORBOARD: "directory",
    WORKERS: "directory",
    LOCK_FILE: "lock",
}

_SEGMENT = {"start": "num", "stop": "num"}
_EPOCH = {"epoch": "int", "elapsed_s": "num", "examples": "int", "seconds": "num", "loss": "num"}
_POINT = {"epoch": "int", "elapsed_s": "num", "examples": "int", "value": "num"}
_CHECKPOINT = {"epoch": "int", "elapsed_s": "num", "write_s": "num"}
_SHAPE = {
    "config_fingerprint": "str",
    "epochs_done": "int",
    "examples": "int",
    "segments": [_SEGMENT],
    "epochs": [_EPOCH],
    "curve": [_POINT],
    "init_start": "num",
    "run_start": "num?",
    "energy": [["dict"]],  # per segment, per source: checked where the record is built
    "checkpoints": [_CHECKPOINT],
    "batches_done": "int",
    "epoch_seconds_done": "num",
    "checkpoint": "str",
    "framework": "str",
}
_CHECK_STATE = compile_shape(_SHAPE, closed=True)


def check_run_files(run_dir: Path) -> None:
    """Each file a resume touches is of its kind where it exists; one line naming it if not."""
    try:
        info = os.stat(run_dir)
    except OSError as error:
        raise UserError(f"{run_dir}: cannot open the run directory ({error.strerror})") from None
    if not stat.S_ISDIR(info.st_mode):
        raise UserError(f"{run_dir}: not a run directory (not a directory)")
    for name, kind in RUN_FILES.items():
        path = run_dir / name
        try:
            info = os.stat(path)  # follows a link: its target's kind is what is read
        except FileNotFoundError:
            if os.path.islink(path):
                raise UserError(f"{path}: a dangling symbolic link in the run directory") from None
            continue
        except OSError as error:
            raise UserError(f"{path}: cannot be read ({error.strerror})") from None
        if kind == "directory":
            if not stat.S_ISDIR(info.st_mode):
                raise UserError(f"{path}: not a directory; a run directory's {name} is one")
            continue
        if not stat.S_ISREG(info.st_mode):
            what = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise UserError(
                f"{path}: {what}; a resumed run reads or writes it as a file: "
                "move it out of the run directory"
            )
        if kind == "log" and os.path.islink(path):
            raise UserError(f"{path}: is a symbolic link; refusing to write a log through it")
        if kind == "lock" and os.path.islink(path):
            raise UserError(f"{path}: is a symbolic link; refusing to write a lock through it")


def read_state(run_dir: Path) -> dict:
    """The resume state in `run_dir`, checked against its schema and against itself."""
    path = RunDirectory(run_dir).state
    if not os.path.lexists(path):
        raise UserError(f"{run_dir}: no {STATE_FILE}: nothing to resume")
    text = read_regular_file(path, "resume state", MAX_STATE_BYTES)
    state = record_io.parse_json(text, path, "resume state")
    if isinstance(state, dict):
        state.setdefault("checkpoints", [])  # a state written before the list was kept
        state.setdefault("framework", backends.DEFAULT)  # written before PyTorch runs resumed
        state.setdefault("batches_done", 0)  # written before a stop checkpointed mid-epoch
        state.setdefault("epoch_seconds_done", 0.0)  # before their seconds were kept
    try:
        _CHECK_STATE(state, "", path)
        _check_counts(state, path)
    except UserError as error:
        raise UserError(f"{path}: corrupt resume state ({_reason(error, path)})") from None
    return state


def _reason(error: UserError, path: Path) -> str:
    return str(error).removeprefix(f"{path}: ")


def _check_counts(state: dict, path: Path) -> None:
    """What the shape cannot say: counts that must agree, time that only goes forward."""
    if state["framework"] not in backends.NAMES:
        raise invalid(path, "framework", " or ".join(backends.NAMES), state["framework"])
    done, epochs = state["epochs_done"], state["epochs"]
    if done < 0:
        raise invalid(path, "epochs_done", ">= 0", done)
    if len(epochs) != done:
        held = PREFIX.fullmatch(Path(state["checkpoint"]).name)
        named = f", and its checkpoint {held.group(0)}" if held and held.group(1) else ""
        raise UserError(
            f"epochs_done is {done}, but {len(epochs)} epochs are listed{named}: resume refused"
        )
    for index, epoch in enumerate(epochs):
        if epoch["epoch"] != index + 1:
            raise invalid(path, f"epochs[{index}].epoch", str(index + 1), epoch["epoch"])
        if epoch["seconds"] < 0:
            raise invalid(path, f"epochs[{index}].seconds", ">= 0", epoch["seconds"])
    last_examples = epochs[-1]["examples"] if epochs else 0
    batches = state["batches_done"]
    if batches < 0:
        raise invalid(path, "batches_done", ">= 0", batches)
    if state["epoch_seconds_done"] < 0:
        raise invalid(path, "epoch_seconds_done", ">= 0", state["epoch_seconds_done"])
    if (state["examples"] != last_examples) if not batches else state["examples"] <= last_examples:
        words = "" if not batches else "more than "
        raise invalid(
            path, "examples", f"{words}the last epoch's examples ({last_examples})",
            state["examples"],
        )  # fmt: skip
    timed = 0.0
    previous_stop = -math.inf
    for index, segment in enumerate(state["segments"]):
        if segment["stop"] <= segment["start"]:
            raise invalid(path, f"segments[{index}].stop", "after its start", segment["stop"])
        if segment["start"] < previous_stop:
            raise invalid(
                path, f"segments[{index}].start", "at or after the previous one's stop",
                segment["start"],
            )  # fmt: skip
        previous_stop = segment["stop"]
        timed += segment["stop"] - segment["start"]
    if done and not state["segments"]:
        raise invalid(path, "segments", f"the timed segments of {done} epochs", [])
    if len(state["energy"]) != len(state["segments"]):
        raise invalid(
            path, "energy", f"one list for each of the {len(state['segments'])} segments",
            state["energy"],
        )  # fmt: skip
    within = timed * (1 + 1e-9) + 1e-6  # the timed seconds so far bound every elapsed time
    for where, points in (("epochs", epochs), ("curve", state["curve"])):
        _check_forward(points, where, done, within, path)
    for index, written in enumerate(state["checkpoints"]):
        if not 0 <= written["epoch"] <= done or written["write_s"] < 0:
            raise invalid(
                path, f"checkpoints[{index}]", f"an epoch in 0-{done} and write_s >= 0", written
            )
    if state["run_start"] is None and done:
        raise invalid(path, "run_start", f"the run's start ({done} epochs were timed)", None)


def _check_forward(points: list[dict], where: str, done: int, within: float, path: Path) -> None:
    epoch, elapsed, examples = 0, 0.0, 0
    for index, point in enumerate(points):
        for key, floor, ceiling in (
            ("epoch", epoch, done),
            ("elapsed_s", elapsed, within),
            ("examples", examples, math.inf),
        ):
            if not floor <= point[key] <= ceiling:
                words = f"in {floor:.6g}-{ceiling:.6g}" if ceiling != math.inf else f">= {floor}"
                raise invalid(path, f"{where}[{index}].{key}", words, point[key])
        epoch, elapsed, examples = point["epoch"], point["elapsed_s"], point["examples"]


def checkpoint_prefix(run_dir: Path, state: dict) -> Path:
    """The checkpoint the state names, inside `run_dir` (where the run directory is now: it
    may have been moved), named for the epochs the state has done, whole on disk: its index
    and every data shard regular files."""
    path = RunDirectory(run_dir).state
    name = Path(state["checkpoint"]).name
    match = PREFIX.fullmatch(name)
    if match is None:
        raise invalid(path, "checkpoint", "a checkpoint of the run (ckpt-N)", state["checkpoint"])
    if match.group(1) is not None and int(match.group(1)) != state["epochs_done"]:
        raise UserError(
            f"{path}: says {state['epochs_done']} epochs were done, but the checkpoint it names "
            f"({name}) holds {int(match.group(1))}: resume refused"
        )
    batches = state.get("batches_done", 0)
    if int(match.group(2) or 0) != batches:
        raise UserError(
            f"{path}: says {batches} batches of epoch {state['epochs_done'] + 1} "
            f"were done, but the checkpoint it names ({name}) holds "
            f"{int(match.group(2) or 0)}: resume refused"
        )
    prefix = RunDirectory(run_dir).checkpoints / name
    for suffix, what in backends.get(state["framework"]).checkpoint_files:
        if "-*-of-*" in suffix:
            _check_shards(prefix, f"{name}.{suffix.removesuffix('-*-of-*')}", what)
        else:
            _regular(prefix.with_name(f"{name}.{suffix}"), what)
    return prefix


def _check_shards(prefix: Path, stem: str, what: str) -> None:
    """Every shard STEM-I-of-N of a sharded file set (TensorFlow's data files) there, of one
    set, each a regular file: `what` names one shard ("checkpoint data file")."""
    shards = sorted(prefix.parent.glob(f"{stem}-*-of-*"))
    if not shards:
        kind = what.removeprefix("checkpoint ").removesuffix(" file")
        raise UserError(f"{prefix}: the checkpoint has no {kind} files ({stem}-*)")
    if problem := shard_set_problem([shard.name for shard in shards]):
        raise UserError(f"{prefix}: the checkpoint is incomplete ({problem})")
    for shard in shards:
        _regular(shard, what)


def _regular(path: Path, what: str) -> None:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise UserError(f"{path}: no such {what}: the checkpoint is incomplete") from None
    except OSError as error:
        raise UserError(f"{path}: cannot read the {what} ({error.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise UserError(f"{path}: not a regular file; a {what} must be one")


def record_status(run_dir: Path) -> str | None:
    """The status the run's record says (read as JSON, of any schema version), 'unreadable'
    where it cannot be read, None where there is none."""
    path = RunDirectory(run_dir).record
    if not os.path.lexists(path):
        return None
    try:
        return str(json.loads(read_regular_file(path, "record"))["status"])
    except (UserError, ValueError, KeyError, TypeError):
        return "unreadable"


def _check_record_replaceable(run_dir: Path) -> None:
    """A resume replaces the run's record: refused where that record is a result (completed,
    or diverged: a failed attempt is one too), or where it cannot be read to tell."""
    directory = RunDirectory(run_dir)
    status = record_status(run_dir)
    if status == "completed":
        raise UserError(
            f"{run_dir}: the run already finished all its epochs (its record: {directory.record})"
        )
    if status == "diverged":
        raise UserError(
            f"{run_dir}: its run diverged ({directory.record}); a diverged run is its result, "
            "never resumed: start a new run"
        )
    if status == "unreadable":
        raise UserError(
            f"{directory.record}: cannot be read as a record, and a resume would replace it: "
            "move it out of the run directory to resume"
        )


def check_resumable(run_dir: Path | str, epochs: int) -> dict:
    """Everything about a run directory that can be checked before TensorFlow loads; returns
    its state. `epochs` is the run's budget (from the config saved in it)."""
    run_dir = Path(run_dir)
    directory = RunDirectory(run_dir)
    check_run_files(run_dir)
    state = read_state(run_dir)
    if state["epochs_done"] > epochs:
        raise UserError(
            f"{directory.state}: says {state['epochs_done']} epochs were done, more than "
            f"the run's {epochs}: resume refused"
        )
    prefix = checkpoint_prefix(run_dir, state)
    _check_record_replaceable(run_dir)
    # Read whole now, where pure Python can (PyTorch's zip archive): before any worker, the
    # data process or the framework starts.
    backends.get(state["framework"]).check_checkpoint(prefix)
    return state
