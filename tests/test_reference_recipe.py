"""The `reference` preset trains as BenchCouncil's ResNet-50 v1.5 code does: each form is
checked against the reference's arithmetic, written out here from its code (cited per test;
docs/image_classification.md), never taken from this project's own functions. The project's
earlier forms stay available (the `reference-project` preset, config keys), are recorded in L7
and L8, and rank at the free level only."""

import copy
import dataclasses
import json
import math
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from hpcai500_tf import benchmark_layers, config, workload_config
from hpcai500_tf.engine.optimizers import TF1Momentum, build_optimizer
from hpcai500_tf.errors import UserError
from hpcai500_tf.results import scoring
from hpcai500_tf.workloads import build_workload

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "published_2020" / "2_google.json"
SMALL = ["data.image_size=32", "model.width=0.125", "model.blocks=[1, 1, 1, 1]"]


pytestmark = pytest.mark.usefixtures("float32_policy")  # conftest's: models in float32


def _workload(preset: str, overrides=()):
    """The preset's workload on random data (no dataset needed; the model is the preset's)."""
    setup = config.without_data(config.prepare("image_classification", preset, list(overrides)))
    return setup, build_workload("image_classification", setup.config, None)


@pytest.fixture(scope="module")
def reference_model():
    """The reference preset's model as built: ResNet-50 v1.5, 224 x 224, 1001 classes."""
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    keras.utils.set_random_seed(10)
    try:
        return _workload("reference")[1].build_model()
    finally:
        keras.mixed_precision.set_global_policy(previous)


# ------------------------------------------------------------------ 1. the schedule

# A 90-epoch run on 8 GPUs of batch 256 (the fp16 launch script): runner_utils.count_steps
# gives num_samples // global_batch steps an epoch and decays over all of them;
# learning_rate.py scales lr_init by the global batch / 256 and warms up for
# int(steps_per_epoch x lr_warmup_epochs) steps.
GLOBAL_BATCH = 8 * 256
STEPS_PER_EPOCH = 1_281_167 // GLOBAL_BATCH  # 625
TOTAL = 90 * STEPS_PER_EPOCH  # 56,250
WARMUP = int(STEPS_PER_EPOCH * 8)  # 5,000
PEAK = 0.256 * GLOBAL_BATCH / 256  # 2.048


def reference_rate(step: int) -> float:
    """learning_rate.py: tf.cond(step < warmup, peak x step / warmup,
    tf.train.cosine_decay(peak, step, total)), the decay 0.5 (1 + cos(pi min(step, T) / T))."""
    if step < WARMUP:
        return PEAK * step / WARMUP
    return PEAK * 0.5 * (1 + math.cos(math.pi * min(step, TOTAL) / TOTAL))


def _rate_at(optimizer, step: int) -> float:
    optimizer.iterations.assign(step)
    return float(optimizer.learning_rate)


@pytest.mark.parametrize("step", [0, WARMUP - 1, WARMUP, 45 * STEPS_PER_EPOCH, TOTAL - 1], ids=str)
def test_the_rate_is_the_references_at_chosen_steps_of_90_epochs(step):
    setup = config.prepare("image_classification", "reference", [])
    optimizer = build_optimizer(setup.optimizer, GLOBAL_BATCH, STEPS_PER_EPOCH, 90)
    # float32, as TF1's cosine_decay computes too: 1 + cos rounds to a multiple of 6e-8 (the
    # last step's exact 1.6e-9 comes out as 0 in both)
    assert _rate_at(optimizer, step) == pytest.approx(reference_rate(step), rel=1e-6, abs=1e-7)


def test_the_cosine_starts_at_step_0_and_the_earlier_form_after_warm_up():
    """At the end of warm-up the reference drops to 0.98 of peak; at epoch 45 it is at 0.50,
    where the project's earlier form (cosine over the steps after warm-up) was at 0.58."""
    assert reference_rate(WARMUP) / PEAK == pytest.approx(0.9806, abs=1e-4)
    assert reference_rate(45 * STEPS_PER_EPOCH) / PEAK == pytest.approx(0.5, abs=1e-12)
    setup = config.prepare("image_classification", "reference-project", [])
    earlier = build_optimizer(setup.optimizer, GLOBAL_BATCH, STEPS_PER_EPOCH, 90)
    progress = (45 * STEPS_PER_EPOCH - WARMUP) / (TOTAL - WARMUP)
    expected = PEAK * 0.5 * (1 + math.cos(math.pi * progress))
    assert _rate_at(earlier, 45 * STEPS_PER_EPOCH) == pytest.approx(expected, rel=1e-6)
    assert expected / PEAK == pytest.approx(0.5763, abs=1e-4)


