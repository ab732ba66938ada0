"""models/native.py: the project's batch-norm ops compute what FusedBatchNormV3 (with the ReLU,
and the residual add, after it) computes, forward and backward; a model on them builds the
layers of the CPU workarounds and counts the same FLOPs; a machine that cannot build them
keeps TensorFlow's kernels, and asking for them there is refused in one line."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hpcai500_tf.errors import UserError
from hpcai500_tf.measure.flops import count_function
from hpcai500_tf.models import kernels, native, resnet

pytestmark = [
    pytest.mark.skipif(native.unavailable() is not None, reason="no C++ compiler"),
    pytest.mark.usefixtures("float32_policy"),  # conftest's: models in float32
]

EPSILON, FACTOR = 1e-3, 0.1


def _inputs(dtype, shape=(4, 5, 6, 16)):
    """x with a mean far from 0 (the variance must not cancel), a shortcut, an upstream
    gradient, and per-channel scale, offset and moving statistics."""
    channels = shape[-1]
    x = tf.random.stateless_normal(shape, [1, 2]) * 3.0 + 20.0
    side = tf.random.stateless_normal(shape, [3, 4])
    upstream = tf.random.stateless_normal(shape, [5, 6])
    scale = tf.random.stateless_uniform([channels], [7, 8], 0.5, 1.5)
    offset = tf.random.stateless_normal([channels], [9, 10])
    moving = (tf.random.stateless_normal([channels], [11, 12]), tf.ones([channels]) * 2.0)
    return tf.cast(x, dtype), tf.cast(side, dtype), tf.cast(upstream, dtype), scale, offset, moving


def _reference(x, side, upstream, scale, offset, moving, relu, residual):
    """FusedBatchNormV3, then the add and the ReLU, in float32: outputs, moving statistics
    and the gradients of x, side, scale and offset."""
    x, side = tf.cast(x, tf.float32), tf.cast(side, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch([x, side, scale, offset])
        y, mean, variance = tf.compat.v1.nn.fused_batch_norm(
            x, scale, offset, mean=moving[0], variance=moving[1], epsilon=EPSILON,
            is_training=True, exponential_avg_factor=FACTOR,
        )  # fmt: skip
        y = y + side if residual else y
        y = tf.nn.relu(y) if relu else y
    gradients = tape.gradient(
        y, [x, side, scale, offset], output_gradients=tf.cast(upstream, y.dtype)
    )
    return y, mean, variance, gradients


def _native(x, side, upstream, scale, offset, moving, relu, residual):
    with tf.GradientTape() as tape:
        tape.watch([x, side, scale, offset])
        if residual:
            y, _, mean, variance = native.batch_norm_add(
                x, side, scale, offset, *moving, EPSILON, FACTOR
            )
        else:
            y, mean, variance = native.batch_norm(x, scale, offset, *moving, EPSILON, FACTOR, relu)
    gradients = tape.gradient(y, [x, side, scale, offset], output_gradients=upstream)
    return y, mean, variance, gradients


@pytest.mark.parametrize(
    ("dtype", "tolerance"), [(tf.float32, 2e-4), (tf.bfloat16, 3e-2)], ids=["float32", "bfloat16"]
)
@pytest.mark.parametrize(
    ("relu", "residual"), [(False, False), (True, False), (True, True)], ids=["bn", "relu", "add"]
)
def test_the_ops_compute_what_fused_batch_norm_and_its_relu_compute(
    dtype, tolerance, relu, residual
):
    inputs = _inputs(dtype)
    # bfloat16 rounds x; the reference normalises the same rounded values, in float32.
    y, mean, variance, gradients = _native(*inputs, relu, residual)
    want_y, want_mean, want_variance, want_gradients = _reference(*inputs, relu, residual)
    assert y.dtype == dtype

    def close(ours, theirs, what):
        ours, theirs = tf.cast(ours, tf.float32), tf.cast(theirs, tf.float32)
        scale = max(float(tf.reduce_max(tf.abs(theirs))), 1e-6)
        error = float(tf.reduce_max(tf.abs(ours - theirs))) / scale
        assert error < tolerance, f"{what}: {error:.2e} of its largest value"

    close(y, want_y, "y")
    close(mean, want_mean, "moving mean")
    close(variance, want_variance, "moving variance")  # the unbiased batch variance's
    names = ("dx", "dside", "dscale", "doffset")
    for name, ours, theirs in zip(names, gradients, want_gradients, strict=True):
        if name == "dside" and not residual:
            assert ours is None
            continue
        close(ours, theirs, name)


def test_a_mean_far_from_its_spread_keeps_float32_accuracy():
    """x = 100 + 0.1 noise (mean 1000 standard deviations from 0): y and dx against float64,
    within what float32 rounding of the mean allows."""
    shape, channels = (8, 6, 6, 4), 4
    x = 100.0 + 0.1 * tf.random.stateless_normal(shape, [1, 2])
    upstream = tf.random.stateless_normal(shape, [5, 6])
    scale, offset = tf.ones([channels]), tf.zeros([channels])
    moving = (tf.zeros([channels]), tf.ones([channels]))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y, _, _ = native.batch_norm(x, scale, offset, *moving, 0.0, FACTOR, False)
    dx = tape.gradient(y, x, output_gradients=upstream)
    flat = x.numpy().astype(np.float64).reshape(-1, channels)
    normalised = (flat - flat.mean(0)) / flat.std(0)
    g = upstream.numpy().astype(np.float64).reshape(-1, channels)
    want_dx = (g - g.mean(0) - normalised * (g * normalised).mean(0)) / flat.std(0)
    np.testing.assert_allclose(y.numpy().reshape(-1, channels), normalised, atol=2e-3)
    scale_dx = np.abs(want_dx).max()
    np.testing.assert_allclose(
        dx.numpy().reshape(-1, channels) / scale_dx, want_dx / scale_dx, atol=2e-3
    )


@pytest.mark.parametrize("residual", [False, True], ids=["relu", "add"])
def test_a_nan_survives_the_folded_relu(residual):
    x, side, _, scale, offset, moving = _inputs(tf.bfloat16)
    x = tf.tensor_scatter_nd_update(x, [[0, 0, 0, 3]], tf.constant([np.nan], tf.bfloat16))
    if residual:
        y, _, _, _ = native.batch_norm_add(x, side, scale, offset, *moving, EPSILON, FACTOR)
    else:
        y, _, _ = native.batch_norm(x, scale, offset, *moving, EPSILON, FACTOR, True)
    finite = tf.reduce_all(tf.math.is_finite(tf.cast(y, tf.float32)), axis=[0, 1, 2]).numpy()
    assert not finite[3] and finite[[0, 1, 2, 4]].all()  # channel 3's statistics are NaN
    if not residual:
        _, variance, _ = native.batch_norm(x, scale, offset, *moving, EPSILON, 1.0, False)[:3]
        assert np.isnan(variance.numpy()[3])  # the moving variance takes the NaN too


def test_statistics_of_the_wrong_length_are_refused():
    x, _, _, scale, offset, moving = _inputs(tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="one value per channel"):
        native.batch_norm(x, scale[:3], offset, *moving, EPSILON, FACTOR, False)


def _tiny(choice: str) -> keras.Model:
    return resnet.resnet50_v15(
        image_size=32, num_classes=10, width=0.125, blocks=(1, 1, 1, 1), kernels=choice
    )


def _gradient_step(model):
    """A traced step: the gradients of a sum of squares of the model's training output."""

    @tf.function
    def train(images):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(images, training=True) ** 2)
        return tape.gradient(loss, model.trainable_variables)

    return train


