"""Kernels that measure the machine: GEMM, convolution (forward and both backward passes) and
streaming, each timed with warm-up, a device sync, repetitions to a minimum time, and medians.

Each repetition depends on the previous one's result inside one tf.function (a while loop),
so TensorFlow can neither merge identical calls nor drop them: done naively, identical matmuls
in one function are merged and report several times the machine's peak. On a GPU each loop
iteration runs `chain` dependent kernels, so the loop's own cost per iteration (tens of
microseconds) is spread over them; the time reported is per kernel.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass

import tensorflow as tf

DTYPES = {
    "fp64": tf.float64,
    "fp32": tf.float32,
    "tf32": tf.float32,
    "bf16": tf.bfloat16,
    "fp16": tf.float16,
}
TINY = 1e-30  # couples one repetition to the next without changing the values that matter


@dataclass(frozen=True)
class Timing:
    seconds: float  # median per kernel (per repetition of `step`)
    spread: float  # (max - min) / median over the timed calls
    repetitions: int  # loop iterations per timed call
    calls: int
    chain: int = 1  # dependent kernels per loop iteration


def chain_loop(step, chain: int = 1):
    """The timed tf.function: `count` while-loop iterations of `chain` dependent steps each."""

    def body(i, state):
        for _ in range(chain):
            state = step(state)
        return i + 1, state

    @tf.function
    def run(state, count):
        return tf.while_loop(lambda i, s: i < count, body, (tf.constant(0), state))[1]

    return run


def time_chain(step, state, min_seconds: float, calls: int = 5, chain: int = 1) -> Timing:
    """Time `state = step(state)` repeated in a while loop, `chain` times per iteration;
    median seconds per step."""
    run = chain_loop(step, chain)

    def sync(result):
        flat = tf.nest.flatten(result)
        return float(tf.cast(tf.reshape(flat[0], [-1])[0], tf.float32))  # read back: sync

    count = 1
    sync(run(state, tf.constant(count)))  # trace and warm up
    while True:
        start = time.perf_counter()
        sync(run(state, tf.constant(count)))
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds or count >= 1 << 20:
            break
        count = max(count * 2, int(count * min_seconds / max(elapsed, 1e-6) * 1.2))
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        sync(run(state, tf.constant(count)))
        samples.append((time.perf_counter() - start) / (count * chain))
    median = statistics.median(samples)
    return Timing(median, (max(samples) - min(samples)) / median, count, calls, chain)


def dtype_supported(dtype_name: str) -> str | None:
    """None when this device can multiply and convolve in the dtype; else why not."""
    if dtype_name == "tf32":
        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            return "TF32 exists only on NVIDIA GPUs (Ampere and later)"
        major = tf.config.experimental.get_device_details(gpus[0]).get(
            "compute_capability", (0, 0)
        )[0]
        if major < 8:
            return "this GPU has no TF32 (needs compute capability 8.0)"
        return None
    dtype = DTYPES[dtype_name]
    try:
        a = tf.ones([8, 8], dtype)
        tf.linalg.matmul(a, a).numpy()
        tf.nn.conv2d(tf.ones([1, 4, 4, 2], dtype), tf.ones([1, 1, 2, 2], dtype), 1, "SAME").numpy()
    except (
        tf.errors.NotFoundError,
        tf.errors.InvalidArgumentError,
        tf.errors.UnimplementedError,
    ) as error:
        return f"no {dtype_name} kernel on this device ({error.__class__.__name__})"
    return None


@contextlib.contextmanager
def tf32_for(dtype_name: str):
    """TF32 on for "tf32", off otherwise, while measuring; TensorFlow's setting as it was after
    (the default is on), so the workload's train step runs as training does."""
    before = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(dtype_name == "tf32")
    try:
        yield
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(before)


GEMM_LAYOUTS = ("nn", "nt")  # B as stored, or transposed: oneDNN's speed differs by layout


def gemm(
    n: int, dtype_name: str, min_seconds: float, layout: str | None = None, chain: int = 1
) -> tuple[float, Timing, str]:
    """FLOPS of an n x n x n matrix multiply (2 n^3 per multiply), best over layouts."""
    dtype = DTYPES[dtype_name]
    b = tf.cast(tf.random.stateless_normal([n, n], [1, 2]) / n**0.5, dtype)
    a = tf.cast(tf.random.stateless_normal([n, n], [3, 4]), dtype)
    best = None
    for name in (layout,) if layout else GEMM_LAYOUTS:
        with tf32_for(dtype_name):
            timing = time_chain(
                lambda x, t=(name == "nt"): tf.linalg.matmul(x, b, transpose_b=t),
                a,
                min_seconds,
                chain=chain,
            )
        if best is None or timing.seconds < best[1].seconds:
            best = (2.0 * n**3 / timing.seconds, timing, name)
    return best


