import numpy as np
import pytest
import tensorflow as tf

from hpcai500_tf.engine.optimizers import LARS, WarmupDecay


def test_lars_follows_its_update_rule():
    w0 = np.array([[1.0, -2.0], [0.5, 3.0]], np.float32)
    grads = [
        np.array([[0.1, 0.2], [-0.3, 0.4]], np.float32),
        np.array([[0.5, -0.1], [0.2, 0.0]], np.float32),
    ]
    variable = tf.Variable(w0)
    optimizer = LARS(learning_rate=0.5, momentum=0.9, eta=0.01)
    w, m = w0.copy(), np.zeros_like(w0)
    for g in grads:
        optimizer.apply([tf.constant(g)], [variable])
        trust = 0.01 * np.linalg.norm(w) / np.linalg.norm(g)
        m = 0.9 * m + 0.5 * trust * g
        w = w - m
        np.testing.assert_allclose(variable.numpy(), w, rtol=1e-5)


def test_lars_trust_is_one_for_zero_weights():
    variable = tf.Variable(np.zeros(3, np.float32))
    LARS(learning_rate=0.1, momentum=0.0, eta=0.01).apply([tf.ones(3)], [variable])
    np.testing.assert_allclose(variable.numpy(), -0.1 * np.ones(3), rtol=1e-6)


def test_warmup_then_cosine_to_zero():
    schedule = WarmupDecay(peak=1.0, warmup_steps=10, total_steps=110, schedule="cosine")
    assert float(schedule(0)) == 0.0
    assert float(schedule(5)) == pytest.approx(0.5)
    assert float(schedule(10)) == pytest.approx(1.0)
    assert float(schedule(60)) == pytest.approx(0.5, abs=1e-6)
    assert float(schedule(110)) == pytest.approx(0.0, abs=1e-6)


def test_step_decay():
    schedule = WarmupDecay(
        peak=1.0,
        warmup_steps=0,
        total_steps=100,
        schedule="step",
        boundaries_steps=[30, 60],
        factor=0.1,
    )
    assert [round(float(schedule(s)), 6) for s in (0, 29, 30, 59, 60, 99)] == [
        1.0,
        1.0,
        0.1,
        0.1,
        0.01,
        0.01,
    ]
