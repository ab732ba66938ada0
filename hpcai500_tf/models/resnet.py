"""ResNet-50 v1.5 in Keras 3: stride 2 sits in the 3x3 convolution of each downsampling block.

(`keras.applications.ResNet50` is v1, with the stride in the first 1x1 convolution.) Width,
depth, input size, channels and class count are parameters so that small presets run the same
code. The EWA detector reuses `resnet_backbone` with 16 input channels.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import layers

STAGE_FILTERS = (64, 128, 256, 512)
RESNET50_BLOCKS = (3, 4, 6, 3)
EXPANSION = 4


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
        input_gradient = tf.raw_ops.Conv2DBackpropInput(
            input_sizes=tf.shape(inputs),
            filter=kernel,
            out_backprop=upstream,
            strides=[1, 1, 1, 1],
            padding="VALID",
        )
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


@keras.saving.register_keras_serializable("hpcai500_tf")
class Conv2D(layers.Conv2D):
    """Keras Conv2D that sends 1x1, stride-1, bias-free kernels through `_pointwise_conv`,
    and strided bfloat16 kernels over one-column inputs through their centre column (below);
    every other convolution is the stock layer."""

    def call(self, inputs):
        if self.use_bias or self.padding != "same" or self.dilation_rate != (1, 1):
            return super().call(inputs)
        if self.kernel_size == (1, 1) and self.strides == (1, 1):
            return _pointwise_conv(inputs, tf.cast(self.kernel, inputs.dtype))
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


@tf.custom_gradient
def _relu_bfloat16(inputs):
    """max(x, 0) on bfloat16 computed as an int16 max over the bits.

    Non-negative bfloat16 values order like their int16 bits and negative ones have negative
    bits, so the integer max is the ReLU, except that a NaN with the sign bit set becomes 0
    (positive NaNs pass). TensorFlow's bfloat16 Relu kernel takes 21 ms at 32x56x56x256 here;
    this takes 4.5 ms (4.3 % on the bf16 ResNet-50 train step, batch 32). The gradient is
    TensorFlow's ReluGrad on the outputs, as for its Relu. A NaN hidden here still ends the
    run: the batch norm before it turns it into NaN gradients, hence NaN weights, which the
    train step's finiteness check sees (`Engine._weights_finite_check`).
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


def _conv(filters: int, kernel: int, strides: int, name: str) -> layers.Conv2D:
    return Conv2D(
        filters,
        kernel,
        strides=strides,
        padding="same",
        use_bias=False,
        kernel_initializer=keras.initializers.VarianceScaling(2.0, "fan_out", "truncated_normal"),
        name=name,
    )


