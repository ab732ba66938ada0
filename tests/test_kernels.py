"""models/kernels.py: the CPU workarounds compute what the stock Keras layers compute, the
`model.kernels` switch resolves and is validated, and L7 records what ran."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hpcai500_tf import benchmark_layers, config
from hpcai500_tf.errors import UserError
from hpcai500_tf.models import kernels, native, resnet
from hpcai500_tf.workloads import build_workload

pytestmark = pytest.mark.usefixtures("float32_policy")  # conftest's: models in float32


def _tiny_resnet(kernel_choice: str) -> keras.Model:
    return resnet.resnet50_v15(
        image_size=32,
        num_classes=10,
        width=0.125,
        blocks=(1, 1, 1, 1),
        zero_init_residual=False,
        kernels=kernel_choice,
    )


def _twin_resnets(choice: str = "cpu-workarounds") -> tuple[keras.Model, keras.Model]:
    """A tiny ResNet on a CPU kernel set and one on stock layers, with the same weights:
    random batch-norm scales, shifts and moving statistics, so that each path matters, and
    logits of order 10 (not 0.1), so that the tolerances below are tight."""
    keras.utils.set_random_seed(0)  # the convolution kernels too: the same draw in any order
    workarounds, stock = _tiny_resnet(choice), _tiny_resnet("stock")
    for index, variable in enumerate(workarounds.weights):
        seed = [index, 1]
        if variable.path == "logits/kernel":
            variable.assign(tf.random.stateless_normal(variable.shape, seed))
        elif variable.path.endswith("moving_variance"):
            variable.assign(tf.random.stateless_uniform(variable.shape, seed, 0.5, 2.0))
        elif variable.path.endswith(("gamma", "beta", "moving_mean")):
            variable.assign(tf.random.stateless_normal(variable.shape, seed, stddev=0.5))
    stock_weights = {variable.path: variable for variable in stock.weights}
    assert sorted(stock_weights) == sorted(v.path for v in workarounds.weights)
    for variable in workarounds.weights:
        stock_weights[variable.path].assign(variable)
    return workarounds, stock


NATIVE_CLASSES = {kernels.Conv2D, kernels.NativeBatchNorm}
CPU_SETS = [
    ("cpu-workarounds", {kernels.Conv2D, kernels.FusedBatchNorm, kernels.ReLU}),
    pytest.param(
        "cpu-native-batch-norm",
        NATIVE_CLASSES,
        marks=pytest.mark.skipif(native.unavailable() is not None, reason="no C++ compiler"),
    ),
]


@pytest.mark.parametrize(("choice", "workaround_classes"), CPU_SETS)
def test_stock_and_a_cpu_set_give_the_same_logits_and_gradients(
    float32_policy, choice, workaround_classes
):
    workarounds, stock = _twin_resnets(choice)
    assert workaround_classes <= {type(layer) for layer in workarounds.layers}
    assert not workaround_classes & {type(layer) for layer in stock.layers}
    assert resnet.analytical_forward_flops(workarounds) == resnet.analytical_forward_flops(stock)
    # Fused and stock batch norm, and oneDNN's or Eigen's kernels beside the workarounds,
    # round differently (the last stage normalises a few values, which amplifies it): 1e-3 on
    # logits of order 10 and 5e-3 on gradient norms; a wrong path is off by more than 10 %.
    images = tf.random.stateless_normal([8, 32, 32, 3], [2, 3])
    np.testing.assert_allclose(
        workarounds(images, training=False), stock(images, training=False), atol=1e-3, rtol=1e-3
    )
    gradients = []
    for model in (workarounds, stock):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = tf.reduce_sum(logits * tf.sin(logits))
        gradients.append(tape.gradient(loss, model.trainable_variables))
        if model is workarounds:
            expected_logits = logits
    np.testing.assert_allclose(expected_logits, logits, atol=1e-3, rtol=1e-3)
    for variable, ours, theirs in zip(workarounds.trainable_variables, *gradients, strict=True):
        scale = max(float(tf.norm(theirs)), 1e-6)
        assert float(tf.norm(ours - theirs)) / scale < 5e-3, variable.path


def test_auto_resolves_by_the_device_and_the_cpu(monkeypatch):
    monkeypatch.setattr(tf.config, "get_visible_devices", lambda kind=None: [])
    monkeypatch.setattr(kernels, "cpu_flags", lambda: {"avx2", "avx512f"})
    assert kernels.resolve("auto") == "cpu-workarounds"
    assert kernels.layer_set("auto").batch_norm is kernels.FusedBatchNorm
    # A CPU with AMX, where the native batch norm was measured: taken where it builds,
    # never with XLA.
    monkeypatch.setattr(kernels, "cpu_flags", lambda: {"avx512f", "amx_tile", "amx_bf16"})
    builds = native.unavailable() is None
    assert kernels.resolve("auto") == ("cpu-native-batch-norm" if builds else "cpu-workarounds")
    assert kernels.resolve("auto", xla=True) == "cpu-workarounds"
    monkeypatch.setattr(native, "unavailable", lambda: "no C++ compiler (g++)")
    assert kernels.resolve("auto") == "cpu-workarounds"
    monkeypatch.setattr(tf.config, "get_visible_devices", lambda kind=None: ["GPU:0"])
    assert kernels.resolve("auto") == "gpu-fused-batch-norm"
    assert kernels.layer_set("auto") == (
        "gpu-fused-batch-norm", keras.layers.Conv2D, kernels.FusedBatchNorm, keras.layers.ReLU,
        keras.layers.ReLU, kernels.SymmetricPaddingConv2D, False,
    )  # fmt: skip
    assert kernels.resolve("stock") == "stock"
    assert kernels.layer_set("stock") == (
        "stock", keras.layers.Conv2D, keras.layers.BatchNormalization, keras.layers.ReLU,
        keras.layers.ReLU, kernels.SymmetricPaddingConv2D, False,
    )  # fmt: skip


def test_auto_says_why_it_runs_the_workarounds_where_the_native_kernel_did_not_build(
    monkeypatch,
):
    monkeypatch.setattr(tf.config, "get_visible_devices", lambda kind=None: [])
    monkeypatch.setattr(kernels, "cpu_flags", lambda: {"avx512f", "amx_tile", "amx_bf16"})
    monkeypatch.setattr(native, "unavailable", lambda: "the ops did not build or load: denied")
    said = kernels.auto_fallback("auto")
    assert said == (
        "kernels 'auto' runs 'cpu-workarounds' here, not 'cpu-native-batch-norm' (the faster "
        "on this CPU, docs/performance.md): the ops did not build or load: denied"
    )
    # Nothing to say: another choice, XLA (which runs no custom op), a CPU without AMX, a GPU.
    assert kernels.auto_fallback("cpu-workarounds") is None
    assert kernels.auto_fallback("auto", xla=True) is None
    monkeypatch.setattr(kernels, "cpu_flags", lambda: {"avx2"})
    assert kernels.auto_fallback("auto") is None
    monkeypatch.setattr(kernels, "cpu_flags", lambda: {"amx_bf16"})
    monkeypatch.setattr(native, "unavailable", lambda: None)
    assert kernels.auto_fallback("auto") is None
    monkeypatch.setattr(native, "unavailable", lambda: "no C++ compiler (g++)")
    monkeypatch.setattr(tf.config, "get_visible_devices", lambda kind=None: ["GPU:0"])
    assert kernels.auto_fallback("auto") is None


def test_a_run_records_why_auto_did_not_take_the_native_kernel(monkeypatch):
    from hpcai500_tf import config
    from hpcai500_tf.engine import run
    from hpcai500_tf.run.options import RunOptions

    monkeypatch.setattr(kernels, "cpu_flags", lambda: {"avx512f", "amx_bf16"})
    monkeypatch.setattr(native, "unavailable", lambda: "no C++ compiler (g++) to build the ops")
    trainer = run.build_trainer(config.prepare("image_classification", "tiny", []), RunOptions())
    assert trainer.workload.kernels == "cpu-workarounds"
    assert [w for w in trainer.warnings if w.startswith("kernels 'auto' runs")] == [
        kernels.auto_fallback("auto")
    ]


def test_an_unknown_kernels_value_is_refused_in_one_line_naming_it():
    with pytest.raises(UserError, match="unknown kernels 'fast'") as error:
        kernels.resolve("fast")
    assert "\n" not in str(error.value)
    for benchmark in ("image_classification", "extreme_weather"):
        with pytest.raises(UserError) as error:  # with the config, before TensorFlow works
            config.prepare(benchmark, "tiny", ["model.kernels=fast"])
        message = str(error.value)
        assert "\n" not in message and "kernels" in message, message
        assert "must be one of auto, stock, cpu-workarounds" in message, message
        assert "got 'fast'" in message, message


@pytest.mark.parametrize("choice", ["auto", "stock"])
def test_l7_records_the_kernels_that_ran(choice):
    setup = config.prepare("image_classification", "tiny", [f"model.kernels={choice}"])
    workload = build_workload("image_classification", setup.config, None)
    layers = benchmark_layers.run_layers(
        setup,
        workload,
        workers=1,
        replicas=1,
        global_batch=32,
        precision="float32",
        intra_op_threads=1,
    )
    assert layers["L7"]["kernels"] == kernels.resolve(choice)
    assert layers["L7"]["kernels"] != "auto"
    fused = layers["L7"]["kernels"] != "stock"  # auto on this CPU-only machine: the workarounds
    assert layers["L7"]["batch_norm"].startswith("fused") == fused, layers["L7"]


def test_only_a_model_with_the_bfloat16_relu_asks_for_the_finiteness_term(float32_policy):
    keras.utils.set_random_seed(0)  # the convolution kernels too: the same draw in any order
    workarounds, stock = _tiny_resnet("cpu-workarounds"), _tiny_resnet("stock")
    assert kernels.finiteness_variables(stock) == []
    assert kernels.finiteness_term([]) == 0.0
    checked = kernels.finiteness_variables(workarounds)
    assert [v.path for v in checked] == [v.path for v in workarounds.trainable_variables]
    covered = workarounds.trainable_variables[:3]
    assert kernels.finiteness_variables(workarounds, covered) == checked[3:]
    assert float(kernels.finiteness_term(checked)) == 0.0
    checked[-1].assign(tf.fill(checked[-1].shape, float("nan")))
    assert np.isnan(float(kernels.finiteness_term(checked)))


# ------------------------------------------------------------------ each workaround alone


def test_fused_batch_norm_matches_keras_batch_norm():
    x = tf.random.stateless_normal([8, 5, 5, 6], [1, 2]) * 3 + 1
    fused = kernels.FusedBatchNorm(momentum=0.9, epsilon=1e-5)
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


def test_fused_batch_norm_gives_keras_gradients():
    """Gradients through the fused kernel (input, gamma, beta) are Keras batch norm's."""
    x = tf.random.stateless_normal([8, 5, 5, 6], [3, 4]) * 2 + 0.5
    fused = kernels.FusedBatchNorm(momentum=0.9, epsilon=1e-5)
    reference = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5)
    for layer in (fused, reference):
        layer.build(x.shape)
    reference.gamma.assign(tf.random.stateless_normal([6], [5, 6]))
    fused.gamma.assign(reference.gamma)
    results = []
    for layer in (fused, reference):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
            loss = tf.reduce_sum(y * tf.sin(y))
        results.append(tape.gradient(loss, [x, layer.gamma, layer.beta]))
    for ours, theirs in zip(*results, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_the_gpu_set_trains_on_fused_batch_norm_and_no_separate_moments(policy):
    """What "auto" builds on a GPU, traced under a GPU precision policy: every batch norm of
    the train step is FusedBatchNormV3 (its gradient FusedBatchNormGradV3) taking the
    low-precision activations, with none of Keras' separate moments ops in the graph
    (SquaredDifference, Rsqrt; one Mean only, the global average pool: the stock set has 35)."""
    keras.mixed_precision.set_global_policy(policy)
    model = _tiny_resnet("gpu-fused-batch-norm")
    images = tf.TensorSpec([2, 32, 32, 3], tf.float32)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.cast(model(x, training=True), tf.float32))
        return tape.gradient(loss, model.trainable_variables)

    graph = step.get_concrete_function(images).graph
    ops = {op.type for op in graph.get_operations()}
    for function in graph._functions.values():  # the gradient's and the layers' bodies
        ops |= {node.op for node in function.definition.node_def}
    assert {"FusedBatchNormV3", "FusedBatchNormGradV3"} <= ops, sorted(ops)
    assert not ops & {"SquaredDifference", "Rsqrt"}, sorted(ops)
    assert [op.type for op in graph.get_operations()].count("Mean") == 1
    low = tf.float16 if policy == "mixed_float16" else tf.bfloat16
    fused = [op for op in graph.get_operations() if op.type == "FusedBatchNormV3"]
    assert fused and all(op.get_attr("T") == low for op in fused)


