"""SelfAttentionMask, MultiHeadAttention and TransformerEncoder, checked against NumPy
references and against `keras.layers.MultiHeadAttention` holding the same weights."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from layer_testing import assert_layer_contract
from numerics import assert_close

from bert_trainer import kernels
from bert_trainer.layers import MultiHeadAttention, SelfAttentionMask, TransformerEncoder

RNG = np.random.default_rng(0)
DATA = RNG.standard_normal((2, 5, 8)).astype("float32")  # (batch, seq, hidden)
PADDING = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype="int32")
MASK = np.broadcast_to(PADDING[:, None, :], (2, 5, 5)).astype("float32")  # (batch, from, to)
LAYER_ARGS = dict(num_attention_heads=2, inner_dim=12, inner_activation="gelu")


def test_self_attention_mask_values_in_both_call_styles(tmp_path):
    from_tensor = np.zeros((2, 4, 3), "float32")
    _, mask = assert_layer_contract(
        SelfAttentionMask, {}, [from_tensor, PADDING], expected_output_shape=(2, 4, 5),
        expected_num_trainable_weights=0, tmp_path=tmp_path, run_training_step=False)
    expected = np.broadcast_to(PADDING[:, None, :], (2, 4, 5))
    np.testing.assert_array_equal(mask, expected)
    np.testing.assert_array_equal(SelfAttentionMask()(from_tensor, PADDING), expected)
    with pytest.raises(ValueError, match="to_mask must be \\[batch, to_seq\\], got rank 3"):
        SelfAttentionMask()(from_tensor, MASK)


def test_transformer_encoder_layer_checks(tmp_path):
    # 8 attention weights (q, k, v, o kernels and biases) + 2 LayerNorms x 2 + 2 Dense x 2.
    assert_layer_contract(TransformerEncoder, LAYER_ARGS, [DATA, MASK],
                          expected_output_shape=(2, 5, 8), expected_num_trainable_weights=16,
                          tmp_path=tmp_path, atol=1e-5)


def _randomize(layer, seed=1):
    """Random values for every weight (LayerNorm gammas and biases included)."""
    rng = np.random.default_rng(seed)
    layer.set_weights([rng.normal(0.0, 0.5, w.shape).astype("float32")
                       for w in layer.get_weights()])


def _layer_norm(x, norm):
    gamma, beta = norm.gamma.numpy(), norm.beta.numpy()
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + norm.epsilon) * gamma + beta


def _attention(layer, query, source, mask):
    """Multi-head scaled dot-product attention with the layer's per-head kernels."""
    att = layer.attention_layer

    def project(dense, x):  # (batch, seq, hidden) @ (hidden, heads, head_dim)
        return np.einsum("bsh,hnd->bsnd", x, dense.kernel.numpy()) + dense.bias.numpy()

    q = project(att.query_dense, query)
    k, v = project(att.key_dense, source), project(att.value_dense, source)
    scores = np.einsum("bqnd,bknd->bnqk", q, k) / math.sqrt(q.shape[-1])
    scores = np.where(mask[:, None] > 0, scores, -1e9)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = np.einsum("bnqk,bknd->bqnd", probs, v)
    output = att.output_dense
    return np.einsum("bqnd,ndh->bqh", context, output.kernel.numpy()) + output.bias.numpy()


def _ffn(layer, x):
    erf = np.vectorize(math.erf)
    inner = x @ layer.intermediate_dense.kernel.numpy() + layer.intermediate_dense.bias.numpy()
    inner = 0.5 * inner * (1.0 + erf(inner / math.sqrt(2.0)))  # exact GELU
    return inner @ layer.output_dense.kernel.numpy() + layer.output_dense.bias.numpy()


