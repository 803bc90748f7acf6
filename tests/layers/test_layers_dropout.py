"""bert_trainer.layers.Dropout: Keras' Dropout with a 16-bit mask on TensorFlow.

These tests pin the fused CPU kernels off (the path GPU, XLA and `off` take); the fused
dropout kernel is tested in test_kernels.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from bert_trainer import ops
from bert_trainer.layers import Dropout

RATE = 0.1
THRESHOLD = round(RATE * 65536)  # 6554
SCALE = 1.0 / (1.0 - THRESHOLD / 65536)


@pytest.fixture(autouse=True)
def _tensorflow_ops(monkeypatch):
    monkeypatch.setenv(ops.MODE_ENV, "off")


def test_mask_statistics_and_scale():
    x = tf.ones([16, 4, 128, 129])  # an odd number of elements per row
    y = Dropout(RATE, seed=3)(x, training=True).numpy()
    assert set(np.unique(y)) == {0.0, np.float32(SCALE)}
    kept = (y > 0).mean()
    # 1.06 M draws: the binomial standard deviation is 0.0003.
    assert abs(kept - (1 - THRESHOLD / 65536)) < 0.002
    assert abs(y.mean() - 1.0) < 0.003  # the expectation is kept
    # Both halves of each 32-bit word are used: no half is all-kept or all-dropped.
    flat = (y.reshape(-1)[: 2 * (y.size // 2)] > 0).reshape(-1, 2)
    assert 0.85 < flat[:, 0].mean() < 0.95 and 0.85 < flat[:, 1].mean() < 0.95


def test_seeded_layers_repeat_and_successive_calls_differ():
    x = tf.ones([7, 5])
    a = Dropout(0.5, seed=11)(x, training=True)
    b = Dropout(0.5, seed=11)(x, training=True)
    np.testing.assert_array_equal(a, b)
    layer = Dropout(0.5, seed=11)
    assert not np.array_equal(layer(x, training=True), layer(x, training=True))


def test_inference_zero_rate_and_noise_shape_take_keras_paths():
    x = tf.random.stateless_normal([4, 6], seed=(1, 2))
    np.testing.assert_array_equal(Dropout(RATE)(x, training=False), x)
    np.testing.assert_array_equal(Dropout(0.0)(x, training=True), x)
    rows = Dropout(0.5, noise_shape=(4, 1), seed=5)(tf.ones([4, 6]), training=True).numpy()
    assert all(len(set(row)) == 1 for row in rows)  # Keras' broadcast mask


def test_gradient_is_the_mask():
    x = tf.random.stateless_normal([32, 33], seed=(3, 4))
    layer = Dropout(RATE, seed=7)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=True)
    grad = tape.gradient(y, x).numpy()
    kept = y.numpy() != 0
    np.testing.assert_allclose(grad[kept], SCALE, rtol=1e-6)
    assert (grad[~kept] == 0).all()


def test_mixed_precision_and_serialization():
    layer = Dropout(RATE, seed=2, dtype="mixed_bfloat16")
    y = layer(tf.ones([8, 8]), training=True)
    assert y.dtype == tf.bfloat16
    config = keras.saving.serialize_keras_object(layer)
    again = keras.saving.deserialize_keras_object(config)
    assert type(again) is Dropout and again.rate == RATE


@pytest.mark.parametrize("rate", [1e-4, 0.003, 0.9995])
def test_rates_16_bits_cannot_hold_use_keras_dropout(rate):
    x = tf.ones([256, 256])
    ours = Dropout(rate, seed=1)(x, training=True).numpy()
    keras_scale = np.float32(1.0 / (1.0 - rate))  # Keras' exact scale, not a quantized one
    assert set(np.unique(ours)) <= {0.0, keras_scale}
    assert abs((ours == 0).mean() - rate) < 0.01


def test_common_rates_take_the_16_bit_path():
    for rate in (0.01, 0.1, 0.5, 0.9):
        threshold = round(rate * 65536)
        y = Dropout(rate, seed=4)(tf.ones([64, 64]), training=True).numpy()
        assert set(np.unique(y)) == {0.0, np.float32(1.0 / (1.0 - threshold / 65536))}
