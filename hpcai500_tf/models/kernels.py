"""The kernels the models run on: stock Keras layers, or CPU workarounds with the same maths.

The config key `model.kernels` chooses:

- "auto": the CPU workarounds when TensorFlow sees no GPU; when it sees one, the stock
  convolution and ReLU with the fused batch norm below ("gpu-fused-batch-norm"): Keras 3's
  BatchNormalization is separate float32 ops there that nothing fuses without XLA (several
  extra passes over every activation per step, and float32 copies held for the backward pass),
  where TensorFlow's FusedBatchNormV3 is cuDNN's one-pass kernel, float16/bfloat16 in and
  float32 statistics (what TF_USE_CUDNN_BATCHNORM_SPATIAL_PERSISTENT tunes). The other CPU
  workarounds were measured on CPU only;
- "cpu-native-batch-norm": the CPU workarounds with the project's own batch-norm kernel
  (`NativeBatchNorm`, models/native.py), which "auto" takes on a CPU with AMX or AVX-512
  BF16 where the kernel builds (`native_batch_norm_favoured`); not with XLA, which compiles
  no custom op;
- "stock": plain `keras.layers.Conv2D`, `BatchNormalization` and `ReLU`.

The CPU workarounds, each with the measurements that justify it (on this project's CPU):

- `Conv2D` takes the filter gradient of 1x1, stride-1 convolutions from one matrix product:
  TensorFlow's oneDNN matmul computes it 1.5-3.7x faster than its Conv2DBackpropFilter at
  ResNet-50's 1x1 shapes in bfloat16 (2.8x over the whole model), and as fast in float32
  (`benchmarks/filter_gradient.py`). It also keeps strided bfloat16 convolutions over
  one-column inputs off oneDNN's filter gradient, which returns garbage there (up to 1e38, NaN;
  `tests/test_kernels.py` and the mixed-precision tiny run in `tests/test_train.py`).
- `Conv2D` also takes the filter gradient of bfloat16 stride-1 convolutions wider than 1x1
  over inputs up to 7x7 (ResNet-50's last-stage 3x3 layers) from one matrix product per
  kernel tap: 3.8-4.5x faster than oneDNN's bfloat16 Conv2DBackpropFilter at 7x7x512, which
  takes about 5x as long there as at 56x56x64 for the same FLOPs
  (`benchmarks/filter_gradient.py --kernel 3`).
- On CPUs with AMX, `Conv2D` takes the gradients of bfloat16 1x1 stride-2 convolutions
  (ResNet's projections) with outputs up to 28x28 from matmuls: the filter gradient from the
  subsampled input (4.8x oneDNN's over ResNet-50's three projections), the input gradient
  spread over every second pixel; 1.067x over the whole bf16 step
  (`benchmarks/filter_gradient.py --kernel 1 --stride 2`,
  `benchmarks/shifted_gradient_step.py --workaround subsampled`).
- The strided counterpart (`strided_small_bfloat16_conv`, which the CPU set's
  `CPUSymmetricPaddingConv2D` takes): four matmuls over 2x2 blocks of the input for a
  bfloat16 3x3 stride-2 layer with an output up to 7x7 (ResNet-50's last strided layer), on
  CPUs with AMX only (`SPACE_TO_DEPTH_MAX_OUTPUT`): the whole bf16 step 1.02-1.03x there; on
  a Zen 5 EPYC its layer ran 2x faster, the whole step not (docs/performance.md).
- `ReLU` computes the bfloat16 ReLU as an int16 max over the bits: 4.5 ms instead of
  TensorFlow's 21 ms at 32x56x56x256, 4.3 % of the bfloat16 ResNet-50 train step at batch 32.
  It zeroes NaNs with the sign bit set; `finiteness_variables` and `finiteness_term` give the
  train step what it needs to see them anyway.
- `FusedBatchNorm` runs TensorFlow's fused batch-norm kernel: one pass, bfloat16 or float16
  activations with float32 statistics, where Keras 3 computes moments and normalisation as
  separate ops with casts around them under mixed precision.

Every set pads its strided convolutions wider than 1x1, where a model asks for the
reference's padding, with a `SymmetricPaddingConv2D` (pad, then VALID).

A model asks `layer_set(choice)` for its layer classes, each called with Keras' own arguments;
the record's L7 names what ran as `resolve(choice)` gives it.
"""

from __future__ import annotations

from typing import NamedTuple

import keras
import tensorflow as tf
from keras import layers, ops

from hpcai500_tf.cluster.machine import cpu_flags
from hpcai500_tf.errors import UserError
from hpcai500_tf.models import native
from hpcai500_tf.models.kernel_choices import KERNEL_CHOICES