def _reference(layer, data, mask):
    """BERT post-norm, or pre-norm, written out in NumPy (float64)."""
    x = data.astype("float64")
    if layer.norm_first:
        normed = _layer_norm(x, layer.attention_layer_norm)
        x = x + _attention(layer, normed, normed, mask)
        return x + _ffn(layer, _layer_norm(x, layer.output_layer_norm))
    x = _layer_norm(x + _attention(layer, x, x, mask), layer.attention_layer_norm)
    return _layer_norm(x + _ffn(layer, x), layer.output_layer_norm)


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_matches_numpy_reference(norm_first, kernel_mode):
    layer = TransformerEncoder(**LAYER_ARGS, norm_first=norm_first, norm_epsilon=1e-6)
    layer([DATA, MASK])
    _randomize(layer)
    np.testing.assert_allclose(layer([DATA, MASK]), _reference(layer, DATA, MASK), atol=2e-5)


def test_call_styles_and_padding_mask_rank_agree():
    layer = TransformerEncoder(**LAYER_ARGS)
    listed = layer([DATA, MASK]).numpy()
    assert_close(layer(DATA, attention_mask=MASK), listed)
    assert_close(layer(DATA, attention_mask=PADDING), listed)
    # The mask matters: without it the padded example changes.
    assert not np.allclose(layer(DATA)[1, :3], listed[1, :3], atol=1e-4)
    with pytest.raises(ValueError, match="not both"):
        layer([DATA, MASK], attention_mask=MASK)


def test_output_range_equals_the_first_positions_of_the_full_output():
    full = TransformerEncoder(**LAYER_ARGS)
    ranged = TransformerEncoder(**LAYER_ARGS, output_range=1)
    full_output = full([DATA, MASK])
    ranged([DATA, MASK])
    ranged.set_weights(full.get_weights())
    ranged_output = ranged([DATA, MASK])
    assert ranged_output.shape == (2, 1, 8)
    assert_close(ranged_output, full_output[:, :1])


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("mask", [PADDING, MASK], ids=["padding_mask", "3d_mask"])
def test_output_positions_are_the_full_outputs_rows_and_get_the_same_gradients(
        norm_first, mask, kernel_mode):
    layer = TransformerEncoder(**LAYER_ARGS, norm_first=norm_first)
    layer([DATA, MASK])
    _randomize(layer)
    positions = np.array([[4, 0, 2], [1, 1, 3]], "int32")  # repeats and a padded position
    data = tf.constant(DATA)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(data)
        full = layer(data, attention_mask=mask)
        rows = layer(data, attention_mask=mask, output_positions=positions)
        full_loss = tf.reduce_sum(tf.gather(full, positions, batch_dims=1) ** 2)
        rows_loss = tf.reduce_sum(rows ** 2)
    assert rows.shape == (2, 3, 8)
    assert_close(rows, np.take_along_axis(np.asarray(full), positions[..., None], 1))
    # The same function of the data and weights: the same gradients.
    for a, b in zip(tape.gradient(rows_loss, [data, *layer.trainable_weights]),
                    tape.gradient(full_loss, [data, *layer.trainable_weights]), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_output_positions_and_output_range_are_exclusive():
    layer = TransformerEncoder(**LAYER_ARGS, output_range=1)
    with pytest.raises(ValueError, match="output_positions and output_range=1"):
        layer(DATA, attention_mask=PADDING, output_positions=np.zeros((2, 1), "int32"))


def test_attention_kernel_shapes_and_distinct_initial_values():
    init = keras.initializers.TruncatedNormal(stddev=0.02)
    layer = TransformerEncoder(**LAYER_ARGS, kernel_initializer=init)
    layer([DATA, MASK])
    att = layer.attention_layer
    assert att.query_dense.kernel.shape == (8, 2, 4) and att.query_dense.bias.shape == (2, 4)
    assert att.output_dense.kernel.shape == (2, 4, 8) and att.output_dense.bias.shape == (8,)
    assert layer.intermediate_dense.kernel.shape == (8, 12)
    assert layer.output_dense.kernel.shape == (12, 8)
    # One initializer instance must not give Q, K and V the same start.
    assert not np.allclose(att.query_dense.kernel.numpy(), att.key_dense.kernel.numpy())


def test_hidden_size_not_divisible_by_heads_names_both_numbers():
    with pytest.raises(ValueError, match="hidden size 8 is not divisible by num_attention_heads=3"):
        TransformerEncoder(num_attention_heads=3, inner_dim=12)([DATA, MASK])


def test_wrong_data_rank_names_the_shape():
    with pytest.raises(ValueError, match=r"data must be \[batch, seq, hidden\].*\(2, 8\)"):
        TransformerEncoder(**LAYER_ARGS)(DATA[:, 0])


def test_mixed_bfloat16_keeps_layer_norm_in_float32(kernel_mode, bfloat16_required):
    layer = TransformerEncoder(**LAYER_ARGS, dtype="mixed_bfloat16")
    output = layer([DATA, MASK])
    assert keras.backend.standardize_dtype(output.dtype) == "bfloat16"
    assert layer.output_layer_norm.gamma.dtype == "float32"
    assert layer.attention_layer.query_dense.kernel.dtype == "float32"
    # The float32 reference with the same weights agrees to bfloat16 precision.
    np.testing.assert_allclose(np.asarray(output, "float32"), _reference(layer, DATA, MASK),
                               atol=0.1)


# --- MultiHeadAttention: Keras' weights, a lean computation ---------------------------------

def _attention_pair(query, value, **kwargs):
    """Ours and `keras.layers.MultiHeadAttention`, built alike and holding the same weights."""
    ours = MultiHeadAttention(num_heads=2, key_dim=4, **kwargs)
    theirs = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, **kwargs)
    ours(query, value)
    theirs(query, value)
    _randomize(ours)
    theirs.set_weights(ours.get_weights())
    return ours, theirs


