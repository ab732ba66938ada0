"""Mean average precision at one IoU threshold (the EWA quality metric: mAP at IoU 0.5).

Per class, every detection of the evaluation set is ranked by score; a detection is a true
positive when its IoU with a not-yet-matched ground-truth box of its class and image is at
least the threshold (the best-overlapping one), else a false positive (duplicates included).
AP is the area under the precision-recall curve with VOC all-point interpolation: precision
made monotonically non-increasing from the right, summed over every recall step. mAP is the
mean over the classes that have ground truth in the evaluation set; a class without ground
truth is left out (its AP is undefined), whatever it detected.

Boxes are [ymin, xmin, ymax, xmax] in pixels, areas as (ymax - ymin) x (xmax - xmin).
"""

from __future__ import annotations

import numpy as np

EWA_THRESHOLD = 0.5  # the benchmark's quality: mAP at IoU 0.5


def iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one box against an (N, 4) array."""
    top = np.maximum(box[0], boxes[:, 0])
    left = np.maximum(box[1], boxes[:, 1])
    bottom = np.minimum(box[2], boxes[:, 2])
    right = np.minimum(box[3], boxes[:, 3])
    inter = np.clip(bottom - top, 0, None) * np.clip(right - left, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    union = area + areas - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def average_precision(recall: np.ndarray, precision: np.ndarray) -> float:
    """VOC all-point interpolated AP from a ranked list's recall and precision."""
    r = np.concatenate([[0.0], recall, [1.0]])
    p = np.concatenate([[0.0], precision, [0.0]])
    for i in range(len(p) - 2, -1, -1):
        p[i] = max(p[i], p[i + 1])
    steps = np.where(r[1:] != r[:-1])[0]
    return float(np.sum((r[steps + 1] - r[steps]) * p[steps + 1]))


def mean_average_precision(
    detections: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    ground_truth: list[tuple[np.ndarray, np.ndarray]],
    num_classes: int,
    threshold: float = 0.5,
) -> tuple[float, dict[int, float]]:
    """(mAP, AP per class with ground truth).

    detections[i] = (boxes (K, 4), scores (K,), classes (K,)) of image i;
    ground_truth[i] = (boxes (G, 4), classes (G,)) of image i.
    """
    if len(detections) != len(ground_truth):
        raise ValueError("one detection list and one ground-truth list per image")
    per_class = {}
    for cls in range(num_classes):
        truth = {i: b[c == cls] for i, (b, c) in enumerate(ground_truth)}
        total = sum(len(b) for b in truth.values())
        if total == 0:
            continue
        found = [
            (score, i, box)
            for i, (boxes, scores, classes) in enumerate(detections)
            for box, score, c in zip(boxes, scores, classes, strict=True)
            if c == cls
        ]
        found.sort(key=lambda item: -item[0])
        matched = {i: np.zeros(len(b), bool) for i, b in truth.items()}
        hits = np.zeros(len(found))
        for rank, (_, i, box) in enumerate(found):
            if len(truth[i]) == 0:
                continue
            overlaps = iou(np.asarray(box, float), truth[i].astype(float))
            best = int(np.argmax(overlaps))
            if overlaps[best] >= threshold and not matched[i][best]:
                matched[i][best] = True
                hits[rank] = 1
        true_positives = np.cumsum(hits)
        precision = true_positives / np.arange(1, len(found) + 1) if found else np.zeros(0)
        per_class[cls] = average_precision(true_positives / total, precision)
    if not per_class:
        raise ValueError("no ground-truth box in the evaluation set: mAP is undefined")
    return float(np.mean(list(per_class.values()))), per_class
