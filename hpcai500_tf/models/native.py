"""The project's own TensorFlow CPU ops (models/native/*.cc), compiled for this machine on
first use and loaded: batch normalisation in training with the ReLU after it folded in
(`batch_norm`), or a residual add and the ReLU after that (`batch_norm_add`).

Built with the C++ compiler (`CXX`, else g++) against the installed TensorFlow's headers
(`tf.sysconfig`), the loops for this CPU (-march=native), into a cache directory
(HPCAI500_NATIVE_CACHE, else ~/.cache/hpcai500-tf/native) under a name that hashes the
sources, the compiler, TensorFlow's version and flags and the CPU's flags: a cluster whose
nodes share a home directory but not a CPU builds once per kind, and concurrent workers
each write their own temporary file and rename it. Where no compiler is found or the build
fails, `unavailable()` says why and the models keep TensorFlow's own kernels.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import tensorflow as tf
from tensorflow.python.framework import graph_util
from tensorflow.python.framework import ops as tf_ops

from hpcai500_tf.cluster.machine import cpu_flags

SOURCES = Path(__file__).with_name("native")
KERNEL_LOOPS = "batch_norm_kernels.cc"  # no TensorFlow header: compiled for this CPU
OP_GLUE = "batch_norm_ops.cc"  # TensorFlow's headers: compiled as TensorFlow's wheel is
LOOP_FLAGS = ("-O3", "-march=native", "-fPIC")
GLUE_FLAGS = ("-O2", "-fPIC", "-w")
BUILD_SECONDS = 300


def cache_dir() -> Path:
    configured = os.environ.get("HPCAI500_NATIVE_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "hpcai500-tf" / "native"


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++"))


def _build_key(compiler: str) -> str:
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, errors="replace", timeout=60
    ).stdout
    digest = hashlib.sha256()
    for part in (
        version,
        tf.__version__,
        *LOOP_FLAGS,
        *GLUE_FLAGS,
        *tf.sysconfig.get_compile_flags(),
        *tf.sysconfig.get_link_flags(),
        " ".join(sorted(cpu_flags())),
    ):
        digest.update(part.encode() + b"\0")
    for source in sorted([*SOURCES.glob("*.cc"), *SOURCES.glob("*.h")]):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:16]


def _compile(compiler: str, target: Path) -> None:
    """Compile and link the library into `target` (through a temporary file beside it)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as scratch:
        work = Path(scratch)
        loops, glue, library = work / "loops.o", work / "glue.o", work / target.name
        steps = [
            [compiler, *LOOP_FLAGS, "-c", str(SOURCES / KERNEL_LOOPS), "-o", str(loops)],
            [compiler, *GLUE_FLAGS, "-c", str(SOURCES / OP_GLUE), "-o", str(glue),
             *tf.sysconfig.get_compile_flags()],
            [compiler, "-shared", str(loops), str(glue), "-o", str(library),
             *tf.sysconfig.get_link_flags()],
        ]  # fmt: skip
        for step in steps:
            done = subprocess.run(
                step, capture_output=True, text=True, errors="replace", timeout=BUILD_SECONDS
            )
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no message"])[-1]
                raise RuntimeError(f"{Path(step[0]).name} exited {done.returncode}: {last}")
        os.replace(library, target)


@functools.cache
def _loaded():
    """(the loaded op module, None) or (None, why not)."""
    compiler = _compiler()
    if compiler is None:
        return None, f"no C++ compiler ({os.environ.get('CXX', 'g++')}) to build the ops with"
    try:
        target = cache_dir() / f"hpcai500_ops-{_build_key(compiler)}.so"
        if not target.exists():
            _compile(compiler, target)
        module = tf.load_op_library(str(target))
    except (OSError, ValueError, RuntimeError, subprocess.SubprocessError, tf.errors.OpError) as e:
        return None, f"the ops did not build or load: {e}"
    return module, None


def unavailable() -> str | None:
    """Why the ops cannot run in this process, or None where they can (builds them once)."""
    return _loaded()[1]