def test_fused_batch_norm_takes_bfloat16_activations():
    layer = kernels.FusedBatchNorm(dtype="mixed_bfloat16")
    y = layer(tf.cast(tf.random.normal([4, 3, 3, 2]), tf.bfloat16), training=True)
    assert y.dtype == tf.bfloat16 and layer.gamma.dtype == "float32"


@pytest.mark.parametrize("kernel,strides", [(1, 1), (1, 2), (3, 1), (3, 2)])
def test_conv_layer_gives_keras_outputs_and_gradients(kernel, strides):
    """1x1 stride-1 layers take their filter gradient from a matmul; all must match Keras."""
    x = tf.random.stateless_normal([3, 7, 6, 5], [3, 4])
    ours = kernels.Conv2D(4, kernel, strides=strides, padding="same", use_bias=False)
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
    """The matmul filter gradient in bfloat16 is within bfloat16 rounding of the exact one:
    5 % of the sum of the products' magnitudes (up to 2.1 % seen over 200 random kernels;
    a gradient off by a factor of 2 is at least 46 % off somewhere)."""
    initializer = keras.initializers.GlorotUniform(seed=11)
    layer = kernels.Conv2D(
        6, 1, use_bias=False, kernel_initializer=initializer, dtype="mixed_bfloat16"
    )
    x = tf.cast(tf.random.stateless_normal([2, 4, 4, 3], [5, 6]), tf.bfloat16)
    with tf.GradientTape() as tape:
        y = layer(x)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) ** 2)
    (gradient,) = tape.gradient(loss, [layer.kernel])
    inputs, upstream = tf.cast(x, tf.float32), 2 * tf.cast(y, tf.float32)
    expected = tf.einsum("bhwi,bhwo->io", inputs, upstream)
    magnitude = tf.einsum("bhwi,bhwo->io", tf.abs(inputs), tf.abs(upstream))
    assert y.dtype == tf.bfloat16 and gradient.dtype == tf.float32
    assert np.all(np.abs(gradient[0, 0] - expected) <= 0.05 * magnitude)


