"""A run's checkpoints: when one is due, the cadence in words, writing one whole (then the
state naming it), and restoring a stopped run from its last one."""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict

from hpcai500_tf import record as record_io
from hpcai500_tf.config import TrainingConfig
from hpcai500_tf.errors import UserError
from hpcai500_tf.run import data_position, resume
from hpcai500_tf.run import state as run_state
from hpcai500_tf.run.directory import RunDirectory
from hpcai500_tf.run.progress import Progress


def checkpoint_due(training: TrainingConfig, epochs_done: int, seconds_since: float) -> bool:
    """Whether the end of epoch `epochs_done` writes a checkpoint, `seconds_since` the last one
    (or the segment's start): after the last epoch always; before it once
    `checkpoint_minutes` of wall time have passed, or every `checkpoint_every` epochs (each 0:
    never)."""
    if epochs_done >= training.epochs:
        return True
    minutes, every = training.checkpoint_minutes, training.checkpoint_every
    by_time = minutes > 0 and seconds_since >= 60 * minutes
    return by_time or (every > 0 and epochs_done % every == 0)


def cadence(training: TrainingConfig) -> str:
    """`training`'s checkpoint cadence in words, for the record."""
    minutes, every = training.checkpoint_minutes, training.checkpoint_every
    ways = [f"every {minutes:g} min of wall time"] if minutes else []
    ways += [f"every {every} epoch(s)"] if every else []
    if not ways:
        return "after the last epoch only"
    return f"{' or '.join(ways)} (at an epoch's end), and after the last epoch"


def save_checkpoint(trainer, run_dir: RunDirectory, progress: Progress) -> None:
    """The trainer's checkpoint under a new prefix, then the state naming it (atomically, with
    the write's time in `progress.checkpoints`), then the ones before it removed: a kill at any
    moment leaves a state whose checkpoint is whole."""
    run_dir.checkpoints.mkdir(exist_ok=True)
    started = time.monotonic()
    done, batches = progress.epochs_done, progress.batches_done
    # ckpt-N, or ckpt-N-bB mid-epoch
    prefix = trainer.write_checkpoint(run_dir.checkpoint(done, batches), done, batches)
    progress.checkpoints.append(
        {
            "epoch": progress.epochs_done,
            "elapsed_s": progress.elapsed(),
            "write_s": time.monotonic() - started,
        }
    )
    state = {**asdict(progress), "checkpoint": str(prefix), "framework": trainer.framework}
    record_io.write_atomic(run_dir.state, state, overwrite=True)
    for old in run_dir.checkpoints.glob("ckpt*"):  # ckpt, ckpt-N.*, ckpt-N.pt, a _temp dir
        if old.name == prefix.name or old.name.startswith(prefix.name + "."):
            continue
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def restore(trainer, run_dir: RunDirectory, fingerprint_now: str) -> Progress:
    """The progress and the trainer's model and optimizer of a stopped run's last checkpoint,
    each checked first (`run_state`, then the trainer's own reading), so that nothing damaged
    is found mid-training."""
    state = run_state.read_state(run_dir.path)
    if state["config_fingerprint"] != fingerprint_now:
        raise UserError(
            f"{run_dir}: it was started with another config; resume it with the "
            "same benchmark, preset and --set values, or with --resume alone"
        )
    if state["framework"] != trainer.framework:
        raise resume.other_framework(run_dir, state["framework"])
    prefix = run_state.checkpoint_prefix(run_dir.path, state)
    # None: written before checkpoints held it; (epochs, batches) for a mid-epoch one
    held = data_position.held(trainer.read_checkpoint(prefix))
    if held is not None and held[0] != state["epochs_done"]:
        raise UserError(
            f"{run_dir.state}: says {state['epochs_done']} epochs were done, but its "
            f"checkpoint {prefix} holds {held[0]}: resume refused"
        )
    data_position.check_held(held, state, prefix)
    del state["checkpoint"], state["framework"]
    return Progress(**state)