@pytest.mark.parametrize("mask", [MASK, PADDING[:, None, :], None],
                         ids=["full_mask", "padding_mask", "no_mask"])
def test_multi_head_attention_self_attention_equals_keras(mask, kernel_mode):
    ours, theirs = _attention_pair(DATA, DATA)
    # The same tensor as query, key and value takes the fused Q/K/V projection.
    got = ours(DATA, DATA, attention_mask=mask)
    want = theirs(DATA, DATA, attention_mask=mask)
    np.testing.assert_allclose(got, want, atol=1e-5)
    # The padded keys of example 1 are ignored: changing them changes nothing.
    if mask is not None:
        noisy = DATA.copy()
        noisy[1, 3:] += 5.0
        np.testing.assert_allclose(ours(noisy, noisy, attention_mask=mask)[1, :3], got[1, :3],
                                   atol=1e-5)


def test_multi_head_attention_cross_attention_and_separate_key_equal_keras(kernel_mode):
    query = DATA[:, :2]  # (batch, 2, hidden): fewer targets than sources
    key = RNG.standard_normal(DATA.shape).astype("float32")
    ours, theirs = _attention_pair(query, DATA)
    mask = MASK[:, :2, :]
    for kwargs in ({}, {"key": key}):  # K and V fused; K, V projected apart
        np.testing.assert_allclose(ours(query, DATA, attention_mask=mask, **kwargs),
                                   theirs(query, DATA, attention_mask=mask, **kwargs), atol=1e-5)


@pytest.mark.parametrize("kwargs", [{"output_shape": 6}, {"output_shape": (2, 3)},
                                    {"use_bias": False}], ids=["width", "two_axes", "no_bias"])
def test_multi_head_attention_output_projection_options_equal_keras(kwargs, kernel_mode):
    # One 2-D matmul + bias add for an [heads, head_dim, out] kernel; Keras' einsum otherwise.
    ours, theirs = _attention_pair(DATA, DATA, **kwargs)
    got = ours(DATA, DATA, attention_mask=MASK)
    want = theirs(DATA, DATA, attention_mask=MASK)
    assert got.shape == want.shape == (2, 5, *np.atleast_1d(kwargs.get("output_shape", 8)))
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_multi_head_attention_gradients_equal_keras(kernel_mode):
    ours, theirs = _attention_pair(DATA, DATA)
    direction = RNG.standard_normal(DATA.shape).astype("float32")
    grads = []
    for layer in (ours, theirs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(DATA, DATA, attention_mask=MASK) * direction)
        grads.append(tape.gradient(loss, layer.trainable_variables))
    assert len(grads[0]) == 8
    for got, want in zip(*grads, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)