def test_bfloat16_relu_matches_tensorflow_relu_and_its_gradient():
    special = [np.inf, -np.inf, np.nan, 0.0, -0.0, 3e38, -3e38]
    x = tf.cast(
        tf.concat([tf.random.stateless_normal([200], [7, 8]) * 10, tf.constant(special)], 0),
        tf.bfloat16,
    )
    upstream = tf.cast(tf.random.stateless_normal(x.shape, [9, 10]), tf.bfloat16)
    layer = kernels.ReLU(dtype="mixed_bfloat16")
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
    capped = kernels.ReLU(max_value=6.0, dtype="mixed_bfloat16")(x)  # not plain: the stock layer
    assert float(tf.reduce_max(tf.boolean_mask(capped, tf.math.is_finite(capped)))) == 6.0


@pytest.mark.parametrize("height,kernel", [(1, 3), (2, 3), (3, 7)])
def test_strided_bfloat16_conv_over_one_column_has_a_finite_right_gradient(height, kernel):
    """oneDNN's bfloat16 filter gradient is garbage at these shapes; the layer avoids it."""
    x = tf.random.stateless_normal([32, height, 1, 16], [1, 2])
    ours = kernels.Conv2D(16, kernel, strides=2, padding="same", use_bias=False)
    ours_bf16 = kernels.Conv2D(
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
        assert np.isfinite(gradient).all(), "the bfloat16 filter gradient is not finite"
        np.testing.assert_allclose(gradient, expected_gradient, rtol=0.05, atol=0.3)


@pytest.mark.parametrize("kernel_size", [(3, 3), (1, 3), (5, 3)])
def test_shifted_filter_gradient_is_tensorflows_filter_gradient(kernel_size):
    """One matmul per tap gives Conv2DBackpropFilter's stride-1 "same" filter gradient."""
    inputs = tf.random.stateless_normal([2, 5, 4, 3], [7, 8])
    upstream = tf.random.stateless_normal([2, 5, 4, 6], [9, 10])
    expected = tf.raw_ops.Conv2DBackpropFilter(
        input=inputs,
        filter_sizes=[*kernel_size, 3, 6],
        out_backprop=upstream,
        strides=[1, 1, 1, 1],
        padding="SAME",
    )
    ours = kernels.shifted_filter_gradient(inputs, upstream, kernel_size)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


def _traced_kernel_gradient(layer, x):
    """The layer's output on `x`, the gradient of sum(y^2) by its kernel, and the op types of
    the traced graph (its functions' too)."""

    @tf.function
    def gradient_of(x):
        with tf.GradientTape() as tape:
            y = layer(x)
            loss = tf.reduce_sum(tf.cast(y, tf.float32) ** 2)
        return y, tape.gradient(loss, layer.kernel)

    y, gradient = gradient_of(x)
    graph = gradient_of.get_concrete_function(x).graph.as_graph_def()
    op_types = {node.op for node in graph.node}
    op_types |= {node.op for function in graph.library.function for node in function.node_def}
    return y, gradient, op_types


@pytest.mark.parametrize("size,shifted", [(1, True), (7, True), (8, False)])
def test_small_bfloat16_3x3_conv_takes_the_shifted_gradient_and_trains(size, shifted):
    """bfloat16 3x3 stride-1 layers up to 7x7 take the shifted filter gradient (a graph
    without Conv2DBackpropFilter); theirs is within bfloat16 rounding of the exact one: 5 % of
    the sum of the products' magnitudes, as for the 1x1 layers."""
    initializer = keras.initializers.GlorotUniform(seed=12)
    layer = kernels.Conv2D(
        4, 3, padding="same", use_bias=False, kernel_initializer=initializer,
        dtype="mixed_bfloat16",
    )  # fmt: skip
    x = tf.cast(tf.random.stateless_normal([2, size, size, 3], [5, 6]), tf.bfloat16)

    y, gradient, op_types = _traced_kernel_gradient(layer, x)
    assert ("Conv2DBackpropFilter" not in op_types) == shifted
    inputs, upstream = tf.cast(x, tf.float32), 2 * tf.cast(y, tf.float32)
    products = [
        tf.raw_ops.Conv2DBackpropFilter(
            input=a, filter_sizes=[3, 3, 3, 4], out_backprop=b, strides=[1] * 4, padding="SAME"
        )
        for a, b in ((inputs, upstream), (tf.abs(inputs), tf.abs(upstream)))
    ]
    assert y.dtype == tf.bfloat16 and gradient.dtype == tf.float32
    assert np.all(np.abs(gradient - products[0]) <= 0.05 * products[1])


@pytest.mark.parametrize("size", [6, 7])
def test_subsampled_filter_gradient_is_tensorflows_filter_gradient(size):
    """A 1x1 stride-2 "same" convolution reads every second row and column from the first,
    even or odd sizes alike: the subsample's matmul is Conv2DBackpropFilter's gradient."""
    inputs = tf.random.stateless_normal([2, size, size, 3], [7, 8])
    out = (size + 1) // 2
    upstream = tf.random.stateless_normal([2, out, out, 5], [9, 10])
    expected = tf.raw_ops.Conv2DBackpropFilter(
        input=inputs, filter_sizes=[1, 1, 3, 5], out_backprop=upstream,
        strides=[1, 2, 2, 1], padding="SAME",
    )  # fmt: skip
    ours = kernels.subsampled_filter_gradient(inputs, upstream)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


def test_subsampled_input_gradient_is_tensorflows_input_gradient():
    """Over even sizes, upstream x kernel^T at every second pixel and zeros between is
    Conv2DBackpropInput's gradient of a 1x1 stride-2 "same" convolution; odd sizes are left to
    it (None)."""
    upstream = tf.random.stateless_normal([2, 3, 4, 5], [9, 10])
    kernel = tf.random.stateless_normal([1, 1, 3, 5], [11, 12])
    expected = tf.raw_ops.Conv2DBackpropInput(
        input_sizes=[2, 6, 8, 3], filter=kernel, out_backprop=upstream,
        strides=[1, 2, 2, 1], padding="SAME",
    )  # fmt: skip
    ours = kernels.subsampled_input_gradient(upstream, kernel, (2, 6, 8, 3))
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)
    assert kernels.subsampled_input_gradient(upstream, kernel, (2, 5, 8, 3)) is None


