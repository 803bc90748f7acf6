"""gelu and LayerNormalization: Keras' values, hand-written gradients checked against Keras'
automatic differentiation and against finite differences, with TensorFlow's ops and with the
fused CPU kernels (`kernel_mode`)."""

import json
import types

import keras
import numpy as np
import pytest
import tensorflow as tf
from layer_testing import assert_layer_contract
from numerics import assert_close

from bert_trainer.layers import LayerNormalization, TransformerEncoder, gelu

RNG = np.random.default_rng(0)
X = (RNG.standard_normal((3, 4, 6)) * 2.0 + 0.5).astype("float32")  # (batch, seq, width)
DIRECTION = RNG.standard_normal(X.shape).astype("float32")


def _value_and_grads(fn, x, variables=()):
    """fn(x), and d(sum(fn(x) * DIRECTION)) / d[x, *variables]."""
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * DIRECTION)
    return y, tape.gradient(loss, [x, *variables])


def test_gelu_values_and_gradient_equal_keras_exact_gelu(kernel_mode):
    y, (dx,) = _value_and_grads(gelu, X)
    want_y, (want_dx,) = _value_and_grads(keras.activations.gelu, X)
    assert_close(y, want_y)
    assert_close(dx, want_dx)
    # Not the tanh approximation: it differs by ~1e-3 near |x| = 2.
    assert np.abs(np.asarray(y) - keras.activations.gelu(X, approximate=True)).max() > 1e-4


def test_gelu_gradient_matches_finite_differences_in_float64():
    x = np.linspace(-4.0, 4.0, 41)
    eps = 1e-6
    numeric = (gelu(tf.constant(x + eps)) - gelu(tf.constant(x - eps))) / (2 * eps)
    x_t = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x_t)
        y = tf.reduce_sum(gelu(x_t))
    np.testing.assert_allclose(tape.gradient(y, x_t), numeric, atol=1e-8)


def test_gelu_serializes_by_name_and_keeps_bfloat16(kernel_mode):
    config = keras.activations.serialize(gelu)
    assert "bert_trainer>gelu" in json.dumps(config)
    assert keras.activations.deserialize(config) is gelu
    dense = keras.layers.Dense(3, activation=gelu)
    revived = keras.layers.Dense.from_config(json.loads(json.dumps(dense.get_config())))
    assert revived.activation is gelu
    assert keras.backend.standardize_dtype(gelu(tf.constant(X, tf.bfloat16)).dtype) == "bfloat16"


def test_layer_normalization_layer_checks(tmp_path):
    assert_layer_contract(LayerNormalization, {"epsilon": 1e-12}, X, expected_output_shape=X.shape,
                   expected_num_trainable_weights=2, tmp_path=tmp_path)


@pytest.mark.parametrize("kwargs", [{}, {"epsilon": 1e-3}, {"center": False}, {"axis": 1},
                                    {"scale": False}],
                         ids=["default", "epsilon", "no_center", "axis_1", "no_scale"])
def test_layer_normalization_equals_keras_in_values_and_gradients(kwargs, kernel_mode):
    ours, theirs = LayerNormalization(**kwargs), keras.layers.LayerNormalization(**kwargs)
    ours.build(X.shape)
    theirs.build(X.shape)
    rng = np.random.default_rng(1)
    ours.set_weights([rng.normal(1.0, 0.5, w.shape).astype("float32") for w in ours.weights])
    theirs.set_weights(ours.get_weights())
    y, grads = _value_and_grads(ours, X, ours.trainable_variables)
    want_y, want_grads = _value_and_grads(theirs, X, theirs.trainable_variables)
    np.testing.assert_allclose(y, want_y, atol=1e-5)
    for got, want in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)


def test_layer_normalization_gradient_matches_finite_differences_in_float64():
    layer = LayerNormalization(dtype="float64")
    x = RNG.standard_normal((2, 5)).astype("float64")
    layer.build(x.shape)
    layer.set_weights([np.linspace(0.5, 1.5, 5), np.linspace(-1.0, 1.0, 5)])
    weights = RNG.standard_normal(x.shape)

    def loss(value):
        return float(tf.reduce_sum(layer(tf.constant(value)) * weights))

    x_t = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x_t)
        total = tf.reduce_sum(layer(x_t) * weights)
    analytic = tape.gradient(total, x_t).numpy()
    eps = 1e-6
    for i, j in [(0, 0), (0, 3), (1, 4)]:
        bumped = x.copy()
        bumped[i, j] += eps
        lowered = x.copy()
        lowered[i, j] -= eps
        assert abs((loss(bumped) - loss(lowered)) / (2 * eps) - analytic[i, j]) < 1e-6


def test_layer_normalization_mixed_bfloat16_computes_in_float32(kernel_mode):
    layer = LayerNormalization(dtype="mixed_bfloat16")
    out = layer(tf.constant(X, tf.bfloat16))
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    assert layer.gamma.dtype == "float32"
    normed = (X - X.mean(-1, keepdims=True)) / np.sqrt(X.var(-1, keepdims=True) + 1e-3)
    np.testing.assert_allclose(np.asarray(out, "float32"), normed, atol=0.05)


def test_transformer_encoder_gradients_equal_keras_sublayers(kernel_mode):
    """The fused sublayers change no number: the same layer with Keras' own LayerNorm
    computation and GELU swapped back in gives the same outputs and gradients."""
    data = RNG.standard_normal((2, 5, 8)).astype("float32")
    direction = RNG.standard_normal(data.shape).astype("float32")
    layer = TransformerEncoder(num_attention_heads=2, inner_dim=12)
    layer(data)
    layer.set_weights([RNG.normal(0.0, 0.5, w.shape).astype("float32")
                       for w in layer.get_weights()])

    def value_and_grads():
        with tf.GradientTape() as tape:
            out = layer(data)
            loss = tf.reduce_sum(out * direction)
        return out, tape.gradient(loss, layer.trainable_variables)

    fused = value_and_grads()
    for norm in (layer.attention_layer_norm, layer.output_layer_norm):
        norm.call = types.MethodType(keras.layers.LayerNormalization.call, norm)
    layer.intermediate_dense.activation = keras.activations.gelu
    reference = value_and_grads()
    np.testing.assert_allclose(fused[0], reference[0], atol=1e-5)
    for got, want in zip(fused[1], reference[1], strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)