AUTO, STOCK, CPU_WORKAROUNDS, NATIVE_BATCH_NORM, GPU_FUSED_BATCH_NORM = KERNEL_CHOICES
# The CPU features where the native batch norm was measured to speed up the whole train step
# (docs/performance.md: AMX Xeons; AVX-512 BF16 without AMX on AMD Zen 4 and Zen 5, where its
# AVX-512 loops run too); elsewhere (AVX2, AVX-512 without BF16) "auto" keeps FusedBatchNormV3.
NATIVE_BATCH_NORM_MEASURED_ON = ("amx_bf16", "avx512_bf16")


def native_batch_norm_favoured(flags: set[str], xla: bool) -> bool:
    """Whether "auto" takes the native batch norm on a CPU with `flags` (without XLA; the
    kernel must still build)."""
    return not xla and any(flag in flags for flag in NATIVE_BATCH_NORM_MEASURED_ON)


def resolve(choice: str, xla: bool = False) -> str:
    """The kernels a choice runs: one of KERNEL_CHOICES but "auto".

    "auto" gives the fused batch norm when TensorFlow sees a GPU; else the native batch norm
    where `native_batch_norm_favoured` and it builds, else the CPU workarounds. The native
    batch norm asked for by name must build and is refused with XLA (`xla`: training.xla)."""
    if choice == AUTO:
        if tf.config.get_visible_devices("GPU"):  # a worker's share where one was set
            return GPU_FUSED_BATCH_NORM
        favoured = native_batch_norm_favoured(cpu_flags(), xla)
        return NATIVE_BATCH_NORM if favoured and native.unavailable() is None else CPU_WORKAROUNDS
    if choice == NATIVE_BATCH_NORM:
        why = "XLA compiles no custom op (training.xla)" if xla else native.unavailable()
        if why:
            raise UserError(f"kernels '{NATIVE_BATCH_NORM}' cannot run here: {why}")
    if choice in KERNEL_CHOICES:
        return choice
    raise UserError(f"unknown kernels '{choice}' (known: {', '.join(KERNEL_CHOICES)})")


def auto_fallback(choice: str, xla: bool = False) -> str | None:
    """Why "auto" runs the CPU workarounds on a CPU where it takes the native batch norm, for
    the record's warnings (the kernel did not build: no compiler, an unwritable cache, ...);
    None where "auto" was not asked for or runs what it favours."""
    if choice != AUTO or resolve(AUTO, xla) != CPU_WORKAROUNDS:
        return None
    if not native_batch_norm_favoured(cpu_flags(), xla):
        return None  # what "auto" favours here: nothing fell back
    return (  # favoured, yet not taken: only because the kernel is unavailable (resolve)
        f"kernels 'auto' runs '{CPU_WORKAROUNDS}' here, not '{NATIVE_BATCH_NORM}' (the faster "
        f"on this CPU, docs/performance.md): {native.unavailable()}"
    )


# ------------------------------------------------------------------ convolution


def _native_input_gradient(inputs, kernel, upstream, padding: str, stride: int = 1):
    """The native input gradient of a convolution (what the custom gradients keep)."""
    return tf.raw_ops.Conv2DBackpropInput(
        input_sizes=tf.shape(inputs), filter=kernel, out_backprop=upstream,
        strides=[1, stride, stride, 1], padding=padding,
    )  # fmt: skip


@tf.custom_gradient
def _pointwise_conv(inputs, kernel):
    """A 1x1, stride-1 convolution whose filter gradient is one matrix product.

    Over all batch and spatial positions, inputs^T x upstream gradient is exactly the filter
    gradient. TensorFlow's oneDNN matmul computes it 1.5-3.7x faster than its
    Conv2DBackpropFilter at ResNet-50's 1x1 shapes in bfloat16 (2.8x over the whole model),
    and as fast in float32 (`benchmarks/filter_gradient.py`). The forward pass and the input
    gradient stay the native convolution kernels, which run as fast as a matmul would.
    """
    outputs = tf.nn.conv2d(inputs, kernel, strides=1, padding="VALID")

    def gradient(upstream):
        input_gradient = _native_input_gradient(inputs, kernel, upstream, "VALID")
        return input_gradient, pointwise_filter_gradient(inputs, upstream)

    return outputs, gradient


def pointwise_filter_gradient(inputs, upstream):
    """d loss / d kernel of a 1x1, stride-1 convolution: a [1, 1, cin, cout] tensor."""
    in_channels, out_channels = inputs.shape[-1], upstream.shape[-1]
    kernel_gradient = tf.matmul(
        tf.reshape(inputs, [-1, in_channels]),
        tf.reshape(upstream, [-1, out_channels]),
        transpose_a=True,
    )
    return tf.reshape(kernel_gradient, [1, 1, in_channels, out_channels])