@pytest.mark.parametrize(
    "flags,size,dtype,subsampled",
    [
        ({"amx_bf16"}, 56, "mixed_bfloat16", True),  # output 28: the projection into stage 3
        ({"amx_bf16"}, 27, "mixed_bfloat16", True),  # odd: the native input gradient
        ({"amx_bf16"}, 58, "mixed_bfloat16", False),  # output 29
        ({"amx_bf16"}, 28, "float32", False),
        ({"avx512_bf16"}, 28, "mixed_bfloat16", False),  # not measured without AMX
    ],
)
def test_small_bfloat16_projections_take_the_subsampled_gradient_on_amx(
    monkeypatch, flags, size, dtype, subsampled
):
    """bfloat16 1x1 stride-2 layers with outputs up to 28x28 take the subsampled gradients on
    CPUs with AMX only (a graph without Conv2DBackpropFilter, and over even sizes without
    Conv2DBackpropInput), within bfloat16 rounding of the exact gradients; the layer's output
    is the native convolution's."""
    monkeypatch.setattr(kernels, "cpu_flags", lambda: flags)
    initializer = keras.initializers.GlorotUniform(seed=12)
    layer = kernels.Conv2D(
        4, 1, strides=2, padding="same", use_bias=False, kernel_initializer=initializer,
        dtype=dtype,
    )  # fmt: skip
    x = tf.cast(tf.random.stateless_normal([2, size, size, 3], [5, 6]), layer.compute_dtype)
    y, gradient, op_types = _traced_kernel_gradient(layer, x)
    assert ("Conv2DBackpropFilter" not in op_types) == subsampled
    assert ("Conv2DBackpropInput" not in op_types) == (subsampled and size % 2 == 0)
    kernel = tf.cast(layer.kernel, x.dtype)
    np.testing.assert_array_equal(y, tf.nn.conv2d(x, kernel, 2, "SAME"))
    with tf.GradientTape() as tape:
        tape.watch(x)
        input_gradient = tape.gradient(tf.reduce_sum(tf.cast(layer(x), tf.float32) ** 2), x)
    # The exact gradients in float64 (numpy): the layer reads x[:, ::2, ::2].
    seen = np.asarray(tf.cast(x, tf.float64))[:, ::2, ::2]
    upstream = 2 * np.asarray(tf.cast(y, tf.float64))
    exact = np.einsum("bhwi,bhwo->io", seen, upstream)
    bound = np.einsum("bhwi,bhwo->io", np.abs(seen), np.abs(upstream))
    assert y.dtype == x.dtype and gradient.dtype == tf.float32
    assert np.all(np.abs(gradient[0, 0] - exact) <= 0.05 * bound + 1e-6)
    weights = np.asarray(tf.cast(kernel, tf.float64))[0, 0]
    exact_input = np.zeros(x.shape)
    exact_input[:, ::2, ::2] = upstream @ weights.T
    bound_input = np.zeros(x.shape)
    bound_input[:, ::2, ::2] = np.abs(upstream) @ np.abs(weights).T
    difference = np.abs(np.asarray(tf.cast(input_gradient, tf.float64)) - exact_input)
    assert np.all(difference <= 0.05 * bound_input + 1e-6)


