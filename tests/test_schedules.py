"""Both frameworks train with the same learning rate at every step of every preset the PyTorch
runner trains: TensorFlow's from the optimizer `build_optimizer` makes (its WarmupDecay,
evaluated as the traced step evaluates it), PyTorch's from the schedule `TorchTrainer` sets
before each step (run/schedule.py). Each over all steps of the run, at one worker and at 8."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hpcai500_tf import config
from hpcai500_tf.engine.optimizers import WarmupDecay, build_optimizer
from hpcai500_tf.errors import UserError
from hpcai500_tf.pytorch.train import refuse_other_forms
from hpcai500_tf.run.schedule import warmup_decay
from hpcai500_tf.run.trainer import full_batch_steps


def _pytorch_presets() -> list[str]:
    """The image_classification presets the PyTorch runner does not refuse (on a CPU)."""
    trained = []
    for preset in config.load_benchmark("image_classification").presets:
        setup = config.prepare("image_classification", preset, [])
        try:
            refuse_other_forms(setup, on_cuda=False)
        except UserError:
            continue
        trained.append(preset)
    return trained


# Every branch of the schedule: the presets' cosine from step 0, the cosine after warm-up,
# step decay, no warm-up.
VARIANTS = {
    "as_preset": [],
    "cosine_after_warmup": ["optimizer.cosine_start=warmup_end"],
    "step_decay": ["optimizer.schedule=step", "optimizer.step_boundaries=[1, 2, 5]"],
    "no_warmup": ["optimizer.warmup_epochs=0"],
}


def test_the_pytorch_runner_trains_the_presets_compared_here():
    assert set(_pytorch_presets()) >= {"reference", "smoke", "tiny"}


@pytest.mark.parametrize("workers", [1, 8])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("preset", _pytorch_presets())
def test_both_frameworks_learning_rates_are_equal_at_every_step(preset, variant, workers):
    setup = config.prepare("image_classification", preset, VARIANTS[variant])
    o, t = setup.optimizer, setup.training
    global_batch = t.batch_per_replica * workers
    steps_per_epoch = full_batch_steps(setup.config["data"]["train_examples"], global_batch)
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    try:
        optimizer = build_optimizer(o, global_batch, steps_per_epoch, t.epochs)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    tensorflow_schedule = optimizer._learning_rate  # what the optimizer reads at each step
    assert isinstance(tensorflow_schedule, WarmupDecay)
    steps = np.arange(t.epochs * steps_per_epoch + 1)  # the last: past the run's end
    tensorflow = tensorflow_schedule(tf.constant(steps, tf.int64)).numpy()
    pytorch_schedule = warmup_decay(o, global_batch, steps_per_epoch, t.epochs)
    pytorch = np.array([pytorch_schedule.rate(int(step)) for step in steps])
    peak = pytorch_schedule.peak
    # float32 in TensorFlow's graph against Python's float64
    np.testing.assert_allclose(tensorflow, pytorch, rtol=1e-5, atol=1e-6 * peak)
    for step in (0, steps[len(steps) // 3], steps[-2]):  # as the optimizer applies it
        optimizer.iterations.assign(int(step))
        assert float(optimizer.learning_rate) == pytest.approx(tensorflow[step], rel=1e-7)