def test_a_native_model_builds_the_workarounds_layers_and_counts_their_flops():
    keras.utils.set_random_seed(0)
    workarounds = _tiny("cpu-workarounds")
    keras.utils.set_random_seed(0)
    native_model = _tiny("cpu-native-batch-norm")
    assert [layer.name for layer in native_model.layers] == [
        layer.name for layer in workarounds.layers
    ]
    assert [v.path for v in native_model.weights] == [v.path for v in workarounds.weights]
    assert not {type(layer) for layer in native_model.layers} & {kernels.ReLU, keras.layers.Add}
    images = tf.random.stateless_normal([8, 32, 32, 3], [2, 3])

    counts = [
        count_function(_gradient_step(model), images, batch=8)
        for model in (workarounds, native_model)
    ]
    assert counts[0].total == counts[1].total > 0
    for model in (workarounds, native_model):
        _gradient_step(model)(images)  # a training pass updates the moving statistics alike
    for ours, theirs in zip(native_model.weights, workarounds.weights, strict=True):
        if "moving" in ours.path:
            np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("last_stage", [3, 4])
def test_a_backbone_cut_early_ends_on_a_block_with_one_output(last_stage):
    """The EWA detector cuts the backbone after stage 3 or 4: the block it ends on gives y once
    (nothing would take y_again, whose gradient would be zeros added in the kernel), every
    block before it twice; later stages are not built, and the FLOPs are the workarounds'."""
    images = keras.Input((32, 32, 16))
    built = {}
    for choice in ("cpu-workarounds", "cpu-native-batch-norm"):
        keras.utils.set_random_seed(0)
        outputs = resnet.resnet_backbone(
            images, 0.125, (1, 1, 1, 1), kernels=choice, last_stage=last_stage
        )
        built[choice] = keras.Model(images, outputs[-1])
        assert len(outputs) == last_stage - 1
    model = built["cpu-native-batch-norm"]
    folded = [layer for layer in model.layers if getattr(layer, "residual", False)]
    assert [layer.again for layer in folded] == [True] * (last_stage - 2) + [False]
    assert not any(layer.name.startswith(f"stage{last_stage + 1}") for layer in model.layers)

    data = tf.random.stateless_normal([2, 32, 32, 16], [2, 3])
    counts = [count_function(_gradient_step(m), data, batch=2).total for m in built.values()]
    assert counts[0] == counts[1] > 0
    with pytest.raises(ValueError, match="last_stage must be 2 to 5"):
        resnet.resnet_backbone(images, last_stage=6)


