"""Importing TensorFlow for the commands that need it: one line when it is not installed, its
native start-up banners kept off the console, and NVIDIA's GPU settings set before it starts."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping, MutableMapping

from hpcai500_tf.errors import UserError

MISSING = (
    "TensorFlow is not installed: install this package with one of its TensorFlow extras, "
    "`pip install -e '.[cpu]'` (CPU) or `pip install -e '.[cuda]'` (NVIDIA GPUs)"
)

# The GPU settings of NVIDIA's own TensorFlow ResNet-50: cuDNN's persistent batch-norm kernels
# and a private thread per GPU to launch kernels. TensorFlow reads them from the environment;
# on a CPU they do nothing.
GPU_DEFAULTS = {
    "TF_USE_CUDNN_BATCHNORM_SPATIAL_PERSISTENT": "1",
    "TF_GPU_THREAD_MODE": "gpu_private",
}
_set_by_project: set[str] = set()  # the GPU_DEFAULTS this process set itself


def apply_gpu_defaults(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Set each of GPU_DEFAULTS the user has not set (a value of theirs, even empty, is
    kept); returns the names set."""
    environ = os.environ if environ is None else environ
    chosen = [name for name in GPU_DEFAULTS if name not in environ]
    for name in chosen:
        environ[name] = GPU_DEFAULTS[name]
    if environ is os.environ:
        _set_by_project.update(chosen)
    return chosen


def gpu_environment(
    environ: Mapping[str, str] | None = None, set_by_project: set[str] | None = None
) -> list[str]:
    """Each of GPU_DEFAULTS as this process has it, for the record: `NAME=value (project
    default)`, `NAME=value (user)`, or `NAME unset` (TensorFlow started by other code)."""
    environ = os.environ if environ is None else environ
    ours = _set_by_project if set_by_project is None else set_by_project
    rows = []
    for name, default in GPU_DEFAULTS.items():
        value = environ.get(name)
        if value is None:
            rows.append(f"{name} unset")
            continue
        set_by = "project default" if name in ours and value == default else "user"
        rows.append(f"{name}={value} ({set_by})")
    return rows


def import_tensorflow() -> None:
    """Import TensorFlow once, its banners (written to fd 2 before its logging is configured,
    so TF_CPP_MIN_LOG_LEVEL cannot silence them) sent to /dev/null."""
    if "tensorflow" in sys.modules:
        return
    if importlib.util.find_spec("tensorflow") is None:
        raise UserError(MISSING)
    apply_gpu_defaults()  # read by TensorFlow's GPU runtime: set before it starts
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