def ops():
    """The loaded op module (`unavailable()` must be None)."""
    module, why = _loaded()
    if module is None:
        raise RuntimeError(why)
    return module


def batch_norm(x, scale, offset, moving_mean, moving_variance, epsilon, factor, relu):
    """Training-mode batch norm over the last axis of `x` (bfloat16 or float32), then the
    ReLU where `relu`: (y, new moving mean, new moving variance), the moving statistics
    updated as FusedBatchNormV3 updates them (the unbiased batch variance, weight `factor`)."""
    y, _, _, new_mean, new_variance = ops().hpcai_batch_norm(
        x, scale, offset, moving_mean, moving_variance,
        epsilon=epsilon, exponential_avg_factor=factor, relu=relu,
    )  # fmt: skip
    return y, new_mean, new_variance


@tf.RegisterGradient("HpcaiBatchNorm")
def _batch_norm_gradient(op, upstream, *_):
    """Gradients of x, scale and offset from y's alone (the statistics are not
    differentiated through); none for the moving statistics."""
    x, scale, offset = op.inputs[:3]
    mean, inv_std = op.outputs[1:3]
    dx, dscale, doffset = ops().hpcai_batch_norm_grad(
        upstream, x, scale, offset, mean, inv_std, relu=op.get_attr("relu")
    )
    return dx, dscale, doffset, None, None


def batch_norm_add(
    x, side, scale, offset, moving_mean, moving_variance, epsilon, factor, again=False
):
    """max(batch_norm(x) + side, 0), the batch norm's as in `batch_norm`: (y, y_again, new
    moving mean, new moving variance). Where `again`, y_again is y (the same buffer) for a
    second consumer: the gradients of the two come to this op's gradient apart, and its
    kernel adds them up where TensorFlow would have run an AddN over the whole tensor first;
    else y_again is None (a y_again nothing consumes would get a gradient of zeros)."""
    y, _, _, new_mean, new_variance, y_again = ops().hpcai_batch_norm_add(
        x, side, scale, offset, moving_mean, moving_variance,
        epsilon=epsilon, exponential_avg_factor=factor, again=int(again),
    )  # fmt: skip
    return y, (y_again[0] if again else None), new_mean, new_variance


@tf.RegisterGradient("HpcaiBatchNormAdd")
def _batch_norm_add_gradient(op, upstream, *others):
    """Gradients of x, side, scale and offset from those of y and y_again (the ReLU's mask
    read from y); others: those of the statistics (not differentiated through), then
    y_again's where it is an output."""
    x, _, scale = op.inputs[:3]
    y, mean, inv_std = op.outputs[:3]
    again = others[4] if len(others) > 4 else None
    upstreams = [dy for dy in (upstream, again) if dy is not None]
    dx, dside, dscale, doffset = ops().hpcai_batch_norm_add_grad(
        upstreams, y, x, scale, mean, inv_std
    )
    return dx, dside, dscale, doffset, None, None


@tf_ops.RegisterStatistics("HpcaiBatchNormAdd", "flops")
def _batch_norm_add_flops(graph, node):
    """The residual add's FLOPs, one per element, as TensorFlow counts AddV2's (the batch
    norm's own are counted for neither this op nor FusedBatchNormV3)."""
    shape = graph_util.tensor_shape_from_node_def_name(graph, node.name)
    shape.assert_is_fully_defined()
    return tf_ops.OpStats("flops", shape.num_elements())


@tf_ops.RegisterStatistics("HpcaiBatchNormAddGrad", "flops")
def _batch_norm_add_grad_flops(graph, node):
    """The sum of y's and y_again's gradients, one add per element for the second, as
    TensorFlow counts the AddN it replaces (the batch norm's own FLOPs are counted for neither
    this op nor FusedBatchNormGradV3)."""
    shape = graph_util.tensor_shape_from_node_def_name(graph, node.name)
    shape.assert_is_fully_defined()
    return tf_ops.OpStats("flops", (node.attr["N"].i - 1) * shape.num_elements())