def test_a_checkpoint_of_a_native_model_restores_into_the_workarounds(tmp_path):
    """A run stopped on a CPU with AMX resumes on one without (where "auto" differs)."""
    keras.utils.set_random_seed(0)
    native_model = _tiny("cpu-native-batch-norm")
    keras.utils.set_random_seed(1)
    workarounds = _tiny("cpu-workarounds")
    path = tf.train.Checkpoint(model=native_model).write(str(tmp_path / "ckpt"))
    status = tf.train.Checkpoint(model=workarounds).read(path)
    status.assert_consumed()
    for ours, theirs in zip(native_model.weights, workarounds.weights, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_a_machine_that_cannot_build_the_ops_keeps_tensorflows(monkeypatch, tmp_path):
    monkeypatch.setenv("HPCAI500_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a compiler that fails every step
    module, why = native._loaded.__wrapped__()
    assert module is None and "did not build" in why and "false exited 1" in why, why
    assert not list(tmp_path.glob("*.so"))  # nothing half-written left for the next run
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    assert native._loaded.__wrapped__() == (
        None,
        "no C++ compiler (no-such-compiler-here) to build the ops with",
    )
    monkeypatch.setattr(
        native, "unavailable", lambda: "no C++ compiler (g++) to build the ops with"
    )
    monkeypatch.setattr(kernels, "cpu_flags", lambda: {"amx_bf16"})
    monkeypatch.setattr(tf.config, "get_visible_devices", lambda kind=None: [])
    assert kernels.resolve("auto") == "cpu-workarounds"
    with pytest.raises(UserError) as error:
        kernels.resolve("cpu-native-batch-norm")
    assert str(error.value) == (
        "kernels 'cpu-native-batch-norm' cannot run here: "
        "no C++ compiler (g++) to build the ops with"
    )


@pytest.mark.parametrize(
    ("flags", "taken"),
    [
        ({"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}, True),  # Sapphire Rapids
        ({"avx2", "avx512f", "avx512_bf16"}, True),  # AMD Zen 4
        ({"avx2", "avx512f", "avx512_vnni"}, False),  # AVX-512 without BF16: not measured
        ({"avx2", "fma"}, False),  # AMD Zen 3
    ],
)
def test_auto_takes_the_native_batch_norm_only_where_it_was_measured_faster(
    monkeypatch, flags, taken
):
    monkeypatch.setattr(kernels, "cpu_flags", lambda: flags)
    monkeypatch.setattr(native, "unavailable", lambda: None)
    monkeypatch.setattr(tf.config, "get_visible_devices", lambda kind=None: [])
    assert kernels.resolve("auto") == ("cpu-native-batch-norm" if taken else "cpu-workarounds")
    assert kernels.resolve("auto", xla=True) == "cpu-workarounds"


def test_xla_refuses_the_native_batch_norm_in_one_line():
    with pytest.raises(UserError, match="XLA compiles no custom op") as error:
        kernels.resolve("cpu-native-batch-norm", xla=True)
    assert "\n" not in str(error.value)


def _assert_same_bits(got, want):
    np.testing.assert_array_equal(tf.cast(got, tf.float32), tf.cast(want, tf.float32))


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16], ids=["float32", "bfloat16"])
def test_the_gradients_of_y_and_y_again_are_added_in_the_kernel(dtype):
    """y_again is y; its gradient and y's reach one HpcaiBatchNormAddGrad, no AddN, and give
    exactly what one upstream gradient of their sum (in the data's precision) gives."""
    x, side, upstream, scale, offset, moving = _inputs(dtype, shape=(3, 5, 7, 37))
    other = tf.cast(tf.random.stateless_normal(x.shape, [13, 14]), dtype)

    @tf.function
    def both(x, side):
        with tf.GradientTape() as tape:
            tape.watch([x, side, scale, offset])
            y, y_again, _, _ = native.batch_norm_add(
                x, side, scale, offset, *moving, EPSILON, 0.1, again=True
            )
            loss = tf.reduce_sum(tf.cast(y * upstream, tf.float32))
            loss += tf.reduce_sum(tf.cast(y_again * other, tf.float32))
        return tape.gradient(loss, [x, side, scale, offset])

    @tf.function
    def summed(x, side):
        with tf.GradientTape() as tape:
            tape.watch([x, side, scale, offset])
            y, _, _, _ = native.batch_norm_add(x, side, scale, offset, *moving, EPSILON, 0.1)
        return tape.gradient(y, [x, side, scale, offset], output_gradients=upstream + other)

    graph = both.get_concrete_function(x, side).graph.as_graph_def()
    types = [node.op for node in graph.node]
    assert "AddN" not in types and types.count("HpcaiBatchNormAddGrad") == 1
    for got, want in zip(both(x, side), summed(x, side), strict=True):
        _assert_same_bits(got, want)
    y, y_again, _, _ = native.batch_norm_add(
        x, side, scale, offset, *moving, EPSILON, 0.1, again=True
    )
    _assert_same_bits(y, y_again)


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize(
    ("relu", "residual"), [(False, False), (True, False), (True, True)], ids=["bn", "relu", "add"]
)
def test_outputs_written_over_their_inputs_are_what_fresh_outputs_are(dtype, relu, residual):
    """In a graph whose inputs nothing else holds, TensorFlow lets the kernels write y over
    side, dx over dy or x (or y) and dside over dy, each element after its last read; eagerly,
    the inputs held here, every output has a buffer of its own. Both give the same bits (rows
    and channels that fill no whole vector included, over more than one block of rows)."""
    inputs = _inputs(dtype, shape=(5, 20, 23, 37))  # 85,100 values: more than one block
    fresh = _native(*inputs, relu, residual)

    @tf.function
    def over_inputs(x, side, upstream):
        copies = [tf.raw_ops.DeepCopy(x=t) for t in (x, side, upstream)]  # held by nothing else
        y, mean, variance, gradients = _native(*copies, *inputs[3:], relu, residual)
        return tf.identity(y), mean, variance, gradients

    written_over = over_inputs(*inputs[:3])
    for got, want in zip(tf.nest.flatten(written_over), tf.nest.flatten(fresh), strict=True):
        if want is not None:
            _assert_same_bits(got, want)


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16], ids=["float32", "bfloat16"])
def test_two_upstreams_written_over_are_what_fresh_outputs_are(dtype):
    """The gradients of y and y_again reach one kernel, which may write dside over either
    (and dx over x) where nothing else holds them: the same bits as with fresh outputs."""
    x, side, upstream, scale, offset, moving = _inputs(dtype, shape=(5, 20, 23, 37))
    other = tf.cast(tf.random.stateless_normal(x.shape, [13, 14]), dtype)

    def gradients(x, side, upstream, other):
        with tf.GradientTape() as tape:
            tape.watch([x, side, scale, offset])
            y, y_again, _, _ = native.batch_norm_add(
                x, side, scale, offset, *moving, EPSILON, FACTOR, again=True
            )
        return tape.gradient(
            [y, y_again], [x, side, scale, offset], output_gradients=[upstream, other]
        )

    @tf.function
    def over_inputs(*tensors):
        return gradients(*[tf.raw_ops.DeepCopy(x=t) for t in tensors])  # held by nothing else

    fresh = gradients(x, side, upstream, other)
    for got, want in zip(over_inputs(x, side, upstream, other), fresh, strict=True):
        _assert_same_bits(got, want)


def test_y_given_more_than_twice_is_refused():
    """The op's attr allows any count of y_again; the kernel gives one at most, and says so."""
    x, side, _, scale, offset, moving = _inputs(tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="again is 0 or 1"):
        native.ops().hpcai_batch_norm_add(
            x=x, side=side, scale=scale, offset=offset, moving_mean=moving[0],
            moving_variance=moving[1], epsilon=EPSILON, exponential_avg_factor=0.1, again=2,
        )  # fmt: skip