# bfloat16 1x1 stride-2 convolutions (ResNet's projections) with outputs no larger than this
# take their gradients from `subsampled_filter_gradient` and `subsampled_input_gradient`, on
# CPUs with this feature, where it was measured: on an AMX Xeon (2 cores, batch 32) the filter
# gradient of ResNet-50's three projections took 89.7 ms in oneDNN's Conv2DBackpropFilter and
# 18.7 ms as the subsample's matmul (3.1-6.3x per layer), the whole bf16 step 1.067x
# (`benchmarks/filter_gradient.py --kernel 1 --stride 2`, `benchmarks/shifted_gradient_step.py
# --workaround subsampled`); in float32 the filter gradient was no faster (1.02x).
SUBSAMPLED_GRADIENT_MAX_OUTPUT = 28
SUBSAMPLED_GRADIENT_MEASURED_ON = "amx_bf16"


@tf.custom_gradient
def _strided_pointwise_conv(inputs, kernel):
    """A 1x1, stride-2 convolution whose filter gradient is the subsampled input's matrix
    product with the upstream gradient (`subsampled_filter_gradient`), and whose input
    gradient is a matmul spread over every second pixel (`subsampled_input_gradient`); the
    forward pass stays the native kernel."""
    outputs = tf.nn.conv2d(inputs, kernel, strides=2, padding="SAME")

    def gradient(upstream):
        input_gradient = subsampled_input_gradient(upstream, kernel, inputs.shape)
        if input_gradient is None:  # odd sizes
            input_gradient = _native_input_gradient(inputs, kernel, upstream, "SAME", stride=2)
        return input_gradient, subsampled_filter_gradient(inputs, upstream)

    return outputs, gradient


