"""Importing TensorFlow for the commands that need it: one line when it is not installed, and
its native start-up banners kept off the console."""

from __future__ import annotations

import importlib.util
import os
import sys

from hpcai500_tf.errors import UserError

MISSING = (
    "TensorFlow is not installed: install this package with one of its TensorFlow extras, "
    "`pip install -e '.[cpu]'` (CPU) or `pip install -e '.[cuda]'` (NVIDIA GPUs)"
)


def import_tensorflow() -> None:
    """Import TensorFlow once, its banners (written to fd 2 before its logging is configured,
    so TF_CPP_MIN_LOG_LEVEL cannot silence them) sent to /dev/null."""
    if "tensorflow" in sys.modules:
        return
    if importlib.util.find_spec("tensorflow") is None:
        raise UserError(MISSING)
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