def test_the_subsampled_gradients_count_the_flops_of_the_native_ones():
    """One matmul over the subsampled input counts what Conv2DBackpropFilter counts for a
    1x1 stride-2 layer (2 x outputs x cin x cout), and the input gradient's matmul what
    Conv2DBackpropInput counts; the subsample and the pad count none."""
    from hpcai500_tf.measure.flops import count_function

    inputs = tf.cast(tf.random.stateless_normal([2, 6, 6, 3], [1, 2]), tf.bfloat16)
    upstream = tf.cast(tf.random.stateless_normal([2, 3, 3, 4], [3, 4]), tf.bfloat16)
    subsampled = tf.function(kernels.subsampled_filter_gradient)
    count = count_function(subsampled, inputs, upstream, batch=2)
    assert count.by_op_type == {"MatMul": 2.0 * (2 * 3 * 3 * 4) * 3}
    kernel = tf.cast(tf.random.stateless_normal([1, 1, 3, 4], [5, 6]), tf.bfloat16)
    spread = tf.function(lambda u, k: kernels.subsampled_input_gradient(u, k, (2, 6, 6, 3)))
    count = count_function(spread, upstream, kernel, batch=2)
    assert count.by_op_type == {"MatMul": 2.0 * (2 * 3 * 3 * 4) * 3}