# ------------------------------------------------------------------ 2. the initial gammas


def _gammas(model):
    return {v.path: v.numpy() for v in model.weights if v.path.endswith("gamma")}


def test_every_gamma_of_the_reference_model_starts_at_1(reference_model):
    """resnet_v1_5.py: batch_norm_hparams' gamma initialiser is constant 1.0, for every batch
    norm (NVIDIA's bottleneck block passes the same hparams to all three)."""
    gammas = _gammas(reference_model)
    assert len(gammas) == 53  # 1 stem + 16 blocks x 3 + 4 projections
    for path, gamma in gammas.items():
        assert (gamma == 1.0).all(), path


def test_the_earlier_form_starts_the_last_gamma_of_each_block_at_0():
    model = _workload("reference-project", SMALL)[1].build_model()
    for path, gamma in _gammas(model).items():
        assert (gamma == (0.0 if "_3_bn" in path else 1.0)).all(), path


# ------------------------------------------------------------------ 3. the input normalisation


def test_a_known_pixel_is_normalised_as_the_reference_does():
    """data_utils.normalized_inputs: (pixel - [123.68, 116.78, 103.94]) / 255."""
    pixel = np.array([[[[255, 0, 128]]]], np.uint8)
    expected = [(255 - 123.68) / 255, (0 - 116.78) / 255, (128 - 103.94) / 255]
    reference = _workload("reference", SMALL)[1]
    np.testing.assert_allclose(reference.model_inputs(pixel)[0, 0, 0], expected, rtol=1e-6)
    earlier = _workload("reference-project", SMALL)[1]
    stds = [(255 - 123.68) / 58.393, (0 - 116.78) / 57.12, (128 - 103.94) / 57.375]
    np.testing.assert_allclose(earlier.model_inputs(pixel)[0, 0, 0], stds, rtol=1e-6)


# ------------------------------------------------------------------ 4. the logits initialiser


def test_the_logits_start_from_the_references_variance_scaling(reference_model):
    """resnet_v1_5.py: dense_hparams' kernel initialiser is TF1's variance scaling, scale 2,
    fan-out, truncated normal: a normal of sigma sqrt(2 / 1001) / 0.8796 (0.0508) cut at 2
    sigma, whose draws have standard deviation sqrt(2 / 1001) (0.0447); bias 0."""
    logits = reference_model.get_layer("logits")
    kernel, bias = (np.asarray(w, np.float64) for w in logits.get_weights())
    assert kernel.shape == (2048, 1001)
    fan_out = kernel.shape[1]
    sigma = math.sqrt(2.0 / fan_out) / 0.87962566103423978
    assert np.abs(kernel).max() <= 2 * sigma * (1 + 1e-6)
    assert kernel.std() == pytest.approx(math.sqrt(2.0 / fan_out), rel=0.01)  # 2 M draws
    assert abs(kernel.mean()) < 1e-3 and (bias == 0).all()


def test_the_earlier_logits_initialiser_is_normal_0_01():
    model = _workload("reference-project", SMALL)[1].build_model()
    kernel = np.asarray(model.get_layer("logits").kernel)  # 256 x 1001 draws
    assert kernel.std() == pytest.approx(0.01, rel=0.05)
    assert np.abs(kernel).max() > 2 * 0.0101  # not truncated


# ------------------------------------------------------------------ 5. the strided padding


