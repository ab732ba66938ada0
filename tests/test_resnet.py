import keras
import numpy as np
import pytest
import tensorflow as tf

from hpcai500_tf.measure.flops import count_function
from hpcai500_tf.models import resnet


@pytest.fixture(scope="module")
def resnet50():
    return resnet.resnet50_v15(image_size=224, num_classes=1000)


def test_stride_sits_in_the_3x3_conv(resnet50):
    """v1.5: the downsampling block strides in its 3x3 conv, not in its first 1x1 conv."""
    for stage in (3, 4, 5):
        assert resnet50.get_layer(f"stage{stage}_block1_1_conv").strides == (1, 1)
        assert resnet50.get_layer(f"stage{stage}_block1_2_conv").strides == (2, 2)
        assert resnet50.get_layer(f"stage{stage}_block1_proj_conv").strides == (2, 2)
    assert resnet50.get_layer("stage2_block1_2_conv").strides == (1, 1)


def test_parameter_count_is_resnet50(resnet50):
    trainable = sum(int(np.prod(v.shape)) for v in resnet50.trainable_variables)
    assert trainable == 25_557_032  # the published ResNet-50 count (1000 classes)


def test_profiled_forward_flops_match_the_analytical_count(resnet50):
    forward = tf.function(lambda x: resnet50(x, training=False))
    counted = count_function(forward, tf.zeros([2, 224, 224, 3]), batch=2)
    analytical = resnet.analytical_forward_flops(resnet50)
    assert analytical == pytest.approx(2 * 4.09e9, rel=0.002)  # SPEC: 4.09 GMACs (v1.5)
    assert counted.per_example == pytest.approx(2 * 4.09e9, rel=0.01)
    assert counted.by_op_type["Conv2D"] / 2 == pytest.approx(analytical - 2 * 2048 * 1000)


def test_a_none_batch_is_refused():
    model = resnet.resnet50_v15(image_size=32, num_classes=10, width=0.125, blocks=(1, 1, 1, 1))
    forward = tf.function(lambda x: model(x, training=False))
    with pytest.raises(ValueError, match="fixed batch"):
        count_function(forward, tf.TensorSpec([None, 32, 32, 3]), batch=1)


def test_fused_batch_norm_matches_keras_batch_norm():
    x = tf.random.stateless_normal([8, 5, 5, 6], [1, 2]) * 3 + 1
    fused = resnet.FusedBatchNorm(momentum=0.9, epsilon=1e-5)
    reference = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5)
    fused.build(x.shape)
    reference.build(x.shape)
    np.testing.assert_allclose(fused(x, training=True), reference(x, training=True), atol=1e-4)
    # Moving statistics move the same way (TF's fused kernel returns the unbiased variance).
    np.testing.assert_allclose(fused.moving_mean, reference.moving_mean, atol=1e-5)
    n = 8 * 5 * 5
    np.testing.assert_allclose(
        (np.asarray(fused.moving_variance) - 0.9) / 0.1 * (n - 1) / n,
        (np.asarray(reference.moving_variance) - 0.9) / 0.1,
        rtol=1e-4,
    )
    np.testing.assert_allclose(fused(x, training=False), reference(x, training=False), atol=1e-2)


def test_fused_batch_norm_takes_bfloat16_activations():
    layer = resnet.FusedBatchNorm(dtype="mixed_bfloat16")
    y = layer(tf.cast(tf.random.normal([4, 3, 3, 2]), tf.bfloat16), training=True)
    assert y.dtype == tf.bfloat16 and layer.gamma.dtype == "float32"


@pytest.mark.parametrize("kernel,strides", [(1, 1), (1, 2), (3, 1), (3, 2)])
def test_conv_layer_gives_keras_outputs_and_gradients(kernel, strides):
    """1x1 stride-1 layers take their filter gradient from a matmul; all must match Keras."""
    x = tf.random.stateless_normal([3, 7, 6, 5], [3, 4])
    ours = resnet.Conv2D(4, kernel, strides=strides, padding="same", use_bias=False)
    stock = keras.layers.Conv2D(4, kernel, strides=strides, padding="same", use_bias=False)
    ours.build(x.shape)
    stock.build(x.shape)
    stock.kernel.assign(ours.kernel)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y_ours, y_stock = ours(x), stock(x)
        loss_ours = tf.reduce_sum(y_ours * tf.sin(y_ours))
        loss_stock = tf.reduce_sum(y_stock * tf.sin(y_stock))
    np.testing.assert_allclose(y_ours, y_stock, atol=1e-5)
    for mine, theirs in zip(
        tape.gradient(loss_ours, [x, ours.kernel]),
        tape.gradient(loss_stock, [x, stock.kernel]),
        strict=True,
    ):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-4)


