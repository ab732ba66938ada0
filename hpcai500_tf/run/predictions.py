"""An ensemble member's evaluation probabilities, saved in its run directory at each of its
evaluations, for the ensemble's evaluation (run/ensemble.py) to average.

    RUN_DIR/predictions-eN.npz   after epoch N: `probabilities` (float32, examples x classes,
                                 the model's softmax), `labels` (int32, examples) and `epoch`,
                                 in evaluation-set order (the split is neither bootstrapped
                                 nor shuffled, so every member's rows are the same examples)

Written by the chief, atomically (a stop mid-write leaves the previous file whole); on
several workers each framework first puts every worker's rows back in evaluation-set order
(`in_evaluation_order`). Pure numpy: no framework is imported here.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from hpcai500_tf.errors import UserError

NAME = "predictions-e{epoch}.npz"


def path_of(run_dir: Path, epoch: int) -> Path:
    return Path(run_dir) / NAME.format(epoch=epoch)


def keep(run, epoch: int) -> None:
    """After evaluation `epoch` (counted from 1): the chief saves what its trainer kept of
    it (`predictions`: an ensemble member's), nothing for any other run."""
    kept = run.trainer.predictions
    if kept is None or not run.chief or run.run_dir is None:
        return
    save(run.run_dir.path, epoch, kept["probabilities"], kept["labels"])


def save(run_dir: Path, epoch: int, probabilities, labels) -> Path:
    path = path_of(run_dir, epoch)
    handle = tempfile.NamedTemporaryFile(dir=path.parent, prefix=".predictions-", delete=False)
    try:
        with handle:
            np.savez(handle, probabilities=np.asarray(probabilities, np.float32),
                     labels=np.asarray(labels, np.int32), epoch=np.int64(epoch))  # fmt: skip
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
    return path


def in_evaluation_order(parts: list[np.ndarray]) -> np.ndarray:
    """The rows of every worker's shard of the evaluation split, by rank, as one array in
    evaluation-set order: worker r of W read examples r, r + W, r + 2W, ... (tf.data's
    `shard(W, r)`, as the procedural data shards: the only source an ensemble reads), so
    example i is row i // W of worker i % W's part. One worker's part is returned as is."""
    if len(parts) == 1:
        return np.asarray(parts[0])
    count = len(parts)
    sizes = [len(part) for part in parts]
    total = sum(sizes)
    expected = [len(range(rank, total, count)) for rank in range(count)]
    if sizes != expected:
        raise ValueError(f"shards of {sizes} rows are not a {count}-way split of {total}")
    ordered = np.empty((total, *np.shape(parts[0])[1:]), np.asarray(parts[0]).dtype)
    for rank, part in enumerate(parts):
        ordered[rank::count] = part
    return ordered


def load(run_dir: Path, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, labels) a member saved after `epoch`; one line where it cannot be read
    or does not hold them."""
    path = path_of(run_dir, epoch)
    try:
        with np.load(path, allow_pickle=False) as held:
            probabilities, labels = held["probabilities"], held["labels"]
    except (OSError, KeyError, ValueError) as error:
        raise UserError(f"{path}: no evaluation probabilities to read ({error})") from None
    if probabilities.ndim != 2 or labels.shape != probabilities.shape[:1]:
        raise UserError(
            f"{path}: probabilities {probabilities.shape} and labels {labels.shape} do not "
            "describe the same examples"
        )
    return probabilities, labels


def top1(probabilities: np.ndarray, labels: np.ndarray) -> float:
    """The share of examples whose most probable class is the label (ties: the first)."""
    return float(np.mean(np.argmax(probabilities, axis=1) == labels))