def test_multi_head_attention_other_options_run_keras_computation():
    ours, theirs = _attention_pair(DATA, DATA)
    output, scores = ours(DATA, DATA, attention_mask=MASK, return_attention_scores=True)
    assert scores.shape == (2, 2, 5, 5)  # (batch, heads, target, source)
    np.testing.assert_allclose(scores[1, :, :, 3:], 0.0)  # padded keys get no weight
    np.testing.assert_allclose(output, theirs(DATA, DATA, attention_mask=MASK), atol=1e-5)
    np.testing.assert_allclose(ours(DATA, DATA, use_causal_mask=True),
                               theirs(DATA, DATA, use_causal_mask=True), atol=1e-5)


def test_multi_head_attention_query_without_visible_keys_attends_uniformly():
    # google-research/bert's additive mask: such a query averages all values (Keras: zeros).
    ours, _ = _attention_pair(DATA, DATA)
    nothing_visible = np.zeros((2, 5, 5), "float32")
    got = ours(DATA, DATA, attention_mask=nothing_visible)
    value = ours.value_dense
    v = np.einsum("bsh,hnd->bsnd", DATA, value.kernel.numpy()) + value.bias.numpy()
    context = np.broadcast_to(v.mean(axis=1, keepdims=True), v.shape)  # (batch, seq, heads, dim)
    want = (np.einsum("bqnd,ndh->bqh", context, ours.output_dense.kernel.numpy())
            + ours.output_dense.bias.numpy())
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_multi_head_attention_dropout_only_in_training():
    ours, theirs = _attention_pair(DATA, DATA, dropout=0.5, seed=3)
    inference = ours(DATA, DATA, attention_mask=MASK)
    np.testing.assert_allclose(inference, theirs(DATA, DATA, attention_mask=MASK), atol=1e-5)
    trained = ours(DATA, DATA, attention_mask=MASK, training=True)
    assert np.abs(np.asarray(trained) - np.asarray(inference)).max() > 1e-3


# --- the attention probabilities' fused kernel (mask add, softmax, dropout) ----------------

@pytest.mark.parametrize("bias_shape", [(3, 1, 9), (3, 5, 9), (1, 1, 9)],
                         ids=["padding", "full", "shared"])
@pytest.mark.parametrize("rate", [0.0, 0.25])
def test_attention_softmax_is_the_masked_softmax_then_the_same_dropout(bias_shape, rate,
                                                                        kernels_required):
    scores = tf.random.normal([3, 2, 5, 9], seed=2) * 3.0
    bias = tf.where(tf.random.uniform(bias_shape, seed=3) < 0.3, -1e9, 0.0)
    bias = tf.concat([tf.zeros(bias_shape[:-1] + (1,)), bias[..., 1:]], -1)  # a visible key
    seed = tf.constant([5, 6])
    upstream = tf.random.normal(scores.shape, seed=4)

    def forward_backward(fn):
        with tf.GradientTape() as tape:
            tape.watch(scores)
            y = fn(scores)
            loss = tf.reduce_sum(y * upstream)
        return y.numpy(), tape.gradient(loss, scores).numpy()

    got, got_grad = forward_backward(lambda s: kernels.attention_softmax(s, bias, rate, seed))
    probs = lambda s: tf.nn.softmax(s + bias[:, None], axis=-1)  # noqa: E731
    want, want_grad = forward_backward(
        (lambda s: kernels.dropout(probs(s), rate, seed)) if rate else probs)
    assert_close(got, want)
    np.testing.assert_allclose(got_grad, want_grad, atol=1e-5)
    # The same dropped elements (masked keys underflow to an exact 0 in both).
    np.testing.assert_array_equal(got == 0, want == 0)
    assert got_grad.std() > 0.01  # a real gradient, not zeros
    if rate:
        assert 0.15 < ((got == 0) & (tf.nn.softmax(scores + bias[:, None]).numpy() > 0)).mean()
    else:
        np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-5)