@keras.saving.register_keras_serializable("hpcai500_tf")
class FusedBatchNorm(layers.Layer):
    """Batch normalisation over the channels of NHWC tensors with TensorFlow's fused kernel.

    Keras 3's BatchNormalization computes moments and the normalisation as separate ops (in
    float32, with casts around them under mixed precision); the fused kernel does it in one
    pass and takes bfloat16/float16 activations with float32 statistics directly.
    Moving statistics: moving = momentum * moving + (1 - momentum) * batch.
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
            outputs, mean, variance = tf.compat.v1.nn.fused_batch_norm(
                inputs, self.gamma, self.beta, epsilon=self.epsilon, is_training=True
            )
            decay = 1.0 - self.momentum
            self.moving_mean.assign_sub((self.moving_mean - mean) * decay)
            self.moving_variance.assign_sub((self.moving_variance - variance) * decay)
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


def _batch_norm(name: str, momentum: float, epsilon: float, zero_gamma: bool = False):
    return FusedBatchNorm(
        momentum=momentum,
        epsilon=epsilon,
        name=name,
        gamma_initializer="zeros" if zero_gamma else "ones",
    )


def bottleneck(x, filters: int, strides: int, name: str, bn: dict, zero_init_residual: bool):
    """1x1 reduce, 3x3 (carries the stride: v1.5), 1x1 expand; projection when shapes change."""
    shortcut = x
    out_filters = filters * EXPANSION
    if strides != 1 or x.shape[-1] != out_filters:
        shortcut = _conv(out_filters, 1, strides, f"{name}_proj_conv")(x)
        shortcut = _batch_norm(f"{name}_proj_bn", **bn)(shortcut)
    x = _conv(filters, 1, 1, f"{name}_1_conv")(x)
    x = _batch_norm(f"{name}_1_bn", **bn)(x)
    x = layers.ReLU(name=f"{name}_1_relu")(x)
    x = _conv(filters, 3, strides, f"{name}_2_conv")(x)
    x = _batch_norm(f"{name}_2_bn", **bn)(x)
    x = layers.ReLU(name=f"{name}_2_relu")(x)
    x = _conv(out_filters, 1, 1, f"{name}_3_conv")(x)
    x = _batch_norm(f"{name}_3_bn", zero_gamma=zero_init_residual, **bn)(x)
    x = layers.Add(name=f"{name}_add")([shortcut, x])
    # After the residual add, the bfloat16-bit ReLU; the ReLUs after batch norms stay
    # TensorFlow's own, which its graph optimiser fuses into the batch-norm kernel.
    return ReLU(name=f"{name}_out")(x)


def resnet_backbone(
    inputs,
    width: float = 1.0,
    blocks: tuple[int, ...] = RESNET50_BLOCKS,
    bn_momentum: float = 0.9,
    bn_epsilon: float = 1e-5,
    zero_init_residual: bool = True,
) -> list:
    """Stem and four stages; returns the output of every stage (C2..C5)."""
    if width <= 0 or len(blocks) != 4 or min(blocks) < 1:
        raise ValueError(
            f"width must be > 0 and blocks four positive counts, got {width}, {blocks}"
        )
    bn = {"momentum": bn_momentum, "epsilon": bn_epsilon}
    x = _conv(max(8, int(64 * width)), 7, 2, "stem_conv")(inputs)
    x = _batch_norm("stem_bn", **bn)(x)
    x = layers.ReLU(name="stem_relu")(x)
    x = layers.MaxPooling2D(3, strides=2, padding="same", name="stem_pool")(x)
    stage_outputs = []
    for stage, (filters, count) in enumerate(zip(STAGE_FILTERS, blocks, strict=True), start=2):
        filters = max(8, int(filters * width))
        for block in range(count):
            strides = 2 if block == 0 and stage > 2 else 1
            x = bottleneck(
                x, filters, strides, f"stage{stage}_block{block + 1}", bn, zero_init_residual
            )
        stage_outputs.append(x)
    return stage_outputs


def resnet50_v15(
    image_size: int = 224,
    channels: int = 3,
    num_classes: int = 1000,
    width: float = 1.0,
    blocks: tuple[int, ...] = RESNET50_BLOCKS,
    bn_momentum: float = 0.9,
    bn_epsilon: float = 1e-5,
    zero_init_residual: bool = True,
) -> keras.Model:
    """The classifier: backbone, global average pool, dense logits (always float32)."""
    inputs = keras.Input((image_size, image_size, channels), name="images")
    features = resnet_backbone(
        inputs, width, tuple(blocks), bn_momentum, bn_epsilon, zero_init_residual
    )[-1]
    x = layers.GlobalAveragePooling2D(name="pool")(features)
    logits = layers.Dense(
        num_classes,
        kernel_initializer=keras.initializers.RandomNormal(stddev=0.01),
        dtype="float32",
        name="logits",
    )(x)
    return keras.Model(inputs, logits, name="resnet50_v1.5")


def analytical_forward_flops(model: keras.Model) -> float:
    """2 x multiply-adds of every convolution and dense layer at the model's input size."""
    total = 0
    for layer in model.layers:
        if isinstance(layer, layers.Conv2D):
            kh, kw = layer.kernel_size
            _, height, width, out_channels = layer.output.shape
            total += 2 * kh * kw * layer.input.shape[-1] * out_channels * height * width
        elif isinstance(layer, layers.Dense):
            total += 2 * layer.input.shape[-1] * layer.units
    return float(total)
