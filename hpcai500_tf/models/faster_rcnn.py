"""Faster R-CNN (Ren et al., 2015) in Keras 3, with static shapes throughout so the train step
traces at a fixed batch and its FLOPs can be counted like the classifier's.

- Backbone: ResNet-50 v1.5 (models/resnet.py) on 16 channels, cut after stage `feature_stage`
  (4: stride 16, as in the paper's C4 model), on the layers of `kernels` (models/kernels.py).
- RPN: 3x3 conv, then per anchor an objectness logit and 4 box deltas. Anchors: every
  size x aspect ratio at every feature-map cell, sized for weather features in pixels.
- Proposals: decode, clip, top `pre_nms` by objectness, NMS at IoU 0.7, a fixed number kept
  (zero-area padding where fewer survive, marked invalid).
- Training targets: anchors with IoU >= 0.7 (or the best anchor of a box) are positive, < 0.3
  negative, `rpn_batch` sampled per image, at most half positive; proposals plus the ground
  truth are matched at IoU 0.5 and `roi_batch` sampled per image, at most a quarter foreground.
- ROI Align: `tf.image.crop_and_resize` to 14x14, max-pooled to 7x7.
- Box head: two dense layers, class logits (background + classes) and class-agnostic deltas.
- Losses: RPN binary cross-entropy and smooth L1 (beta 1/9), head softmax cross-entropy and
  smooth L1 (beta 1), each averaged over its sampled anchors or ROIs in each image.
- Inference: per-class NMS at IoU 0.5 over the head's boxes, `max_detections` per image.

Boxes are [ymin, xmin, ymax, xmax] in input pixels.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf
from keras import layers

from hpcai500_tf.models import resnet

HEAD_DELTA_WEIGHTS = (10.0, 10.0, 5.0, 5.0)
MAX_DELTA = math.log(1000.0 / 16)


def anchor_boxes(height: int, width: int, stride: int, sizes, ratios) -> np.ndarray:
    """(cells x sizes x ratios, 4) anchors centred on every feature cell."""
    ys = (np.arange(math.ceil(height / stride)) + 0.5) * stride
    xs = (np.arange(math.ceil(width / stride)) + 0.5) * stride
    shapes = [(s * math.sqrt(r), s / math.sqrt(r)) for s in sizes for r in ratios]  # (h, w)
    anchors = [
        [y - h / 2, x - w / 2, y + h / 2, x + w / 2] for y in ys for x in xs for h, w in shapes
    ]
    return np.asarray(anchors, np.float32)


def encode(boxes, anchors, weights=(1.0, 1.0, 1.0, 1.0)):
    """Deltas (dy, dx, dh, dw) taking `anchors` to `boxes` (finite for empty boxes too)."""
    ah = tf.maximum(anchors[..., 2] - anchors[..., 0], 1e-3)
    aw = tf.maximum(anchors[..., 3] - anchors[..., 1], 1e-3)
    ay, ax = anchors[..., 0] + 0.5 * ah, anchors[..., 1] + 0.5 * aw
    bh = tf.maximum(boxes[..., 2] - boxes[..., 0], 1e-3)
    bw = tf.maximum(boxes[..., 3] - boxes[..., 1], 1e-3)
    by, bx = boxes[..., 0] + 0.5 * bh, boxes[..., 1] + 0.5 * bw
    return tf.stack(
        [
            weights[0] * (by - ay) / ah,
            weights[1] * (bx - ax) / aw,
            weights[2] * tf.math.log(bh / ah),
            weights[3] * tf.math.log(bw / aw),
        ],
        axis=-1,
    )


def decode(deltas, anchors, weights=(1.0, 1.0, 1.0, 1.0)):
    ah, aw = anchors[..., 2] - anchors[..., 0], anchors[..., 3] - anchors[..., 1]
    ay, ax = anchors[..., 0] + 0.5 * ah, anchors[..., 1] + 0.5 * aw
    dy, dx = deltas[..., 0] / weights[0], deltas[..., 1] / weights[1]
    dh = tf.minimum(deltas[..., 2] / weights[2], MAX_DELTA)
    dw = tf.minimum(deltas[..., 3] / weights[3], MAX_DELTA)
    y, x = ay + dy * ah, ax + dx * aw
    h, w = ah * tf.exp(dh), aw * tf.exp(dw)
    return tf.stack([y - h / 2, x - w / 2, y + h / 2, x + w / 2], axis=-1)


def pairwise_iou(a, b):
    """IoU of (B, N, 4) against (B, M, 4): (B, N, M)."""
    a, b = a[:, :, None, :], b[:, None, :, :]
    top, left = tf.maximum(a[..., 0], b[..., 0]), tf.maximum(a[..., 1], b[..., 1])
    bottom, right = tf.minimum(a[..., 2], b[..., 2]), tf.minimum(a[..., 3], b[..., 3])
    inter = tf.maximum(bottom - top, 0.0) * tf.maximum(right - left, 0.0)
    area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    return tf.math.divide_no_nan(inter, area_a + area_b - inter)


def sample(candidates, counts):
    """Per row, `counts` (B,) of the True entries of `candidates` (B, N), chosen at random."""
    keys = tf.where(candidates, tf.random.uniform(tf.shape(candidates)), -1.0)
    ranks = tf.argsort(tf.argsort(keys, axis=1, direction="DESCENDING"), axis=1)
    return candidates & (ranks < counts[:, None])


def smooth_l1(difference, beta: float):
    absolute = tf.abs(difference)
    return tf.reduce_sum(
        tf.where(absolute < beta, 0.5 * absolute**2 / beta, absolute - 0.5 * beta), axis=-1
    )


class FasterRCNN(keras.Model):
    def __init__(
        self,
        image_shape: tuple[int, int, int],
        num_classes: int,
        width: float,
        blocks: tuple[int, ...],
        feature_stage: int,
        anchor_sizes: list[float],
        anchor_ratios: list[float],
        pre_nms: int,
        proposals_train: int,
        proposals_eval: int,
        rpn_batch: int,
        roi_batch: int,
        head_units: int,
        max_detections: int,
        bn_momentum: float = 0.9,
        bn_epsilon: float = 1e-5,
        zero_init_residual: bool = True,
        kernels: str = "auto",
        **kwargs,
    ):
        super().__init__(name="faster_rcnn", **kwargs)
        height, width_px, channels = image_shape
        self.image_size = (height, width_px)
        self.num_classes = num_classes
        self.stride = 2**feature_stage
        self.pre_nms, self.rpn_batch, self.roi_batch = pre_nms, rpn_batch, roi_batch
        self.proposals_train, self.proposals_eval = proposals_train, proposals_eval
        self.max_detections = max_detections
        images = keras.Input(image_shape, name="images")
        features = resnet.resnet_backbone(
            images, width, blocks, bn_momentum, bn_epsilon, zero_init_residual, kernels,
            last_stage=feature_stage,
        )[-1]  # fmt: skip
        self.backbone = keras.Model(images, features, name="backbone")
        self.anchors = tf.constant(
            anchor_boxes(height, width_px, self.stride, anchor_sizes, anchor_ratios)
        )
        per_cell = len(anchor_sizes) * len(anchor_ratios)
        feature_in = keras.Input(features.shape[1:], name="features")
        hidden = layers.Conv2D(
            features.shape[-1], 3, padding="same", activation="relu", name="rpn_conv"
        )(feature_in)
        init = keras.initializers.RandomNormal(stddev=0.01)
        logits = layers.Conv2D(per_cell, 1, kernel_initializer=init, name="rpn_objectness")(hidden)
        deltas = layers.Conv2D(4 * per_cell, 1, kernel_initializer=init, name="rpn_deltas")(hidden)
        logits = layers.Reshape((-1,), dtype="float32", name="rpn_logits_flat")(logits)
        deltas = layers.Reshape((-1, 4), dtype="float32", name="rpn_deltas_flat")(deltas)
        self.rpn = keras.Model(feature_in, [logits, deltas], name="rpn")
        roi_in = keras.Input((7, 7, features.shape[-1]), name="roi_features")
        x = layers.Flatten(name="roi_flatten")(roi_in)
        x = layers.Dense(head_units, activation="relu", name="head_fc1")(x)
        x = layers.Dense(head_units, activation="relu", name="head_fc2")(x)
        classes = layers.Dense(num_classes + 1, kernel_initializer=init, dtype="float32",
                               name="head_classes")(x)  # fmt: skip
        box = layers.Dense(4, kernel_initializer=keras.initializers.RandomNormal(stddev=0.001),
                           dtype="float32", name="head_deltas")(x)  # fmt: skip
        self.head = keras.Model(roi_in, [classes, box], name="box_head")

    # ------------------------------------------------------------------ shared stages

    def _proposals(self, logits, deltas, count: int):
        """(B, count, 4) proposals and their validity, without gradient."""
        logits, deltas = tf.stop_gradient(logits), tf.stop_gradient(deltas)
        k = min(self.pre_nms, int(self.anchors.shape[0]))
        top_scores, top = tf.math.top_k(logits, k=k)
        boxes = decode(tf.gather(deltas, top, batch_dims=1), tf.gather(self.anchors, top))
        height, width = self.image_size
        boxes = tf.clip_by_value(boxes, 0.0, [height, width, height, width])
        selected, valid = tf.image.non_max_suppression_padded(
            boxes, tf.sigmoid(top_scores), count, iou_threshold=0.7,
            pad_to_max_output_size=True,
        )  # fmt: skip
        proposals = tf.gather(boxes, selected, batch_dims=1)
        mask = tf.range(count)[None, :] < valid[:, None]
        return proposals * tf.cast(mask[..., None], proposals.dtype), mask

    def _roi_features(self, features, rois):
        """ROI Align by bilinear crops: (B, R, 4) pixel boxes -> (B*R, 7, 7, C)."""
        batch, count = tf.shape(rois)[0], tf.shape(rois)[1]
        height, width = self.image_size
        normalised = rois / tf.constant([height, width, height, width], rois.dtype)
        crops = tf.image.crop_and_resize(
            tf.cast(features, tf.float32),
            tf.reshape(normalised, [-1, 4]),
            tf.repeat(tf.range(batch), count),
            (14, 14),
        )
        pooled = tf.nn.max_pool2d(crops, 2, 2, "VALID")
        return tf.cast(pooled, features.dtype)

    # ------------------------------------------------------------------ inference

    def call(self, images, training=False):
        """Detections: boxes (B, D, 4), scores (B, D), classes (B, D), valid counts (B,)."""
        features = self.backbone(images, training=training)
        logits, deltas = self.rpn(features, training=training)
        proposals, _ = self._proposals(logits, deltas, self.proposals_eval)
        class_logits, box_deltas = self.head(
            self._roi_features(features, proposals), training=training
        )
        batch = tf.shape(images)[0]
        count = self.proposals_eval
        probabilities = tf.reshape(tf.nn.softmax(class_logits), [batch, count, -1])
        boxes = decode(tf.reshape(box_deltas, [batch, count, 4]), proposals, HEAD_DELTA_WEIGHTS)
        height, width = self.image_size
        boxes = tf.clip_by_value(boxes, 0.0, [height, width, height, width])
        nmsed = tf.image.combined_non_max_suppression(
            boxes[:, :, None, :], probabilities[:, :, 1:], self.max_detections,
            self.max_detections, iou_threshold=0.5, score_threshold=0.01, clip_boxes=False,
        )  # fmt: skip
        return {
            "boxes": nmsed.nmsed_boxes,
            "scores": nmsed.nmsed_scores,
            "classes": tf.cast(nmsed.nmsed_classes, tf.int32),
            "valid": nmsed.valid_detections,
        }

    # ------------------------------------------------------------------ training

    def training_losses(self, images, gt):
        """Per-image training loss (B,) from images and (B, 15, 5) ground-truth rows."""
        gt = tf.cast(gt, tf.float32)
        gt_boxes, gt_classes = gt[..., :4], tf.cast(gt[..., 4], tf.int32)
        gt_valid = gt_classes >= 0
        batch = tf.shape(images)[0]
        features = self.backbone(images, training=True)
        logits, deltas = self.rpn(features, training=True)
        rpn_classification, rpn_box = self._rpn_losses(logits, deltas, gt_boxes, gt_valid)
        proposals, proposal_valid = self._proposals(logits, deltas, self.proposals_train)
        rois, labels, targets, weights = self._roi_targets(
            proposals, proposal_valid, gt_boxes, gt_classes, gt_valid
        )
        class_logits, box_deltas = self.head(self._roi_features(features, rois), training=True)
        class_logits = tf.reshape(class_logits, [batch, self.roi_batch, -1])
        box_deltas = tf.reshape(box_deltas, [batch, self.roi_batch, 4])
        head_classification = tf.reduce_sum(
            weights
            * tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=class_logits),
            axis=1,
        ) / tf.maximum(tf.reduce_sum(weights, axis=1), 1.0)
        foreground = (weights > 0) & (labels > 0)
        head_box = tf.reduce_sum(
            tf.where(foreground, smooth_l1(box_deltas - targets, 1.0), 0.0), axis=1
        ) / tf.maximum(tf.reduce_sum(weights, axis=1), 1.0)
        return rpn_classification + rpn_box + head_classification + head_box

    def _rpn_losses(self, logits, deltas, gt_boxes, gt_valid):
        batch = tf.shape(logits)[0]
        anchors = tf.broadcast_to(self.anchors[None], [batch, *self.anchors.shape])
        overlaps = pairwise_iou(anchors, gt_boxes)
        overlaps = tf.where(gt_valid[:, None, :], overlaps, -1.0)
        best = tf.reduce_max(overlaps, axis=2)
        matched = tf.argmax(overlaps, axis=2, output_type=tf.int32)
        best_for_box = tf.reduce_max(overlaps, axis=1, keepdims=True)  # (B, 1, G)
        is_best = tf.reduce_any(
            (overlaps >= best_for_box - 1e-6) & (best_for_box > 0) & gt_valid[:, None, :], axis=2
        )
        positive = (best >= 0.7) | is_best
        negative = (best < 0.3) & ~positive
        positive = sample(positive, tf.fill([batch], self.rpn_batch // 2))
        count_positive = tf.reduce_sum(tf.cast(positive, tf.int32), axis=1)
        negative = sample(negative, self.rpn_batch - count_positive)
        used = tf.cast(positive | negative, tf.float32)
        normaliser = tf.maximum(tf.reduce_sum(used, axis=1), 1.0)
        classification = tf.reduce_sum(
            used
            * tf.nn.sigmoid_cross_entropy_with_logits(
                labels=tf.cast(positive, tf.float32), logits=logits
            ),
            axis=1,
        )
        targets = encode(tf.gather(gt_boxes, matched, batch_dims=1), anchors)
        box = tf.reduce_sum(tf.where(positive, smooth_l1(deltas - targets, 1.0 / 9), 0.0), axis=1)
        return classification / normaliser, box / normaliser

    def _roi_targets(self, proposals, proposal_valid, gt_boxes, gt_classes, gt_valid):
        """Sampled ROIs (B, roi_batch, 4), class labels, box targets and weights."""
        batch = tf.shape(proposals)[0]
        rois = tf.concat([proposals, gt_boxes], axis=1)
        valid = tf.concat([proposal_valid, gt_valid], axis=1)
        overlaps = tf.where(gt_valid[:, None, :], pairwise_iou(rois, gt_boxes), -1.0)
        best = tf.reduce_max(overlaps, axis=2)
        matched = tf.argmax(overlaps, axis=2, output_type=tf.int32)
        foreground = valid & (best >= 0.5)
        background = valid & (best < 0.5)
        foreground = sample(foreground, tf.fill([batch], self.roi_batch // 4))
        count_foreground = tf.reduce_sum(tf.cast(foreground, tf.int32), axis=1)
        background = sample(background, self.roi_batch - count_foreground)
        chosen = foreground | background
        keys = tf.where(chosen, 1.0 + tf.random.uniform(tf.shape(best)), -1.0)
        _, order = tf.math.top_k(keys, k=self.roi_batch)
        rois = tf.gather(rois, order, batch_dims=1)
        weights = tf.cast(tf.gather(chosen, order, batch_dims=1), tf.float32)
        is_foreground = tf.gather(foreground, order, batch_dims=1)
        matched = tf.gather(matched, order, batch_dims=1)
        labels = tf.where(is_foreground, tf.gather(gt_classes, matched, batch_dims=1) + 1, 0)
        targets = encode(tf.gather(gt_boxes, matched, batch_dims=1), rois, HEAD_DELTA_WEIGHTS)
        targets = tf.where(is_foreground[..., None], targets, 0.0)
        return tf.stop_gradient(rois), labels, tf.stop_gradient(targets), weights

    # ------------------------------------------------------------------ counting

    def roofline_parts(self) -> list[tuple[keras.Model, int]]:
        """The sub-models a train step runs, and how many times per image: the box head runs
        once per sampled region."""
        return [(self.backbone, 1), (self.rpn, 1), (self.head, self.roi_batch)]

    def analytical_forward_flops(self) -> float:
        """2 x multiply-adds of every convolution and dense layer for one image at inference
        (the box head once per proposal)."""
        return (
            resnet.analytical_forward_flops(self.backbone)
            + resnet.analytical_forward_flops(self.rpn)
            + self.proposals_eval * resnet.analytical_forward_flops(self.head)
        )
