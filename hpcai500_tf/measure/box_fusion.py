"""How an ensemble of detectors' boxes become one detector's: weighted box fusion per image
and class, the rule the ensemble form states for extreme_weather (run/ensemble.py).

For each image and class, every member's detections of that class are pooled and visited in
descending score order (ties: by member index, then in the member's own order). A detection
joins the open cluster whose leading box (its first, highest-scoring one) overlaps it most,
where that IoU is at least THRESHOLD and the cluster holds no detection of the same member
yet (ties: the cluster opened first); otherwise it opens a new cluster and leads it. Each
cluster becomes one fused detection of its class: its box the score-weighted mean of its
boxes' coordinates (the plain mean where every score is 0), its score the sum of its scores
divided by M, the number of members in the ensemble. A box that only some of the members
found is so down-weighted by those that did not; a member gives a cluster one box at most,
so a fused score is never above its cluster's highest. An image's fused detections are
listed by class, then in the order their clusters were opened.

Pure numpy: no framework is imported here.
"""

from __future__ import annotations

import numpy as np

from hpcai500_tf.measure.mean_average_precision import iou

THRESHOLD = 0.55  # the IoU at which a detection joins a cluster's leading box
RULE = (
    "weighted box fusion per image and class: all members' detections pooled, clustered "
    f"greedily in descending score order (a detection joins the cluster whose leading box it "
    f"overlaps most at IoU >= {THRESHOLD}, one box per member and cluster; else it leads a "
    "new one); fused box = the score-weighted mean of the cluster's coordinates, fused score "
    "= the sum of the cluster's scores / M (the members in the ensemble)"
)

Detections = tuple[np.ndarray, np.ndarray, np.ndarray]  # boxes (K, 4), scores (K,), classes (K,)


def fuse(members: list[list[Detections]], count: int | None = None) -> list[Detections]:
    """The ensemble's detections of each image, from each member's (one list per member, the
    same images in the same order: measure/detection_lists.py). `count`: M, by default the
    number of lists."""
    if not members:
        raise ValueError("no member's detections to fuse")
    images = len(members[0])
    if any(len(member) != images for member in members):
        raise ValueError("every member's detections must cover the same images")
    m = len(members) if count is None else count
    if m < len(members):
        raise ValueError(f"M = {m} is fewer than the {len(members)} members given")
    return [fuse_image([member[i] for member in members], m) for i in range(images)]


def fuse_image(per_member: list[Detections], m: int) -> Detections:
    """One image's fused detections from each member's detections of it."""
    boxes = np.concatenate([np.asarray(b, np.float64).reshape(-1, 4) for b, _, _ in per_member])
    scores = np.concatenate([np.asarray(s, np.float64).reshape(-1) for _, s, _ in per_member])
    classes = np.concatenate([np.asarray(c).astype(int).reshape(-1) for _, _, c in per_member])
    owners = np.concatenate([np.full(len(s), k) for k, (_, s, _) in enumerate(per_member)])
    positions = np.concatenate([np.arange(len(s)) for _, s, _ in per_member])
    if not boxes.shape[0] == scores.size == classes.size:
        raise ValueError("each member's boxes, scores and classes must be as many")
    fused_boxes, fused_scores, fused_classes = [], [], []
    for cls in np.unique(classes):
        rows = np.flatnonzero(classes == cls)
        rows = rows[np.lexsort((positions[rows], owners[rows], -scores[rows]))]
        for cluster in _clusters(boxes[rows], owners[rows]):
            picked = rows[cluster]
            weights = scores[picked] if scores[picked].sum() > 0 else np.ones(len(picked))
            fused_boxes.append(weights @ boxes[picked] / weights.sum())
            fused_scores.append(scores[picked].sum() / m)
            fused_classes.append(int(cls))
    return (
        np.asarray(fused_boxes, np.float64).reshape(-1, 4),
        np.asarray(fused_scores, np.float64),
        np.asarray(fused_classes, int),
    )


def _clusters(boxes: np.ndarray, owners: np.ndarray) -> list[list[int]]:
    """The clusters of boxes already in visiting order, as lists of their positions."""
    clusters: list[list[int]] = []
    leads: list[int] = []  # each cluster's leading box
    for k in range(len(boxes)):
        best = None
        if leads:
            overlaps = iou(boxes[k], boxes[leads])
            for c, overlap in enumerate(overlaps):
                if overlap < THRESHOLD or any(owners[j] == owners[k] for j in clusters[c]):
                    continue
                if best is None or overlap > overlaps[best]:
                    best = c
        if best is None:
            clusters.append([k])
            leads.append(k)
        else:
            clusters[best].append(k)
    return clusters