def _first_output_reads(layer, size: int) -> tuple[tuple[int, int], list[int]]:
    """The output size of `layer` (a copy, built alone) over a size x size input, and the
    input rows its first output reads: one tap of the kernel at a time, over an input whose
    pixels are numbered 1, 2, ... (0 is padding)."""
    copy_ = type(layer).from_config(layer.get_config())
    channels = layer.input.shape[-1]
    image = np.zeros([1, size, size, channels], np.float32)
    image[0, :, :, 0] = 1 + np.arange(size * size).reshape(size, size)
    copy_.build(image.shape)
    k = layer.kernel_size[0]
    rows = []
    for tap in range(k):
        kernel = np.zeros(copy_.kernel.shape, np.float32)
        kernel[tap, tap, 0, 0] = 1.0  # the diagonal tap: row and column alike
        copy_.kernel.assign(kernel)
        out = copy_(image)
        number = int(round(float(out[0, 0, 0, 0])))
        rows.append(-99 if number == 0 else (number - 1) // size)  # -99: padding
        if tap == 0:
            shape = tuple(out.shape[1:3])
    return shape, rows


def _strided_convs(model):
    return [
        layer
        for layer in model.layers
        if isinstance(layer, keras.layers.Conv2D) and layer.strides[0] > 1
    ]


def test_every_stride_2_convolution_pads_and_reads_as_the_reference(reference_model):
    """conv2d_block.py, mode SAME_RESNET (the 7x7 stem and the 3x3 convolutions that stride):
    pad (k - 1) // 2 before and the rest after, then VALID; the 1x1 projections pad nothing
    ('SAME' with k = 1). Output size floor((n + k - 1 - k) / 2) + 1; the first output reads
    rows -(k - 1) // 2 ... (k - 1) - (k - 1) // 2."""
    strided = _strided_convs(reference_model)
    assert len(strided) == 7  # the stem, three 3x3 and three projections
    for layer in strided:
        n, k = layer.input.shape[1], layer.kernel_size[0]
        before = (k - 1) // 2
        expected_size = (n + (k - 1) - k) // 2 + 1
        assert tuple(layer.output.shape[1:3]) == (expected_size, expected_size), layer.name
        shape, rows = _first_output_reads(layer, n)
        assert shape == (expected_size, expected_size), layer.name
        first = [row - before for row in range(k)]  # what the reference reads
        assert rows == [row if row >= 0 else -99 for row in first], layer.name


def test_keras_same_padding_reads_one_pixel_further_on_even_inputs():
    model = _workload("reference-project", SMALL)[1].build_model()
    stem = model.get_layer("stem_conv")
    shape, rows = _first_output_reads(stem, 32)
    assert shape == (16, 16)
    assert rows == [-99, -99, 0, 1, 2, 3, 4]  # the reference's: [-99, -99, -99, 0, 1, 2, 3]


def test_the_symmetric_padding_trains_in_bfloat16_over_one_column():
    """The shapes where oneDNN's bfloat16 filter gradient of a 'same' convolution is garbage
    (tests/test_kernels.py): the explicit padding gives finite, right gradients there."""
    from hpcai500_tf.models.kernels import SymmetricPaddingConv2D

    for height, k in ((1, 3), (2, 3), (3, 7)):
        x = tf.random.stateless_normal([32, height, 1, 16], [1, 2])
        ours = SymmetricPaddingConv2D(16, k, strides=2, padding="same", use_bias=False)
        low = SymmetricPaddingConv2D(
            16, k, strides=2, padding="same", use_bias=False, dtype="mixed_bfloat16"
        )
        ours.build(x.shape)
        low.build(x.shape)
        low.kernel.assign(ours.kernel)
        with tf.GradientTape() as tape:
            expected = tf.reduce_sum(keras.ops.sin(ours(x)))
        (expected_gradient,) = tape.gradient(expected, [ours.kernel])
        for _ in range(5):
            with tf.GradientTape() as tape:
                y = low(tf.cast(x, tf.bfloat16))
                loss = tf.reduce_sum(keras.ops.sin(tf.cast(y, tf.float32)))
            (gradient,) = tape.gradient(loss, [low.kernel])
            assert np.isfinite(gradient).all()
            np.testing.assert_allclose(gradient, expected_gradient, rtol=0.05, atol=0.3)


# ------------------------------------------------------------------ 6. the momentum


class _Rates(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, rates):
        self.rates = rates

    def __call__(self, step):
        return tf.gather(tf.constant(self.rates, tf.float32), tf.cast(step, tf.int32))


W0 = np.array([[1.0, -2.0], [0.5, 3.0]])
GRADS = [np.array(g) for g in ([[0.1, 0.2], [-0.3, 0.4]], [[0.5, -0.1], [0.2, 0.0]])]
GRADS += [np.array([[-0.2, 0.3], [0.1, -0.4]]), np.array([[0.05, 0.0], [-0.1, 0.2]])]


def _apply(optimizer, grads=GRADS):
    variable = tf.Variable(W0.astype(np.float32))
    for g in grads:
        optimizer.apply([tf.constant(g, tf.float32)], [variable])
    return variable.numpy()


def test_tf1_momentum_takes_the_references_steps_over_a_changing_rate():
    """tf.train.MomentumOptimizer (resnet_v1_5.py): accum = m x accum + g; var -= lr x accum,
    step by step, with a rate that changes every step."""
    rates, momentum = [0.1, 0.4, 0.05, 0.3], 0.875
    w, accum = W0.copy(), np.zeros_like(W0)
    variable = tf.Variable(W0.astype(np.float32))
    optimizer = TF1Momentum(_Rates(rates), momentum=momentum)
    for rate, g in zip(rates, GRADS, strict=True):
        optimizer.apply([tf.constant(g, tf.float32)], [variable])
        accum = momentum * accum + g
        w = w - rate * accum
        np.testing.assert_allclose(variable.numpy(), w, rtol=1e-6, atol=1e-7)
    keras_sgd = _apply(keras.optimizers.SGD(_Rates(rates), momentum=momentum))
    assert np.abs(keras_sgd - w).max() > 0.01  # Keras's form differs where the rate changes
    constant = [0.2] * 4
    np.testing.assert_allclose(
        _apply(TF1Momentum(_Rates(constant), momentum=momentum)),
        _apply(keras.optimizers.SGD(_Rates(constant), momentum=momentum)),
        rtol=1e-6,
    )  # and agrees with it while the rate is constant


def test_the_reference_preset_trains_with_tf1_momentum_on_its_schedule():
    """The weights after a few steps of the reference's own schedule (warm-up, then the
    cosine from step 0): the rates from learning_rate.py, the update from TF1."""
    reference = config.prepare("image_classification", "reference", []).optimizer
    # two epochs of two steps at batch 256, one of them warm-up: every step a new rate
    optimizer = build_optimizer(dataclasses.replace(reference, warmup_epochs=1), 256, 2, 2)
    assert isinstance(optimizer, TF1Momentum)
    w, accum = W0.copy(), np.zeros_like(W0)
    for step, g in enumerate(GRADS):
        peak = 0.256
        rate = peak * step / 2 if step < 2 else peak * 0.5 * (1 + math.cos(math.pi * step / 4))
        accum = 0.875 * accum + g
        w = w - rate * accum
    np.testing.assert_allclose(_apply(optimizer), w, rtol=1e-6, atol=1e-7)
    earlier = config.prepare("image_classification", "reference-project", []).optimizer
    assert type(build_optimizer(earlier, 256, 2, 2)) is keras.optimizers.SGD


# ------------------------------------------------------------------ recorded, and judged


def _record_of(preset: str, overrides=(), precision="mixed_float16", loss_scale=2.0**15):
    """A rankable record (the published example's) with the L7 and L8 a run of the preset
    writes."""
    setup, workload = _workload(preset, overrides)
    layers = benchmark_layers.run_layers(
        setup,
        workload,
        workers=1,
        replicas=8,
        global_batch=2048,
        precision=precision,
        initial_loss_scale=loss_scale,
        intra_op_threads=1,
    )
    rec = json.loads(EXAMPLE.read_text())
    for layer in ("L6", "L7", "L8"):
        rec["layers"][layer] = layers[layer]
    rec["layers"]["L5"]["framework"] = "tensorflow"  # what a TensorFlow run's L5 says
    return rec


@pytest.fixture(scope="module")
def rules():
    levels, _ = config.load_levels()
    return config.load_benchmark("image_classification"), levels


def _named(reasons):
    return [reason.split(": ", 1)[1].split(" ", 1)[0] for reason in reasons]


def test_a_reference_run_is_reference_equivalent_at_every_level(rules):
    benchmark, levels = rules
    for precision, scale in (("mixed_float16", 2.0**15), ("mixed_bfloat16", None)):
        rec = _record_of("reference", precision=precision, loss_scale=scale)
        for level in ("free", "system", "hardware"):
            assert not scoring.refusal(rec, benchmark, levels[level]), (precision, level)


def test_the_earlier_recipe_is_recorded_and_refused_above_the_free_level_field_by_field(rules):
    benchmark, levels = rules
    rec = _record_of("reference-project")
    l7, l8 = rec["layers"]["L7"], rec["layers"]["L8"]
    assert (l7["zero_init_residual"], l7["logits_initializer"]) == (True, "normal_0.01")
    assert (l7["stride_padding"], l7["input_normalisation"]) == ("same", "mean_std")
    assert (l8["cosine_start"], l8["momentum_form"]) == ("warmup_end", "keras")
    assert not scoring.refusal(rec, benchmark, levels["free"])
    for level in ("system", "hardware"):
        assert _named(scoring.refusal(rec, benchmark, levels[level])) == [
            "zero_init_residual",
            "logits_initializer",
            "stride_padding",
            "input_normalisation",
            "cosine_start",
            "momentum_form",
        ]


def test_a_mixed_config_is_allowed_and_recorded_as_it_is(rules):
    """TF1 momentum with the project's earlier schedule: a valid free-level config."""
    benchmark, levels = rules
    rec = _record_of("reference", ["optimizer.cosine_start=warmup_end"])
    assert (rec["layers"]["L8"]["momentum_form"], rec["layers"]["L8"]["cosine_start"]) == (
        "tf1",
        "warmup_end",
    )
    assert not scoring.refusal(rec, benchmark, levels["free"])
    (reason,) = scoring.refusal(rec, benchmark, levels["system"])
    assert "L8 hyperparameters: cosine_start 'warmup_end' differs from the reference" in reason


def test_a_fixed_float16_loss_scale_is_recorded_and_refused_above_the_free_level(rules):
    benchmark, levels = rules
    rec = _record_of("reference", ["optimizer.loss_scaling=fixed"], loss_scale=None)
    assert rec["layers"]["L8"]["loss_scaling"] == "fixed"
    assert rec["layers"]["L8"]["initial_loss_scale"] == 256.0
    assert not scoring.refusal(rec, benchmark, levels["free"])
    assert _named(scoring.refusal(rec, benchmark, levels["system"])) == ["loss_scaling"]
    bf16 = _record_of(
        "reference", ["optimizer.loss_scaling=fixed"], "mixed_bfloat16", loss_scale=None
    )
    assert bf16["layers"]["L8"]["loss_scaling"] == "none"  # no float16: nothing scaled


@pytest.mark.parametrize(
    "key, value, choices",
    [
        ("optimizer.schedule", "linear", "'cosine' or 'step'"),
        ("optimizer.cosine_start", "epoch_8", "one of 'step_0', 'warmup_end'"),
        ("optimizer.momentum_form", "nesterov", "one of 'tf1', 'keras'"),
        ("optimizer.loss_scaling", "static", "one of 'dynamic', 'fixed'"),
        ("model.logits_initializer", "zeros", "one of 'variance_scaling', 'normal_0.01'"),
        ("model.stride_padding", "valid", "one of 'symmetric', 'same'"),
        ("model.input_normalisation", "none", "one of 'mean_255', 'mean_std'"),
    ],
)
def test_an_unknown_form_is_one_line_naming_the_choices(key, value, choices):
    with pytest.raises(UserError) as error:
        config.prepare("image_classification", "tiny", [f"{key}={value}"])
    message = str(error.value)
    assert "\n" not in message and f"'{key}' must be" in message and choices in message
    assert f"got '{value}'" in message


def test_a_config_saved_before_the_forms_existed_loads_as_what_it_ran():
    """A run directory or record of the earlier code holds none of the new keys: it loads,
    and resumes, with the forms that code trained (the reference-project preset's)."""
    saved = copy.deepcopy(config.prepare("image_classification", "reference", []).config)
    for key in ("logits_initializer", "stride_padding", "input_normalisation"):
        del saved["model"][key]
    for key in ("cosine_start", "momentum_form", "loss_scaling", "loss_scale"):
        del saved["optimizer"][key]
    saved["model"]["zero_init_residual"] = True
    old = config.setup_from(config.load_benchmark("image_classification"), "reference", saved)
    earlier = config.prepare("image_classification", "reference-project", [])
    assert old.optimizer == earlier.optimizer
    old_model = workload_config.data_and_model("image_classification", old.config)[1]
    assert old_model == workload_config.data_and_model("image_classification", earlier.config)[1]