def test_pointwise_conv_trains_in_bfloat16():
    layer = resnet.Conv2D(6, 1, use_bias=False, dtype="mixed_bfloat16")
    x = tf.cast(tf.random.stateless_normal([2, 4, 4, 3], [5, 6]), tf.bfloat16)
    with tf.GradientTape() as tape:
        y = layer(x)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) ** 2)
    (gradient,) = tape.gradient(loss, [layer.kernel])
    expected = tf.einsum("bhwi,bhwo->io", tf.cast(x, tf.float32), 2 * tf.cast(y, tf.float32))
    assert y.dtype == tf.bfloat16 and gradient.dtype == tf.float32
    np.testing.assert_allclose(gradient[0, 0], expected, rtol=2e-2, atol=2e-2)


def test_bfloat16_relu_matches_tensorflow_relu_and_its_gradient():
    special = [np.inf, -np.inf, np.nan, 0.0, -0.0, 3e38, -3e38]
    x = tf.cast(
        tf.concat([tf.random.stateless_normal([200], [7, 8]) * 10, tf.constant(special)], 0),
        tf.bfloat16,
    )
    upstream = tf.cast(tf.random.stateless_normal(x.shape, [9, 10]), tf.bfloat16)
    layer = resnet.ReLU(dtype="mixed_bfloat16")
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        ours, stock = layer(x), tf.nn.relu(x)
    assert ours.dtype == tf.bfloat16
    np.testing.assert_array_equal(tf.cast(ours, tf.float32), tf.cast(stock, tf.float32))
    np.testing.assert_array_equal(
        tf.cast(tape.gradient(ours, x, upstream), tf.float32),
        tf.cast(tape.gradient(stock, x, upstream), tf.float32),
    )
    # Subnormals: TensorFlow's kernel treats them as 0 (it passes -1e-40, zeroes 1e-40);
    # the bit max is the exact ReLU.
    tiny = tf.cast(tf.constant([1e-40, -1e-40]), tf.bfloat16)
    assert tf.cast(layer(tiny), tf.float32).numpy().tolist() == [float(tiny[0]), 0.0]
    capped = resnet.ReLU(max_value=6.0, dtype="mixed_bfloat16")(x)  # not plain: the stock layer
    assert float(tf.reduce_max(tf.boolean_mask(capped, tf.math.is_finite(capped)))) == 6.0


@pytest.mark.parametrize("height,kernel", [(1, 3), (2, 3), (3, 7)])
def test_strided_bfloat16_conv_over_one_column_has_a_finite_right_gradient(height, kernel):
    """oneDNN's bfloat16 filter gradient is garbage at these shapes; the layer avoids it."""
    x = tf.random.stateless_normal([32, height, 1, 16], [1, 2])
    ours = resnet.Conv2D(16, kernel, strides=2, padding="same", use_bias=False)
    ours_bf16 = resnet.Conv2D(
        16, kernel, strides=2, padding="same", use_bias=False, dtype="mixed_bfloat16"
    )
    ours.build(x.shape)
    ours_bf16.build(x.shape)
    ours_bf16.kernel.assign(ours.kernel)
    with tf.GradientTape() as tape:
        expected = tf.reduce_sum(keras.ops.sin(ours(x)))
    (expected_gradient,) = tape.gradient(expected, [ours.kernel])
    for _ in range(10):  # the garbage comes and goes from call to call
        with tf.GradientTape() as tape:
            y = ours_bf16(tf.cast(x, tf.bfloat16))
            loss = tf.reduce_sum(keras.ops.sin(tf.cast(y, tf.float32)))
        (gradient,) = tape.gradient(loss, [ours_bf16.kernel])
        np.testing.assert_allclose(gradient, expected_gradient, rtol=0.05, atol=0.3)
