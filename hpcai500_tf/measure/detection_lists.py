"""The detector's evaluation outputs as the mAP (mean_average_precision.py) and the box fusion
(box_fusion.py) read them: one entry per image, from the padded arrays the model gives and
the data hold.

- Detections: the model's `boxes` (images x D x 4, [ymin, xmin, ymax, xmax] in pixels),
  `scores` and `classes` (images x D) and `valid` (images): image i's detections are its
  first valid[i] rows, the rest padding.
- Ground truth: the data's rows (images x 15 x 5, [ymin, xmin, ymax, xmax, class]), an unused
  row's class -1 (data/extreme_weather.py).

Pure numpy: no framework is imported here.
"""

from __future__ import annotations

import numpy as np


def detections(boxes, scores, classes, valid) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(boxes (K, 4), scores (K,), classes (K,) int) of each image, its padding left out."""
    return [
        (boxes[i, :n], scores[i, :n], np.asarray(classes[i, :n]).astype(int))
        for i, n in enumerate(np.asarray(valid).astype(int))
    ]


def ground_truth(rows) -> list[tuple[np.ndarray, np.ndarray]]:
    """(boxes (G, 4), classes (G,) int) of each image's used rows."""
    found = []
    for image in rows:
        used = image[image[:, 4] >= 0]
        found.append((used[:, :4], used[:, 4].astype(int)))
    return found
