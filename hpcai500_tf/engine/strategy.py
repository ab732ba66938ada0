"""Choosing the tf.distribute strategy. Build it before any other TF op runs."""

from __future__ import annotations

import json
import os

import tensorflow as tf

from hpcai500_tf.errors import UserError


def make_strategy(name: str) -> tf.distribute.Strategy:
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "multi_worker":
        if "TF_CONFIG" in os.environ:
            try:
                json.loads(os.environ["TF_CONFIG"])
            except json.JSONDecodeError as error:
                raise UserError(f"TF_CONFIG is not valid JSON ({error.msg})") from None
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise UserError(f"unknown strategy '{name}'")


def describe(strategy: tf.distribute.Strategy, name: str) -> tuple[dict, int, int]:
    """(L3 communication facts, number of workers, this worker's index)."""
    workers, index, collective = 1, 0, None
    resolver = getattr(strategy, "cluster_resolver", None)
    if name == "multi_worker" and resolver is not None:
        spec = resolver.cluster_spec().as_dict()
        workers = max(1, len(spec.get("worker", [])) + len(spec.get("chief", [])))
        index = resolver.task_id or 0
        collective = "tf.distribute collective ops (CommunicationImplementation.AUTO)"
    elif name == "mirrored":
        collective = type(getattr(strategy.extended, "_cross_device_ops", None)).__name__
    return (
        {
            "collective_implementation": collective,
            "note": None if collective else "single device: no collectives",
        },
        workers,
        index,
    )
