"""MaskedLM: tied output projection, masked-position gather, float32 logits."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from layer_testing import assert_layer_contract
from numerics import assert_close

from bert_trainer.layers import MaskedLM

RNG = np.random.default_rng(0)
SEQUENCE = RNG.standard_normal((2, 6, 8)).astype("float32")  # (batch, seq, hidden)
POSITIONS = np.array([[0, 3, 5], [2, 2, 1]], dtype="int32")  # (batch, P)
VOCAB, WIDTH = 11, 4  # a factorized table: width 4 != hidden 8


def _table():
    return keras.Variable(RNG.standard_normal((VOCAB, WIDTH)).astype("float32"), name="table")


def _reference(mlm, sequence, positions):
    """gather -> dense -> gelu -> LayerNorm -> table^T + bias, in NumPy."""
    x = np.take_along_axis(sequence, positions[:, :, None], axis=1)
    x = x @ mlm.dense.kernel.numpy() + mlm.dense.bias.numpy()
    x = 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    norm = mlm.layer_norm
    x = (x - mean) / np.sqrt(var + 1e-12) * norm.gamma.numpy() + norm.beta.numpy()
    return x @ mlm.embedding_table.numpy().T + mlm.bias.numpy()


def test_masked_lm_layer_checks(tmp_path):
    # Table, bias, dense kernel + bias, LayerNorm gamma + beta.
    assert_layer_contract(MaskedLM, dict(embedding_table=_table(), activation="gelu"), SEQUENCE,
                   call_kwargs=dict(masked_positions=POSITIONS),
                   expected_output_shape=(2, 3, VOCAB), expected_num_trainable_weights=6,
                   tmp_path=tmp_path, atol=1e-5)


def test_logits_match_numpy_reference_and_table_is_tied(kernel_mode):
    table = _table()
    mlm = MaskedLM(embedding_table=table, activation="gelu")
    mlm(SEQUENCE, masked_positions=POSITIONS)
    mlm.bias.assign(RNG.standard_normal(VOCAB).astype("float32"))
    assert mlm.embedding_table is table
    np.testing.assert_allclose(mlm(SEQUENCE, masked_positions=POSITIONS),
                               _reference(mlm, SEQUENCE, POSITIONS), atol=1e-5)
    # Without positions every token is predicted.
    every = np.tile(np.arange(6, dtype="int32"), (2, 1))
    assert_close(mlm(SEQUENCE), mlm(SEQUENCE, masked_positions=every))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(mlm(SEQUENCE, masked_positions=POSITIONS) ** 2)
    assert np.abs(tape.gradient(loss, table).numpy()).sum() > 0  # the shared table learns


def test_predictions_are_log_probabilities():
    table = _table()
    logits = MaskedLM(embedding_table=table)(SEQUENCE, masked_positions=POSITIONS)
    predictions = MaskedLM(embedding_table=table, output="predictions")
    predictions(SEQUENCE, masked_positions=POSITIONS)
    log_probs = predictions(SEQUENCE, masked_positions=POSITIONS).numpy()
    np.testing.assert_allclose(np.exp(log_probs).sum(-1), 1.0, atol=1e-5)
    assert predictions.output_type == "predictions"
    assert logits.shape == log_probs.shape
    with pytest.raises(ValueError, match="output must be one of"):
        MaskedLM(embedding_table=table, output="probabilities")


def test_from_config_owns_a_table_of_the_recorded_shape():
    mlm = MaskedLM(embedding_table=_table())
    config = mlm.get_config()
    assert config["embedding_table"] == [VOCAB, WIDTH]
    revived = MaskedLM.from_config(config)
    assert revived.embedding_table.shape == (VOCAB, WIDTH)
    assert revived.embedding_table is not mlm.embedding_table


def test_mixed_bfloat16_gives_float32_logits_from_the_unrounded_table(
        kernel_mode, bfloat16_required):
    # Table values that bfloat16 cannot hold (8 bits of mantissa): 1 + 2^-12.
    table = keras.Variable(np.full((VOCAB, WIDTH), 1.0 + 2.0 ** -12, "float32"))
    mlm = MaskedLM(embedding_table=table, dtype="mixed_bfloat16")
    logits = mlm(SEQUENCE, masked_positions=POSITIONS)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert keras.backend.standardize_dtype(mlm.dense(SEQUENCE).dtype) == "bfloat16"
    assert mlm.get_config()["dtype"]["config"]["name"] == "mixed_bfloat16"
    # With gamma=0 and beta=1 the transform outputs exact ones, so every logit is
    # WIDTH * (1 + 2^-12); a bfloat16 copy of the table would give exactly WIDTH.
    mlm.layer_norm.gamma.assign(np.zeros(WIDTH, "float32"))
    mlm.layer_norm.beta.assign(np.ones(WIDTH, "float32"))
    logits = mlm(SEQUENCE, masked_positions=POSITIONS).numpy()
    # rtol 1e-5: far inside the 2.4e-4 that separates it from WIDTH.
    assert_close(logits, WIDTH * (1.0 + 2.0 ** -12))


def test_projection_in_compute_dtype_rounds_the_table_to_bfloat16_and_returns_float32(
        bfloat16_required):
    table = keras.Variable(np.full((VOCAB, WIDTH), 1.0 + 2.0 ** -12, "float32"))
    mlm = MaskedLM(embedding_table=table, dtype="mixed_bfloat16",
                   projection_in_compute_dtype=True)
    mlm(SEQUENCE, masked_positions=POSITIONS)
    mlm.layer_norm.gamma.assign(np.zeros(WIDTH, "float32"))
    mlm.layer_norm.beta.assign(np.ones(WIDTH, "float32"))
    mlm.bias.assign(np.full(VOCAB, 2.0 ** -10, "float32"))
    logits = mlm(SEQUENCE, masked_positions=POSITIONS)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    # The bfloat16 table holds 1.0, so the product is exactly WIDTH; the float32 bias is
    # added after the cast (bfloat16 could not hold WIDTH + 2^-10).
    # (atol 2^-14: far inside the 2^-10 that separates it from WIDTH.)
    assert_close(logits.numpy(), WIDTH + 2.0 ** -10, rtol=0, atol=2.0 ** -14)
    # The table still gets a float32 gradient through the cast.
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(mlm(SEQUENCE, masked_positions=POSITIONS))
    grad = tape.gradient(loss, table)
    assert grad.dtype == tf.float32 and float(tf.reduce_sum(tf.abs(grad))) > 0
    config = mlm.get_config()
    assert config["projection_in_compute_dtype"] is True
    assert MaskedLM.from_config(config).projection_in_compute_dtype is True


def test_projection_in_compute_dtype_changes_nothing_in_float32():
    table = _table()
    plain = MaskedLM(embedding_table=table, activation="gelu")
    option = MaskedLM(embedding_table=table, activation="gelu", projection_in_compute_dtype=True)
    plain(SEQUENCE, masked_positions=POSITIONS)
    option(SEQUENCE, masked_positions=POSITIONS)
    option.set_weights(plain.get_weights())
    assert_close(option(SEQUENCE, masked_positions=POSITIONS),
                 plain(SEQUENCE, masked_positions=POSITIONS))
