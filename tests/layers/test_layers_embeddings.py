"""OnDeviceEmbedding, PositionEmbedding and SinusoidalPositionEncoding."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from layer_testing import assert_layer_contract

from bert_trainer.layers import OnDeviceEmbedding, PositionEmbedding, SinusoidalPositionEncoding

IDS = np.array([[1, 2, 3, 0, 9], [4, 4, 7, 8, 9]], dtype="int32")


@pytest.mark.parametrize("use_one_hot", [False, True])
def test_on_device_embedding_layer_checks(tmp_path, use_one_hot):
    layer, outputs = assert_layer_contract(
        OnDeviceEmbedding, dict(vocab_size=10, embedding_width=6, use_one_hot=use_one_hot), IDS,
        expected_output_shape=(2, 5, 6), expected_num_trainable_weights=1, tmp_path=tmp_path)
    # (assert_layer_contract's training step has moved the weights since `outputs`.)
    np.testing.assert_allclose(layer(IDS)[1, 0], layer.embeddings.numpy()[4], atol=1e-7)


def test_one_hot_and_gather_agree_in_outputs_and_gradients():
    gather = OnDeviceEmbedding(10, 6, use_one_hot=False)
    one_hot = OnDeviceEmbedding(10, 6, use_one_hot=True)
    gather.build(IDS.shape)
    one_hot.build(IDS.shape)
    one_hot.set_weights(gather.get_weights())
    direction = np.random.default_rng(0).standard_normal((2, 5, 6)).astype("float32")
    grads, outputs = [], []
    for layer in (gather, one_hot):
        with tf.GradientTape() as tape:
            out = layer(IDS)
            loss = tf.reduce_sum(out * direction)
        outputs.append(out.numpy())
        grads.append(tf.convert_to_tensor(tape.gradient(loss, layer.embeddings)).numpy())
    np.testing.assert_allclose(outputs[0], outputs[1], atol=1e-7)
    np.testing.assert_allclose(grads[0], grads[1], atol=1e-6)
    # Id 9 appears twice, id 5 never: its gradient row is the sum of two slices, row 5 zero.
    np.testing.assert_allclose(grads[0][9], direction[0, 4] + direction[1, 4], atol=1e-6)
    assert not grads[0][5].any()


def test_scale_factor_multiplies_outputs():
    plain = OnDeviceEmbedding(10, 4)
    scaled = OnDeviceEmbedding(10, 4, scale_factor=3.0)
    plain.build(IDS.shape)
    scaled.build(IDS.shape)
    scaled.set_weights(plain.get_weights())
    np.testing.assert_allclose(scaled(IDS), 3.0 * plain(IDS).numpy(), rtol=1e-6)


def test_embedding_rejects_float_ids():
    with pytest.raises(ValueError, match="ids must be integers, got float32"):
        OnDeviceEmbedding(10, 4)(IDS.astype("float32"))


def test_unseeded_initializer_instance_is_not_reused():
    """One initializer object for two tables must not give both the same values."""
    init = keras.initializers.TruncatedNormal(stddev=0.02)
    a, b = OnDeviceEmbedding(10, 4, initializer=init), OnDeviceEmbedding(10, 4, initializer=init)
    a.build(None)
    b.build(None)
    assert not np.allclose(a.embeddings.numpy(), b.embeddings.numpy())
    assert a.embeddings.numpy().std() == pytest.approx(0.02 * 0.88, rel=0.35)  # truncated at 2σ


def test_position_embedding_layer_checks(tmp_path):
    data = np.random.default_rng(0).standard_normal((2, 5, 6)).astype("float32")
    layer, outputs = assert_layer_contract(
        PositionEmbedding, dict(max_length=8), data, expected_output_shape=(2, 5, 6),
        expected_num_trainable_weights=1, tmp_path=tmp_path)
    table = layer.embeddings.numpy()
    assert table.shape == (8, 6)
    outputs = layer(data[:, :3])  # a shorter sequence reads the first rows
    for batch in range(2):
        np.testing.assert_allclose(outputs[batch], table[:3], atol=1e-7)


def test_position_embedding_rejects_long_sequence_naming_both_lengths():
    layer = PositionEmbedding(max_length=4)
    with pytest.raises(ValueError, match="sequence length 5 is longer than max_length=4"):
        layer(np.zeros((1, 5, 3), "float32"))


def _sinusoid_reference(length, width):
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D))."""
    table = np.zeros((length, width))
    for pos in range(length):
        for col in range(width):
            angle = pos / 10000 ** (2 * (col // 2) / width)
            table[pos, col] = math.sin(angle) if col % 2 == 0 else math.cos(angle)
    return table


def test_sinusoidal_encoding_layer_checks(tmp_path):
    assert_layer_contract(SinusoidalPositionEncoding, {}, np.zeros((2, 7, 6), "float32"),
                   expected_output_shape=(2, 7, 6), expected_num_trainable_weights=0,
                   tmp_path=tmp_path, run_training_step=False)


@pytest.mark.parametrize("width", [6, 5])
def test_sinusoidal_encoding_matches_formula(width):
    encoding = SinusoidalPositionEncoding()(np.zeros((2, 50, width), "float32")).numpy()
    np.testing.assert_allclose(encoding[0], _sinusoid_reference(50, width), atol=2e-5)
    np.testing.assert_array_equal(encoding[0], encoding[1])
    # Hand-computed values: PE(1, 0) = sin 1, PE(1, 1) = cos 1, PE(3, 2) = sin(3 / 10000^(2/D)).
    assert encoding[0, 1, 0] == pytest.approx(0.8414710, abs=1e-6)
    assert encoding[0, 1, 1] == pytest.approx(0.5403023, abs=1e-6)
    assert encoding[0, 3, 2] == pytest.approx(math.sin(3 / 10000 ** (2 / width)), abs=1e-6)