def test_the_shifted_filter_gradient_counts_the_flops_of_the_native_one():
    """The record's FLOPs do not change with the filter gradient's form: nine matmuls over the
    padded input count what Conv2DBackpropFilter counts (2 x outputs x 3 x 3 x cin)."""
    from hpcai500_tf.measure.flops import count_function

    inputs = tf.cast(tf.random.stateless_normal([2, 5, 5, 3], [1, 2]), tf.bfloat16)
    upstream = tf.cast(tf.random.stateless_normal([2, 5, 5, 4], [3, 4]), tf.bfloat16)
    shifted = tf.function(lambda a, b: kernels.shifted_filter_gradient(a, b, (3, 3)))
    count = count_function(shifted, inputs, upstream, batch=2)
    assert count.by_op_type == {"MatMul": 2.0 * (2 * 5 * 5 * 4) * 3 * 3 * 3}


@pytest.mark.parametrize("height,width", [(6, 7), (9, 16), (16, 16)])
def test_space_to_depth_filter_gradient_is_tensorflows_filter_gradient(height, width):
    """Four windows of the input's 2x2 blocks give Conv2DBackpropFilter's 3x3 stride-2 VALID
    filter gradient, over even and odd padded sizes."""
    padded = tf.random.stateless_normal([2, height, width, 3], [1, 2])
    rows, columns = (height - 3) // 2 + 1, (width - 3) // 2 + 1
    upstream = tf.random.stateless_normal([2, rows, columns, 5], [3, 4])
    expected = tf.raw_ops.Conv2DBackpropFilter(
        input=padded, filter_sizes=[3, 3, 3, 5], out_backprop=upstream,
        strides=[1, 2, 2, 1], padding="VALID",
    )  # fmt: skip
    ours = kernels.space_to_depth_filter_gradient(padded, upstream)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


