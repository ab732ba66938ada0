"""An ensemble member's evaluation outputs, saved in its run directory at each of its
evaluations, for the ensemble's evaluation (run/ensemble.py) to merge.

    RUN_DIR/predictions-eN.npz   a classifier's, after epoch N: `probabilities` (float32,
                                 examples x classes, the model's softmax), `labels` (int32,
                                 examples) and `epoch`
    RUN_DIR/detections-eN.npz    the detector's, after epoch N: `boxes` (float32, images x D
                                 x 4, [ymin, xmin, ymax, xmax] in pixels of the model's
                                 input), `scores` (float32, images x D), `classes` (int,
                                 images x D), `valid` (int, images: image i's detections are
                                 its first valid[i] rows, the rest padding), `truth` (float32,
                                 images x 15 x 5, the data's box rows, an unused row's class
                                 -1), `num_classes` and `epoch`

Both in evaluation-set order (the split is neither bootstrapped nor shuffled, and a member
reads it in order: so every member's rows are the same examples); on several workers each
framework first puts every worker's rows back in evaluation-set order (`in_evaluation_order`).
Written by the chief, atomically (a stop mid-write leaves the previous file whole). Pure
numpy: no framework is imported here.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from hpcai500_tf.errors import UserError
from hpcai500_tf.measure import detection_lists

NAME = "predictions-e{epoch}.npz"
DETECTIONS_NAME = "detections-e{epoch}.npz"


def path_of(run_dir: Path, epoch: int) -> Path:
    return Path(run_dir) / NAME.format(epoch=epoch)


def detections_path(run_dir: Path, epoch: int) -> Path:
    return Path(run_dir) / DETECTIONS_NAME.format(epoch=epoch)


def keep(run, epoch: int) -> None:
    """After evaluation `epoch` (counted from 1): the chief saves what its trainer kept of
    it (`predictions`: an ensemble member's), nothing for any other run."""
    kept = run.trainer.predictions
    if kept is None or not run.chief or run.run_dir is None:
        return
    if "boxes" in kept:  # the detector's
        save_detections(run.run_dir.path, epoch, **kept)
    else:
        save(run.run_dir.path, epoch, kept["probabilities"], kept["labels"])


def save(run_dir: Path, epoch: int, probabilities, labels) -> Path:
    arrays = {"probabilities": np.asarray(probabilities, np.float32),
              "labels": np.asarray(labels, np.int32)}  # fmt: skip
    return _write(path_of(run_dir, epoch), epoch, arrays)


def save_detections(
    run_dir: Path, epoch: int, boxes, scores, classes, valid, truth, num_classes: int
) -> Path:
    arrays = {
        "boxes": np.asarray(boxes, np.float32),
        "scores": np.asarray(scores, np.float32),
        "classes": np.asarray(classes).astype(np.int64),
        "valid": np.asarray(valid).astype(np.int64),
        "truth": np.asarray(truth, np.float32),
        "num_classes": np.int64(num_classes),
    }
    return _write(detections_path(run_dir, epoch), epoch, arrays)


def _write(path: Path, epoch: int, arrays: dict) -> Path:
    handle = tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.stem}-", delete=False)
    try:
        with handle:
            np.savez(handle, **arrays, epoch=np.int64(epoch))
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
    return path


def in_evaluation_order(parts: list[np.ndarray]) -> np.ndarray:
    """The rows of every worker's shard of the evaluation split, by rank, as one array in
        evaluation-set order: worker r of W read examples r, r + W, r + 2W, ... (tf.data's
        `shard(W, r)`, as the procedural data and the detector's files shard; an ImageNet member
    has one worker), so
        example i is row i // W of worker i % W's part. One worker's part is returned as is."""
    if len(parts) == 1:
        return np.asarray(parts[0])
    count = len(parts)
    sizes = [len(part) for part in parts]
    total = sum(sizes)
    expected = [len(range(rank, total, count)) for rank in range(count)]
    if sizes != expected:
        raise UserError(
            f"ensemble member's evaluation: its workers' shards of {sizes} rows are not a "
            f"{count}-way split of {total} examples: no evaluation-set order to save"
        )
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


def load_detections(run_dir: Path, epoch: int):
    """(detections, truth rows, num_classes) a detector member saved after `epoch`: its
    detections per image (measure/detection_lists.py), the images' ground-truth rows
    (images x 15 x 5) and the class count; one line where it cannot be read or does not
    hold them."""
    path = detections_path(run_dir, epoch)
    names = ("boxes", "scores", "classes", "valid", "truth", "num_classes")
    try:
        with np.load(path, allow_pickle=False) as held:
            boxes, scores, classes, valid, truth, num_classes = (held[name] for name in names)
    except (OSError, KeyError, ValueError) as error:
        raise UserError(f"{path}: no evaluation detections to read ({error})") from None
    images = boxes.shape[0] if boxes.ndim == 3 else -1
    if (
        boxes.shape[2:] != (4,)
        or scores.shape != boxes.shape[:2]
        or classes.shape != boxes.shape[:2]
        or valid.shape != (images,)
        or truth.ndim != 3
        or truth.shape[0] != images
        or truth.shape[2] != 5
        or num_classes.shape != ()
    ):
        raise UserError(
            f"{path}: boxes {boxes.shape}, scores {scores.shape}, classes {classes.shape}, "
            f"valid {valid.shape} and truth {truth.shape} do not describe the same images"
        )
    if images and not (0 <= valid.min() and valid.max() <= boxes.shape[1]):
        raise UserError(f"{path}: a valid count lies outside 0 .. {boxes.shape[1]}")
    found = detection_lists.detections(boxes, scores, classes, valid)
    return found, truth, int(num_classes)
