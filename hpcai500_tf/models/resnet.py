"""ResNet-50 v1.5 in Keras 3: stride 2 sits in the 3x3 convolution of each downsampling block.

(`keras.applications.ResNet50` is v1, with the stride in the first 1x1 convolution.) Width,
depth, input size, channels and class count are parameters so that small presets run the same
code. The EWA detector reuses `resnet_backbone` with 16 input channels. The layers come from
`models.kernels` (`kernels`: "auto" or "stock"); the architecture is the same either way.

Three forms are parameters, each the reference's by default for the classifier
(`workloads/settings.py` lists the choices): the last batch norm's initial gamma
(`zero_init_residual`), the logits initialiser and the padding of strided convolutions.
"""

from __future__ import annotations

import keras
from keras import layers

from hpcai500_tf.models.kernels import LayerSet, layer_set

STAGE_FILTERS = (64, 128, 256, 512)
RESNET50_BLOCKS = (3, 4, 6, 3)
EXPANSION = 4
STRIDE_PADDINGS = ("symmetric", "same")
LOGITS_INITIALIZERS = ("variance_scaling", "normal_0.01")


def _he_fan_out():
    """Variance 2 / fan-out, truncated normal: the reference's initialiser of every
    convolution and of the logits (`tf.variance_scaling_initializer(2.0, fan_out,
    truncated_normal)`; Keras's draws the same distribution)."""
    return keras.initializers.VarianceScaling(2.0, "fan_out", "truncated_normal")


def _conv(
    kernel_layers: LayerSet,
    filters: int,
    kernel: int,
    strides: int,
    name: str,
    padding: str = "same",
):
    """A bias-free convolution with He initialisation over the fan-out. Strided convolutions
    wider than 1x1 pad as `padding` says ("symmetric": the kernel set's `padded_conv`, a
    `kernels.SymmetricPaddingConv2D`; "same": Keras's); the others pad alike either way."""
    if padding not in STRIDE_PADDINGS:
        raise ValueError(f"stride_padding must be one of {STRIDE_PADDINGS}, got {padding!r}")
    symmetric = padding == "symmetric" and strides > 1 and kernel > 1
    return (kernel_layers.padded_conv if symmetric else kernel_layers.conv)(
        filters,
        kernel,
        strides=strides,
        padding="same",
        use_bias=False,
        kernel_initializer=_he_fan_out(),
        name=name,
    )


def _batch_norm(
    kernel_layers: LayerSet,
    name: str,
    momentum: float,
    epsilon: float,
    zero_gamma=False,
    **folded,
):
    """A batch norm of the set; `folded` (relu, residual, again) only for a set that folds
    them."""
    return kernel_layers.batch_norm(
        momentum=momentum,
        epsilon=epsilon,
        gamma_initializer="zeros" if zero_gamma else "ones",
        name=name,
        **folded,
    )


def _batch_norm_relu(x, kernel_layers: LayerSet, name: str, bn: dict):
    """Batch norm `{name}_bn`, then ReLU `{name}_relu`; where the set folds the ReLU into its
    batch norm's kernel (`folds_into_batch_norm`), an identity stands in the ReLU's place."""
    if kernel_layers.folds_into_batch_norm:
        x = _batch_norm(kernel_layers, f"{name}_bn", relu=True, **bn)(x)
        return layers.Identity(name=f"{name}_relu")(x)
    x = _batch_norm(kernel_layers, f"{name}_bn", **bn)(x)
    return kernel_layers.relu(name=f"{name}_relu")(x)


def stem(x, kernel_layers: LayerSet, filters: int, bn: dict, padding: str = "same"):
    """7x7 stride-2 convolution, batch norm, ReLU, 3x3 stride-2 max pool: 1/4 resolution.
    (The pool pads as "same" in the reference too.)"""
    x = _conv(kernel_layers, filters, 7, 2, "stem_conv", padding)(x)
    x = _batch_norm_relu(x, kernel_layers, "stem", bn)
    return layers.MaxPooling2D(3, strides=2, padding="same", name="stem_pool")(x)