def test_attention_softmax_in_half_precision_and_its_checks(kernels_required):
    scores = tf.random.normal([2, 2, 3, 4], seed=1)
    bias = tf.zeros([2, 1, 4])
    want = kernels.attention_softmax(scores, bias, 0.5, [1, 2]).numpy()
    for dtype in (tf.bfloat16, tf.float16):
        half = kernels.attention_softmax(tf.cast(scores, dtype), tf.cast(bias, dtype), 0.5, [1, 2])
        assert half.dtype == dtype
        np.testing.assert_allclose(tf.cast(half, tf.float32), want, rtol=2e-2, atol=1e-2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"bias \[2,2,4\] does not "
                       r"broadcast to scores \[2,2,3,4\]"):
        kernels.attention_softmax(scores, tf.zeros([2, 2, 4]), 0.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"rate must be in \[0, 1\)"):
        kernels.attention_softmax(scores, bias, 1.0, [1, 2])



def test_multi_head_attention_fused_probabilities_equal_the_three_ops(monkeypatch,
                                                                    kernels_required):
    """With the kernels on, training fuses mask, softmax and dropout into one kernel: the
    same outputs and gradients as the add, softmax and dropout layer it replaces (same
    seed, same mask)."""
    from bert_trainer.ops import attention as attention_ops

    layer, _ = _attention_pair(DATA, DATA, dropout=0.3, seed=3)
    state = layer._dropout_layer.seed_generator.state
    start = state.numpy()
    direction = RNG.standard_normal(DATA.shape).astype("float32")

    def run():
        state.assign(start)
        with tf.GradientTape() as tape:
            out = layer(DATA, DATA, attention_mask=PADDING[:, None, :], training=True)
            loss = tf.reduce_sum(out * direction)
        return out.numpy(), [g.numpy() for g in tape.gradient(loss, layer.trainable_variables)]

    op_types = {op.type for op in tf.function(lambda x: layer(
        x, x, attention_mask=PADDING[:, None, :], training=True)).get_concrete_function(
        tf.constant(DATA)).graph.get_operations()}
    assert "BertAttentionSoftmax" in op_types and "Softmax" not in op_types
    fused, fused_grads = run()
    monkeypatch.setattr(attention_ops, "_dropout_rate_and_seed", lambda dropout, training: None)
    separate, separate_grads = run()
    inference = layer(DATA, DATA, attention_mask=PADDING[:, None, :]).numpy()
    assert np.abs(fused - inference).max() > 1e-3  # the dropout acted
    np.testing.assert_allclose(fused, separate, atol=1e-5)
    for got, want in zip(fused_grads, separate_grads, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_multi_head_attention_layer_checks(tmp_path):
    layer, _ = assert_layer_contract(
        MultiHeadAttention, {"num_heads": 2, "key_dim": 4}, DATA,
        call_kwargs={"value": DATA, "attention_mask": MASK}, expected_output_shape=(2, 5, 8),
        expected_num_trainable_weights=8, tmp_path=tmp_path, atol=1e-5)
    assert layer.query_dense.kernel.shape == (8, 2, 4)
    assert layer.output_dense.kernel.shape == (2, 4, 8)


def test_transformer_encoder_under_xla_equals_eager():
    layer = TransformerEncoder(**LAYER_ARGS)
    layer([DATA, PADDING])
    _randomize(layer)
    compiled = tf.function(lambda x, m: layer([x, m]), jit_compile=True)
    np.testing.assert_allclose(compiled(DATA, PADDING), layer([DATA, PADDING]), atol=1e-5)
