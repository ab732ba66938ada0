"""L4 (accelerator libraries) and L5 (framework) of TensorFlow, read from its build."""

from __future__ import annotations

import platform
import sys

from hpcai500_tf import freed_memory, tensorflow_import
from hpcai500_tf.cluster.machine import cpu_flags
from hpcai500_tf.engine import onednn


def library_layers() -> tuple[dict, dict]:
    """L4 (accelerator libraries) and L5 (framework), read from the TensorFlow build, with
    TensorFlow's GPU settings (a run adds the devices it computes on to L5: they are
    TensorFlow's names, which another framework's runner lacks)."""
    import keras
    import numpy
    import tensorflow as tf

    build = tf.sysconfig.get_build_info()
    on, method = onednn.onednn_state(cpu_flags())
    l4 = {
        "cuda_build": bool(build.get("is_cuda_build")),
        "cuda_version": build.get("cuda_version"),
        "cudnn_version": build.get("cudnn_version"),
        "rocm_build": bool(build.get("is_rocm_build")),
        "onednn": on,  # TensorFlow's oneDNN custom operations, as TensorFlow reports them
        "onednn_method": method,
    }
    l5 = {
        "framework": "tensorflow",
        "framework_version": tf.__version__,
        "keras_version": keras.__version__,
        "numpy_version": numpy.__version__,
        "python_version": platform.python_version(),
        "python_implementation": sys.implementation.name,
        # NVIDIA's ResNet-50 settings of TensorFlow's GPU runtime: each one's value and who
        # set it, the user or this project (inert on a CPU).
        "gpu_environment": tensorflow_import.gpu_environment(),
        "freed_memory": freed_memory.state(),  # glibc keeping it, or why not
    }
    return l4, l5