def bottleneck(
    x,
    kernel_layers: LayerSet,
    filters: int,
    strides: int,
    name: str,
    bn: dict,
    zero_init_residual: bool,
    padding: str = "same",
    last: bool = False,
):
    """1x1 reduce, 3x3 (carries the stride: v1.5), 1x1 expand; projection when shapes change.
    With `zero_init_residual` the last batch norm starts at gamma 0: the block starts as its
    shortcut (the reference starts every gamma at 1). `x` is one tensor, or where the kernel
    set folds the add into the batch norm the previous block's [y, y_again]: y for the
    residual branch, y_again for the shortcut (their gradients meet in that block's kernel);
    such a block gives [y, y_again] too, but the `last` of the backbone, whose output has one
    consumer."""
    x, shortcut = x if isinstance(x, list) else (x, x)
    out_filters = filters * EXPANSION
    if strides != 1 or x.shape[-1] != out_filters:
        shortcut = _conv(kernel_layers, out_filters, 1, strides, f"{name}_proj_conv")(shortcut)
        shortcut = _batch_norm(kernel_layers, f"{name}_proj_bn", **bn)(shortcut)
    x = _conv(kernel_layers, filters, 1, 1, f"{name}_1_conv")(x)
    x = _batch_norm_relu(x, kernel_layers, f"{name}_1", bn)
    x = _conv(kernel_layers, filters, 3, strides, f"{name}_2_conv", padding)(x)
    x = _batch_norm_relu(x, kernel_layers, f"{name}_2", bn)
    x = _conv(kernel_layers, out_filters, 1, 1, f"{name}_3_conv")(x)
    last_bn = {"zero_gamma": zero_init_residual, **bn}
    if kernel_layers.folds_into_batch_norm:  # the add and its ReLU in the batch norm's kernel
        x = _batch_norm(kernel_layers, f"{name}_3_bn", residual=True, again=not last, **last_bn)(
            [x, shortcut]
        )
        x = layers.Identity(name=f"{name}_add")(x)
        return layers.Identity(name=f"{name}_out")(x)
    x = _batch_norm(kernel_layers, f"{name}_3_bn", **last_bn)(x)
    x = layers.Add(name=f"{name}_add")([shortcut, x])
    return kernel_layers.residual_relu(name=f"{name}_out")(x)


def resnet_backbone(
    inputs,
    width: float = 1.0,
    blocks: tuple[int, ...] = RESNET50_BLOCKS,
    bn_momentum: float = 0.9,
    bn_epsilon: float = 1e-5,
    zero_init_residual: bool = True,
    kernels: str = "auto",
    stride_padding: str = "same",
    last_stage: int = 5,
) -> list:
    """Stem and the stages up to `last_stage` (5: all four); returns the output of every stage
    built (C2..C5). Each stage halves the resolution in its first block (but stage 2, after
    the stem's pool). A model cut before stage 5 (the EWA detector) names its cut here, so
    that the block it ends on gives one output. (The EWA detector keeps the defaults: no
    reference code fixes its backbone's forms.)"""
    if width <= 0 or len(blocks) != 4 or min(blocks) < 1:
        raise ValueError(
            f"width must be > 0 and blocks four positive counts, got {width}, {blocks}"
        )
    if not 2 <= last_stage <= 5:
        raise ValueError(f"last_stage must be 2 to 5, got {last_stage}")
    kernel_layers = layer_set(kernels)
    bn = {"momentum": bn_momentum, "epsilon": bn_epsilon}
    x = stem(inputs, kernel_layers, max(8, int(64 * width)), bn, stride_padding)
    stage_outputs = []
    for stage, (filters, count) in enumerate(zip(STAGE_FILTERS, blocks, strict=True), start=2):
        if stage > last_stage:
            break
        filters = max(8, int(filters * width))
        for block in range(count):
            strides = 2 if block == 0 and stage > 2 else 1
            name = f"stage{stage}_block{block + 1}"
            last = stage == last_stage and block == count - 1
            x = bottleneck(
                x, kernel_layers, filters, strides, name, bn, zero_init_residual, stride_padding,
                last,
            )  # fmt: skip
        stage_outputs.append(x[0] if isinstance(x, list) else x)
    return stage_outputs


def resnet50_v15(
    image_size: int = 224,
    channels: int = 3,
    num_classes: int = 1000,
    width: float = 1.0,
    blocks: tuple[int, ...] = RESNET50_BLOCKS,
    bn_momentum: float = 0.9,
    bn_epsilon: float = 1e-5,
    zero_init_residual: bool = False,
    kernels: str = "auto",
    logits_initializer: str = "variance_scaling",
    stride_padding: str = "symmetric",
) -> keras.Model:
    """The classifier: backbone, global average pool, dense logits (always float32). The
    defaults are the reference's forms."""
    if logits_initializer not in LOGITS_INITIALIZERS:
        raise ValueError(
            f"logits_initializer must be one of {LOGITS_INITIALIZERS}, got {logits_initializer!r}"
        )
    inputs = keras.Input((image_size, image_size, channels), name="images")
    features = resnet_backbone(
        inputs,
        width,
        tuple(blocks),
        bn_momentum,
        bn_epsilon,
        zero_init_residual,
        kernels,
        stride_padding,
    )[-1]
    x = layers.GlobalAveragePooling2D(name="pool")(features)
    logits = layers.Dense(
        num_classes,
        kernel_initializer=(
            _he_fan_out()
            if logits_initializer == "variance_scaling"
            else keras.initializers.RandomNormal(stddev=0.01)
        ),
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