@dataclass(frozen=True)
class ConvShape:
    """One convolution: NHWC input of batch x height x width x cin, kernel k x k x cin x cout."""

    name: str
    batch: int
    height: int
    width: int
    cin: int
    cout: int
    kernel: int
    stride: int

    @property
    def out_height(self) -> int:
        return -(-self.height // self.stride)

    @property
    def out_width(self) -> int:
        return -(-self.width // self.stride)

    @property
    def pixels(self) -> str:
        """The input's spatial size for labels: 56px, or 768x1152px."""
        if self.height == self.width:
            return f"{self.height}px"
        return f"{self.height}x{self.width}px"

    def flops(self) -> float:
        outputs = self.batch * self.out_height * self.out_width
        return 2.0 * outputs * self.kernel**2 * self.cin * self.cout

    def bytes(self, itemsize: int) -> float:
        """Minimum traffic of one pass: input, weights and output once each."""
        elements = (
            self.batch * self.height * self.width * self.cin
            + self.kernel**2 * self.cin * self.cout
            + self.batch * self.out_height * self.out_width * self.cout
        )
        return float(elements * itemsize)


def conv_step(shape: ConvShape, dtype_name: str, direction: str):
    """(step, start) of one convolution pass, each step coupled to the previous through the
    filter-sized tensor: no step adds a pass over the input or the output of its own."""
    dtype = DTYPES[dtype_name]
    s, k = shape, shape.kernel
    x = tf.cast(tf.random.stateless_normal([s.batch, s.height, s.width, s.cin], [5, 6]), dtype)
    w = tf.cast(tf.random.stateless_normal([k, k, s.cin, s.cout], [7, 8]) * 0.01, dtype)
    dy = tf.cast(
        tf.random.stateless_normal([s.batch, s.out_height, s.out_width, s.cout], [9, 1]), dtype
    )
    strides = [1, s.stride, s.stride, 1]
    tiny = tf.constant(TINY, tf.float32)

    def couple(tensor, result):
        return tensor + tf.cast(tiny * tf.cast(tf.reshape(result, [-1])[0], tf.float32), dtype)

    if direction == "forward":

        def step(state):
            return couple(state, tf.nn.conv2d(x, state, strides, "SAME"))

    elif direction == "backward_input":

        def step(state):
            return couple(
                state,
                tf.raw_ops.Conv2DBackpropInput(
                    input_sizes=tf.shape(x),
                    filter=state,
                    out_backprop=dy,
                    strides=strides,
                    padding="SAME",
                ),
            )

    elif direction == "backward_filter":
        # The filter gradient reads no filter: the state is a filter-shaped tensor each gradient
        # waits on (a control input), so coupling costs a filter-sized add, no pass over x.
        filter_sizes = tf.constant([k, k, s.cin, s.cout])

        def step(state):
            with tf.control_dependencies([state]):
                gradient = tf.raw_ops.Conv2DBackpropFilter(
                    input=x,
                    filter_sizes=filter_sizes,
                    out_backprop=dy,
                    strides=strides,
                    padding="SAME",
                )
            return couple(state, gradient)

    else:
        raise ValueError(f"unknown direction {direction}")
    return step, w


def conv(
    shape: ConvShape, dtype_name: str, direction: str, min_seconds: float, chain: int = 1
) -> tuple[float, Timing]:
    """FLOPS of one convolution pass: forward, backward_input or backward_filter."""
    step, start = conv_step(shape, dtype_name, direction)
    with tf32_for(dtype_name):
        timing = time_chain(step, start, min_seconds, chain=chain)
    return shape.flops() / timing.seconds, timing


STREAM_KERNELS = ("copy", "scale", "add", "triad")


def stream(
    kernel: str, elements: int, dtype_name: str, min_seconds: float, chain: int = 1
) -> tuple[float, Timing]:
    """Bytes/s of a STREAM-style kernel over arrays far larger than the last-level cache."""
    dtype = DTYPES[dtype_name]
    q = tf.constant(0.5, dtype)
    other = tf.cast(tf.fill([elements], 1.0), dtype)
    itemsize = dtype.size
    if kernel == "copy":  # c = a: read 1, write 1

        def step(a):
            return tf.raw_ops.DeepCopy(x=a)

        moved = 2
    elif kernel == "scale":  # b = q c

        def step(a):
            return q * a

        moved = 2
    elif kernel == "add":  # c = a + b

        def step(a):
            return a + other

        moved = 3
    elif kernel == "triad":  # a = b + q c

        def step(a):
            return other + q * a

        moved = 3
    else:
        raise ValueError(f"unknown stream kernel {kernel}")
    timing = time_chain(step, tf.cast(tf.fill([elements], 1.0), dtype), min_seconds, chain=chain)
    return moved * elements * itemsize / timing.seconds, timing
