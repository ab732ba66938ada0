"""Importing TensorFlow for the commands that need it: one line when it is not installed, Keras
pinned to the TensorFlow backend, TensorFlow's native start-up lines kept off the console
(unless the user asked for them), NVIDIA's GPU settings set before it starts, and glibc told
to keep freed memory (freed_memory.py).

Every entry point that runs TensorFlow (the CLI, its worker processes, the PyTorch runner's
feeder, the tools) calls `import_tensorflow()` before any module that imports TensorFlow or
Keras: the project's error line is then the only line a user sees on bad input."""

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

# TensorFlow's own log threshold: 0 all, 1 no INFO, 2 errors only, 3 none. The project defaults
# it to 2; a user who sets it below 2 asks for TensorFlow's logs and gets all of them.
LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
QUIET_LEVEL = 2


def keep_tensorflow_quiet(environ: MutableMapping[str, str] | None = None) -> bool:
    """Default TF_CPP_MIN_LOG_LEVEL to 2 where the user has not set it (child processes inherit
    it); returns whether TensorFlow's logs are to be kept off the console."""
    environ = os.environ if environ is None else environ
    level = environ.setdefault(LOG_LEVEL, str(QUIET_LEVEL))
    try:
        return int(level) >= QUIET_LEVEL
    except ValueError:  # TensorFlow reads a non-number as 0; the user asked for something
        return False


def pin_keras_backend(environ: MutableMapping[str, str] | None = None) -> None:
    """Keras on TensorFlow: KERAS_BACKEND set before Keras is first imported (it outranks
    ~/.keras/keras.json); another backend the user named, or a Keras already loaded on one, is
    refused in one line."""
    environ = os.environ if environ is None else environ
    asked = environ.get("KERAS_BACKEND", "tensorflow")
    if asked != "tensorflow":
        raise UserError(
            f"KERAS_BACKEND={asked}: hpcai500-tf runs Keras on TensorFlow; unset KERAS_BACKEND "
            "or set it to tensorflow"
        )
    environ["KERAS_BACKEND"] = "tensorflow"
    keras = sys.modules.get("keras")
    loaded = keras.backend.backend() if keras is not None and hasattr(keras, "backend") else None
    if loaded not in (None, "tensorflow"):
        raise UserError(
            f"Keras is already loaded on the {loaded} backend in this process; hpcai500-tf "
            "runs Keras on TensorFlow"
        )


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
    """Import TensorFlow and Keras once. Unless the user asked for TensorFlow's logs, the lines
    its native libraries write to fd 2 while they load (absl's pre-initialisation notice,
    oneDNN's, written before TF_CPP_MIN_LOG_LEVEL is read, so it cannot silence them) go to
    /dev/null; after the import the level holds."""
    from hpcai500_tf.freed_memory import keep_freed_memory  # loaded by the commands that train

    pin_keras_backend()
    keep_freed_memory()  # before TensorFlow allocates, where it has not yet
    if "tensorflow" in sys.modules:
        return
    if importlib.util.find_spec("tensorflow") is None:
        raise UserError(MISSING)
    apply_gpu_defaults()  # read by TensorFlow's GPU runtime: set before it starts
    if not keep_tensorflow_quiet():
        import keras  # noqa: F401  (the backend pinned above)
        import tensorflow  # noqa: F401

        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import keras  # noqa: F401
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