def test_the_space_to_depth_filter_gradient_counts_the_flops_of_the_native_one():
    """Its matmuls take only the nine taps' products: the record's FLOPs do not change."""
    from hpcai500_tf.measure.flops import count_function

    padded = tf.cast(tf.random.stateless_normal([2, 9, 9, 3], [1, 2]), tf.bfloat16)
    upstream = tf.cast(tf.random.stateless_normal([2, 4, 4, 6], [3, 4]), tf.bfloat16)
    blocked = tf.function(kernels.space_to_depth_filter_gradient)
    count = count_function(blocked, padded, upstream, batch=2)
    assert count.by_op_type == {"MatMul": 2.0 * (2 * 4 * 4 * 6) * 3 * 3 * 3}


@pytest.mark.parametrize(
    "flags,size,blocked",
    [
        ({"amx_bf16"}, 14, True),
        ({"amx_bf16"}, 13, True),
        ({"amx_bf16"}, 15, False),
        ({"amx_bf16"}, 16, False),
        ({"avx512_bf16"}, 14, False),  # slower over the whole step on a Zen 5 EPYC
    ],
)
def test_small_strided_bfloat16_3x3_conv_takes_the_blocked_gradient_and_trains(
    flags, size, blocked, monkeypatch
):
    """On CPUs with AMX, the CPU set's symmetric-padding bfloat16 3x3 stride-2 layers with
    outputs up to 7x7 take the blocked filter gradient (no Conv2DBackpropFilter in the graph),
    within bfloat16 rounding of the exact one (5 % of the sum of the products' magnitudes)."""
    monkeypatch.setattr(kernels, "cpu_flags", lambda: flags)
    layer = kernels.CPUSymmetricPaddingConv2D(
        4, 3, strides=2, padding="same", use_bias=False, dtype="mixed_bfloat16",
        kernel_initializer=keras.initializers.GlorotUniform(seed=12),
    )  # fmt: skip
    x = tf.cast(tf.random.stateless_normal([2, size, size, 3], [5, 6]), tf.bfloat16)

    y, gradient, op_types = _traced_kernel_gradient(layer, x)
    assert ("Conv2DBackpropFilter" not in op_types) == blocked
    padded = tf.pad(tf.cast(x, tf.float32), [[0, 0], [1, 1], [1, 1], [0, 0]])
    upstream = 2 * tf.cast(y, tf.float32)
    products = [
        tf.raw_ops.Conv2DBackpropFilter(
            input=a,
            filter_sizes=[3, 3, 3, 4],
            out_backprop=b,
            strides=[1, 2, 2, 1],
            padding="VALID",
        )  # fmt: skip
        for a, b in ((padded, upstream), (tf.abs(padded), tf.abs(upstream)))
    ]
    assert y.shape[1] == -(-size // 2) and gradient.dtype == tf.float32
    assert np.all(np.abs(gradient - products[0]) <= 0.05 * products[1])


@pytest.mark.parametrize(
    "choice,expected",
    [
        ("cpu-workarounds", "CPUSymmetricPaddingConv2D"),
        ("gpu-fused-batch-norm", "SymmetricPaddingConv2D"),
    ],
)
def test_only_the_cpu_set_builds_the_blocked_strided_layer(choice, expected):
    """(The layer that can take it; where its gate is closed, it convolves as the stock one
    does.)"""
    model = _tiny_resnet(choice)
    strided = {
        type(layer).__name__ for layer in model.layers if "Symmetric" in type(layer).__name__
    }
    assert strided == {expected}