def subsampled_input_gradient(upstream, kernel, input_shape):
    """d loss / d input of a 1x1, stride-2, "same" convolution over an input of even height
    and width (`input_shape`, known): upstream x kernel^T at every second pixel, zeros between
    (one matmul and one pad of 2x2 blocks: 1.1-1.6x oneDNN's Conv2DBackpropInput in bfloat16
    at ResNet-50's projections on a 2-core AMX Xeon); None over odd or unknown sizes."""
    _, height, width, in_channels = input_shape
    if height is None or width is None or height % 2 or width % 2:
        return None
    out_channels = upstream.shape[-1]
    products = tf.matmul(tf.reshape(upstream, [-1, out_channels]), kernel[0, 0], transpose_b=True)
    blocks = tf.reshape(products, [-1, height // 2, 1, width // 2, in_channels])
    blocks = tf.pad(blocks, [[0, 0], [0, 0], [0, 1], [0, 0], [0, in_channels]])
    return tf.reshape(blocks, [-1, height, width, in_channels])


def subsampled_filter_gradient(inputs, upstream):
    """d loss / d kernel of a 1x1, stride-2, "same" convolution: it reads every second row and
    column from the first (no padding at a 1x1 kernel), so the gradient is that subsample's
    pointwise one: [1, 1, cin, cout]."""
    return pointwise_filter_gradient(every_second_pixel(inputs), upstream)


def every_second_pixel(inputs):
    """inputs[:, ::2, ::2, :]. Over even sizes, a contiguous slice of 2x2 blocks: each block
    row's first pixels are its first cin values (TensorFlow's strided slice of a bfloat16
    32x28x28x512 tensor took 18.6 ms, this 1.5 ms, on a 2-core AMX Xeon)."""
    batch, height, width, channels = inputs.shape
    if height is None or width is None or height % 2 or width % 2:
        return inputs[:, ::2, ::2, :]
    blocks = tf.reshape(inputs, [-1, height // 2, 2, width // 2, 2 * channels])
    return blocks[:, :, 0, :, :channels]


def _takes_subsampled_gradient(inputs) -> bool:
    """Whether a 1x1, stride-2, "same", bias-free convolution goes through
    `_strided_pointwise_conv`: bfloat16, an output of known size up to
    SUBSAMPLED_GRADIENT_MAX_OUTPUT, on a CPU where it was measured."""
    height, width = inputs.shape[1:3]
    return (
        inputs.dtype == tf.bfloat16
        and height is not None
        and width is not None
        and (max(height, width) + 1) // 2 <= SUBSAMPLED_GRADIENT_MAX_OUTPUT
        and SUBSAMPLED_GRADIENT_MEASURED_ON in cpu_flags()
    )


# bfloat16 stride-1 convolutions (kernels wider than 1x1) over inputs no larger than this
# (height and width) take their filter gradient from `shifted_filter_gradient`: ResNet-50's
# 3x3 layers of the last stage.
SHIFTED_GRADIENT_MAX_SIZE = 7


@tf.custom_gradient
def _small_bfloat16_conv(inputs, kernel):
    """A stride-1, "same" bfloat16 convolution over a small input whose filter gradient is one
    matrix product per kernel tap (`shifted_filter_gradient`).

    oneDNN's bfloat16 Conv2DBackpropFilter slows down as the input shrinks and the channels
    grow (at ResNet-50's 3x3 shapes, batch 32, 7x7x512 took about 5x as long as 56x56x64 for
    the same FLOPs); the nine matmuls ran 3.8-4.5x faster than it at 7x7x512, but slower at
    56x56 and 28x28 and at 14x14 now faster, now slower (0.3-1.4x) over runs
    (`benchmarks/filter_gradient.py --kernel 3`). The forward pass and the input gradient stay
    the native kernels."""
    outputs = tf.nn.conv2d(inputs, kernel, strides=1, padding="SAME")

    def gradient(upstream):
        input_gradient = _native_input_gradient(inputs, kernel, upstream, "SAME")
        return input_gradient, shifted_filter_gradient(inputs, upstream, kernel.shape[:2])

    return outputs, gradient


def shifted_filter_gradient(inputs, upstream, kernel_size):
    """d loss / d kernel of a stride-1, "same" convolution with an odd `kernel_size` (rows,
    columns): for each tap (i, j), the input shifted by it, zero-padded, times the upstream
    gradient over all batch and spatial positions (one matmul each), stacked into
    [rows, columns, cin, cout]."""
    rows, columns = kernel_size
    height, width, in_channels = inputs.shape[1:]
    out_channels = upstream.shape[-1]
    padded = tf.pad(inputs, [[0, 0], [rows // 2] * 2, [columns // 2] * 2, [0, 0]])
    flat_upstream = tf.reshape(upstream, [-1, out_channels])
    taps = [
        tf.matmul(
            tf.reshape(padded[:, i : i + height, j : j + width, :], [-1, in_channels]),
            flat_upstream,
            transpose_a=True,
        )
        for i in range(rows)
        for j in range(columns)
    ]
    return tf.reshape(tf.stack(taps), [rows, columns, in_channels, out_channels])


def _takes_shifted_gradient(inputs, kernel_size) -> bool:
    """Whether a stride-1, "same", bias-free convolution goes through `_small_bfloat16_conv`:
    bfloat16, an odd kernel wider than 1x1 and a small input of known size."""
    height, width = inputs.shape[1:3]
    return (
        inputs.dtype == tf.bfloat16
        and all(size % 2 == 1 for size in kernel_size)
        and kernel_size != (1, 1)
        and height is not None
        and width is not None
        and max(height, width) <= SHIFTED_GRADIENT_MAX_SIZE
    )


# bfloat16 3x3 stride-2 convolutions with outputs no larger than this (height and width) take
# their filter gradient from `space_to_depth_filter_gradient`, on CPUs with this feature, where
# it was measured: on an AMX Xeon (2 cores, batch 32, 2026-12-06) the whole bf16 step 1.022x
# (10 of 10 pairs, `benchmarks/shifted_gradient_step.py --workaround space-to-depth`) and
# 1.033x in fresh processes (6 of 6 rounds); at 14 (stage 4 too) no faster than at 7. On a
# Zen 5 EPYC it ran 2.9x Conv2DBackpropFilter at 7x7 outputs but the whole step 1.7-2.8 %
# slower in three runs: CPUs without AMX keep oneDNN's (docs/performance.md).
SPACE_TO_DEPTH_MAX_OUTPUT = 7
SPACE_TO_DEPTH_MEASURED_ON = "amx_bf16"


@tf.custom_gradient
def strided_small_bfloat16_conv(padded, kernel):
    """A 3x3, stride-2 VALID convolution over an already padded bfloat16 input whose output is
    small (`takes_space_to_depth_gradient`), with its filter gradient from
    `space_to_depth_filter_gradient`: the strided 3x3 layer of ResNet-50's last stage (14x14
    in, 7x7 out at 224x224), where oneDNN's bfloat16 Conv2DBackpropFilter ran at about a
    quarter of its forward rate on a Zen 5 EPYC (`benchmarks/layers_vs_pytorch.py`). The
    forward pass and the input gradient stay the native kernels."""
    outputs = tf.nn.conv2d(padded, kernel, strides=2, padding="VALID")

    def gradient(upstream):
        input_gradient = _native_input_gradient(padded, kernel, upstream, "VALID", stride=2)
        return input_gradient, space_to_depth_filter_gradient(padded, upstream)

    return outputs, gradient


def space_to_depth_filter_gradient(padded, upstream):
    """d loss / d kernel of a 3x3, stride-2 VALID convolution over `padded`: [3, 3, cin, cout].

    Split into 2x2 blocks, the input's pixel (2r + i, 2c + j) is block (r + i // 2, c + j // 2)
    at offset (i % 2, j % 2), so tap (i, j) of output (r, c) reads block offset (i // 2, j // 2)
    from (r, c): four contiguous windows of the blocked input, each one matmul with the
    upstream gradient over all batch and output positions. The blocks' offsets are laid along
    the channels as 01, 00, 10, 11, so that each window takes only the offsets it has taps for
    (all four, 00 and 10, 01 and 00, 00): nine taps' products, the FLOPs of the native kernel."""
    rows, columns = upstream.shape[1:3]
    in_channels, out_channels = padded.shape[-1], upstream.shape[-1]
    even = [[0, 0], [0, 2 * rows + 2 - padded.shape[1]], [0, 2 * columns + 2 - padded.shape[2]]]
    blocked = tf.pad(padded[:, : 2 * rows + 2, : 2 * columns + 2], even + [[0, 0]])
    blocked = tf.reshape(blocked, [-1, rows + 1, 2, columns + 1, 2 * in_channels])
    offsets = [  # contiguous slices (a strided one is 10x slower in bfloat16: every_second_pixel)
        blocked[:, :, i, :, j * in_channels : (j + 1) * in_channels]
        for i, j in ((0, 1), (0, 0), (1, 0), (1, 1))
    ]
    blocked = tf.concat(offsets, axis=-1)  # [batch, rows + 1, columns + 1, 4 cin]
    flat_upstream = tf.reshape(upstream, [-1, out_channels])

    def window(i, j, first, count):  # block offsets first..first+count-1 of window (i, j)
        taken = blocked[:, i : i + rows, j : j + columns, first * in_channels :]
        taken = taken[..., : count * in_channels]
        product = tf.matmul(tf.reshape(taken, [-1, count * in_channels]), flat_upstream,
                            transpose_a=True)  # fmt: skip
        return tf.split(product, count)

    o01, o00, o10, o11 = window(0, 0, 0, 4)
    r02, r12 = window(0, 1, 1, 2)  # offsets 00, 10 of the window one block right
    r21, r20 = window(1, 0, 0, 2)  # offsets 01, 00 of the window one block down
    (r22,) = window(1, 1, 1, 1)
    taps = [o00, o01, r02, o10, o11, r12, r20, r21, r22]
    return tf.reshape(tf.stack(taps), [3, 3, in_channels, out_channels])


def takes_space_to_depth_gradient(padded, kernel_size, strides) -> bool:
    """Whether a VALID convolution over `padded` goes through `strided_small_bfloat16_conv`:
    bfloat16, 3x3, stride 2, an output of known size no larger than
    SPACE_TO_DEPTH_MAX_OUTPUT, on a CPU where it was measured."""
    height, width = padded.shape[1:3]
    return (
        padded.dtype == tf.bfloat16
        and tuple(kernel_size) == (3, 3)
        and tuple(strides) == (2, 2)
        and height is not None
        and width is not None
        and (max(height, width) - 3) // 2 + 1 <= SPACE_TO_DEPTH_MAX_OUTPUT
        and SPACE_TO_DEPTH_MEASURED_ON in cpu_flags()
    )


@keras.saving.register_keras_serializable("hpcai500_tf")
class Conv2D(layers.Conv2D):
    """Keras Conv2D that sends 1x1, stride-1, bias-free kernels through `_pointwise_conv`,
    1x1 stride-2 bfloat16 ones with small outputs on AMX through `_strided_pointwise_conv`,
    small stride-1 bfloat16 ones wider than 1x1 through `_small_bfloat16_conv`, and strided
    bfloat16 kernels over one-column inputs through their centre column (below); every other
    convolution is the stock layer."""

    def call(self, inputs):
        if self.use_bias or self.padding != "same" or self.dilation_rate != (1, 1):
            return super().call(inputs)
        if self.kernel_size == (1, 1) and self.strides == (1, 1):
            return _pointwise_conv(inputs, tf.cast(self.kernel, inputs.dtype))
        if self.kernel_size == (1, 1) and self.strides == (2, 2):
            if _takes_subsampled_gradient(inputs):
                return _strided_pointwise_conv(inputs, tf.cast(self.kernel, inputs.dtype))
        if self.strides == (1, 1) and _takes_shifted_gradient(inputs, self.kernel_size):
            return _small_bfloat16_conv(inputs, tf.cast(self.kernel, inputs.dtype))
        if inputs.dtype == tf.bfloat16 and inputs.shape[2] == 1 and self.strides[1] > 1:
            # TensorFlow's oneDNN bfloat16 filter gradient returns garbage (up to 1e38, NaN)
            # for a strided kernel wider than one column over a one-column input (the last
            # stage of tiny presets). Only the centre column meets the input there, the others
            # meet padding, so the convolution is exactly that column's, whose gradient is
            # right; the other columns' gradient is 0, as it should be.
            centre = (self.kernel_size[1] - 1) // 2
            kernel = self.kernel[:, centre : centre + 1]
            return tf.nn.conv2d(inputs, tf.cast(kernel, inputs.dtype), self.strides, "SAME")
        return super().call(inputs)


# ------------------------------------------------------------------ padded as the reference pads


@keras.saving.register_keras_serializable("hpcai500_tf")
class SymmetricPaddingConv2D(layers.Conv2D):
    """A strided convolution padded as the reference pads it: (k - 1) // 2 before and the rest
    after, in each spatial dimension, then no padding (NVIDIA's `conv2d_block`, mode
    "SAME_RESNET": `tf.pad`, then a VALID convolution, as here). Keras's "same" puts the odd
    pixel of padding after instead: on even inputs it pads one pixel less before, so every
    output reads its inputs one pixel further on. The output size is "same"'s
    (ceil(n / stride)), so the layer keeps `padding="same"` for its shape.

    Not the convolution op's own explicit padding: on CPUs TensorFlow runs that outside
    oneDNN, 1.4-1.6x slower than "same" in float32 and 40-100x in bfloat16 (the strided 3x3
    and 7x7 layers of ResNet-50 at batch 32, forward and both gradients, 2-core AMX Xeon);
    the separate pad takes 0.8-1.2x of "same"'s time there (1.4x for the 7x7 stem in bfloat16,
    whose input gradient training does not compute)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.padding != "same" or any(rate != 1 for rate in self.dilation_rate):
            raise ValueError("SymmetricPaddingConv2D takes padding='same' and no dilation")

    def pads(self) -> list[list[int]]:
        """[before, after] of each spatial dimension."""
        return [[(k - 1) // 2, k - 1 - (k - 1) // 2] for k in self.kernel_size]

    def convolution_op(self, inputs, kernel):
        spatial = self.pads()
        channels_last = self.data_format == "channels_last"
        padding = [[0, 0], *spatial, [0, 0]] if channels_last else [[0, 0], [0, 0], *spatial]
        return self.valid_convolution(ops.pad(inputs, padding), kernel)

    def valid_convolution(self, padded, kernel):
        return ops.conv(
            padded, kernel, strides=list(self.strides), padding="valid",
            data_format=self.data_format,
        )  # fmt: skip


@keras.saving.register_keras_serializable("hpcai500_tf")
class CPUSymmetricPaddingConv2D(SymmetricPaddingConv2D):
    """The CPU kernel set's: a bfloat16 3x3 stride-2 layer over a small output takes its filter
    gradient from 2x2 blocks of its input (`strided_small_bfloat16_conv`), when
    SPACE_TO_DEPTH_MAX_OUTPUT and SPACE_TO_DEPTH_MEASURED_ON allow (AMX: elsewhere it is its
    parent)."""

    def valid_convolution(self, padded, kernel):
        channels_last = self.data_format == "channels_last"
        if channels_last and takes_space_to_depth_gradient(padded, self.kernel_size, self.strides):
            return strided_small_bfloat16_conv(padded, tf.cast(kernel, padded.dtype))
        return super().valid_convolution(padded, kernel)


# ------------------------------------------------------------------ ReLU


@tf.custom_gradient
def _relu_bfloat16(inputs):
    """max(x, 0) on bfloat16 computed as an int16 max over the bits.

    Non-negative bfloat16 values order like their int16 bits and negative ones have negative
    bits, so the integer max is the ReLU, except that a NaN with the sign bit set becomes 0
    (positive NaNs pass). TensorFlow's bfloat16 Relu kernel takes 21 ms at 32x56x56x256 here;
    this takes 4.5 ms (4.3 % on the bf16 ResNet-50 train step, batch 32). The gradient is
    TensorFlow's ReluGrad on the outputs, as for its Relu. A NaN hidden here still ends the
    run: the batch norm before it turns it into NaN gradients, hence NaN weights, which
    `finiteness_term` carries into the loss the run checks.
    """
    bits = tf.maximum(tf.bitcast(inputs, tf.int16), tf.constant(0, tf.int16))
    outputs = tf.bitcast(bits, tf.bfloat16)

    def gradient(upstream):
        return tf.raw_ops.ReluGrad(gradients=upstream, features=outputs)

    return outputs, gradient


@keras.saving.register_keras_serializable("hpcai500_tf")
class ReLU(layers.ReLU):
    """Keras ReLU that takes `_relu_bfloat16` for plain bfloat16 ReLUs (no cap, slope or
    threshold); every other case is the stock layer."""

    def call(self, inputs):
        plain = self.max_value is None and not self.negative_slope and not self.threshold
        if inputs.dtype == tf.bfloat16 and plain:
            return _relu_bfloat16(inputs)
        return super().call(inputs)


# ------------------------------------------------------------------ batch normalisation


@keras.saving.register_keras_serializable("hpcai500_tf")
class FusedBatchNorm(layers.Layer):
    """Batch normalisation over the channels of NHWC tensors with TensorFlow's fused kernel.

    Keras 3's BatchNormalization computes moments and the normalisation as separate ops (in
    float32, with casts around them under mixed precision); the fused kernel does it in one
    pass and takes bfloat16/float16 activations with float32 statistics directly.
    Moving statistics: moving = momentum * moving + (1 - momentum) * batch, as in Keras, except
    that the fused kernel's batch variance is the unbiased one (n / (n - 1) times Keras'); the
    kernel computes the update in the same pass (its `exponential_avg_factor`).
    """

    def __init__(
        self, momentum: float = 0.9, epsilon: float = 1e-5, gamma_initializer="ones", **kwargs
    ):
        super().__init__(**kwargs)
        self.momentum = momentum
        self.epsilon = epsilon
        self.gamma_initializer = keras.initializers.get(gamma_initializer)

    def build(self, input_shape):
        channels = input_shape[-1]
        self.gamma = self.add_weight(
            shape=(channels,), initializer=self.gamma_initializer, name="gamma", autocast=False
        )
        self.beta = self.add_weight(
            shape=(channels,), initializer="zeros", name="beta", autocast=False
        )
        self.moving_mean = self.add_weight(
            shape=(channels,),
            initializer="zeros",
            name="moving_mean",
            trainable=False,
            autocast=False,
        )
        self.moving_variance = self.add_weight(
            shape=(channels,),
            initializer="ones",
            name="moving_variance",
            trainable=False,
            autocast=False,
        )

    def call(self, inputs, training=False):
        if training:
            # The kernel updates the moving statistics itself (exponential_avg_factor): two
            # assigns per layer, where the update written out took six element-wise ops more.
            outputs, moving_mean, moving_variance = tf.compat.v1.nn.fused_batch_norm(
                inputs,
                self.gamma,
                self.beta,
                mean=self.moving_mean,
                variance=self.moving_variance,
                epsilon=self.epsilon,
                is_training=True,
                exponential_avg_factor=1.0 - self.momentum,
            )
            self.moving_mean.assign(moving_mean)
            self.moving_variance.assign(moving_variance)
            return outputs
        outputs, _, _ = tf.compat.v1.nn.fused_batch_norm(
            inputs,
            self.gamma,
            self.beta,
            mean=self.moving_mean,
            variance=self.moving_variance,
            epsilon=self.epsilon,
            is_training=False,
        )
        return outputs

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "momentum": self.momentum,
            "epsilon": self.epsilon,
            "gamma_initializer": keras.initializers.serialize(self.gamma_initializer),
        }


@keras.saving.register_keras_serializable("hpcai500_tf")
class NativeBatchNorm(FusedBatchNorm):
    """`FusedBatchNorm` whose training pass runs the project's own kernel (models/native.py)
    with what follows it folded in: the ReLU where `relu`; where `residual`, the layer takes
    [x, shortcut] and gives max(bn(x) + shortcut, 0), and where `again` gives it twice,
    [y, y_again]: one tensor, for two consumers, whose gradients the kernel adds up itself (no
    AddN over the tensor, which the next block's two branches would need otherwise). Two
    passes over the data forward and
    two backward, float32 sums; the ReLU's mask is recomputed from x (or read from y) in the
    gradient, and a NaN is kept (no finiteness term is needed).

    On a 2-core Xeon with AMX, bfloat16 at batch 32, forward and backward with the ReLU: 36
    against 62 ms for oneDNN's FusedBatchNormV3 at 56x56x256, 1.2-1.9x at every ResNet-50
    shape, 1.1-1.6x in float32; the bfloat16 train step 1.4x (docs/performance.md).
    Inference takes the parent's kernel, then the add and the ReLU."""

    def __init__(
        self, *args, relu: bool = False, residual: bool = False, again: bool = False, **kwargs
    ):
        super().__init__(*args, **kwargs)
        self.relu = relu or residual
        self.residual = residual
        self.again = again and residual

    def build(self, input_shape):
        super().build(input_shape[0] if self.residual else input_shape)

    def call(self, inputs, training=False):
        x, shortcut = inputs if self.residual else (inputs, None)
        if not training or x.dtype not in (tf.bfloat16, tf.float32):
            outputs = super().call(x, training=training)
            if shortcut is None:
                return tf.nn.relu(outputs) if self.relu else outputs
            outputs = tf.nn.relu(outputs + shortcut)
            return [outputs, outputs] if self.again else outputs
        statistics = (self.gamma, self.beta, self.moving_mean, self.moving_variance)
        factor = 1.0 - self.momentum
        if shortcut is None:
            outputs, moving_mean, moving_variance = native.batch_norm(
                x, *statistics, self.epsilon, factor, self.relu
            )
        else:
            y, y_again, moving_mean, moving_variance = native.batch_norm_add(
                x, shortcut, *statistics, self.epsilon, factor, self.again
            )
            outputs = [y, y_again] if self.again else y
        self.moving_mean.assign(moving_mean)
        self.moving_variance.assign(moving_variance)
        return outputs

    def compute_output_shape(self, input_shape):
        if not self.residual:
            return input_shape
        return [input_shape[0]] * 2 if self.again else input_shape[0]

    def get_config(self):
        config = {"relu": self.relu, "residual": self.residual, "again": self.again}
        return {**super().get_config(), **config}


# ------------------------------------------------------------------ what a model builds with


class LayerSet(NamedTuple):
    """The layer classes a model builds with; each takes the Keras layer's own arguments.

    `relu` follows a batch norm, `residual_relu` a residual add. They differ in the CPU set:
    TensorFlow's graph optimiser fuses a ReLU after a batch norm into the batch-norm kernel, so
    only the ReLU after the add gains from the bfloat16-bit one. Where `folds_into_batch_norm`,
    the batch norm applies what follows it itself (`relu=True`: the ReLU; `residual=True`:
    the residual add and its ReLU), and the model puts identities in their places (every set
    builds the same layers)."""

    name: str  # what `resolve` gives: a name of KERNEL_CHOICES but "auto"
    conv: type[layers.Conv2D]
    batch_norm: type[layers.Layer]  # momentum, epsilon, gamma_initializer, name
    relu: type[layers.ReLU]
    residual_relu: type[layers.ReLU]
    padded_conv: type[SymmetricPaddingConv2D]  # strided, wider than 1x1, padded as the reference
    folds_into_batch_norm: bool = False


_LAYER_SETS = {
    CPU_WORKAROUNDS: LayerSet(
        CPU_WORKAROUNDS, Conv2D, FusedBatchNorm, layers.ReLU, ReLU, CPUSymmetricPaddingConv2D
    ),
    NATIVE_BATCH_NORM: LayerSet(
        NATIVE_BATCH_NORM,
        Conv2D,
        NativeBatchNorm,
        layers.ReLU,
        ReLU,
        CPUSymmetricPaddingConv2D,
        folds_into_batch_norm=True,
    ),
    GPU_FUSED_BATCH_NORM: LayerSet(
        GPU_FUSED_BATCH_NORM,
        layers.Conv2D,
        FusedBatchNorm,
        layers.ReLU,
        layers.ReLU,
        SymmetricPaddingConv2D,
    ),
    STOCK: LayerSet(
        STOCK,
        layers.Conv2D,
        layers.BatchNormalization,
        layers.ReLU,
        layers.ReLU,
        SymmetricPaddingConv2D,
    ),
}


def layer_set(choice: str) -> LayerSet:
    """The layer classes of `resolve(choice)`."""
    return _LAYER_SETS[resolve(choice)]


# ------------------------------------------------------------------ finiteness


def _all_layers(layer):
    yield layer
    for inner in getattr(layer, "layers", ()):
        yield from _all_layers(inner)


def finiteness_variables(model: keras.Model, covered=()) -> list:
    """The trainable variables whose finiteness the loss must carry for this model's kernels.

    None unless the model holds a bfloat16-bit `ReLU`, which can hide a NaN from the forward
    pass; then every trainable variable but those in `covered` (those whose finiteness the
    loss already carries, e.g. through weight decay). Decided by the layer's presence, not its
    precision: the term costs one sum per variable and step, and a float32 run on the
    workarounds keeps the guarantee `tests/test_train.py` pins for the tiny preset."""
    if not any(isinstance(layer, ReLU) for layer in _all_layers(model)):
        return []
    covered_ids = {id(variable) for variable in covered}
    return [v for v in model.trainable_variables if id(v) not in covered_ids]


def finiteness_term(variables: list):
    """0, or NaN once any of `variables` is NaN or Inf: a term to add to the loss.

    A NaN the bfloat16 ReLU zeroes still turns the gradients of the batch norm before it, and
    so the weights, into NaN; the loss then shows it one step later."""
    if not variables:
        return 0.0
    total = tf.add_n([tf.reduce_sum(tf.cast(v, tf.float32)) for v in variables])
    return 0.0 * total
