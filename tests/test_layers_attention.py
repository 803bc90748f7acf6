"""SelfAttentionMask and TransformerEncoder, checked against a NumPy reference."""

import math

import keras
import numpy as np
import pytest
from layer_testing import run_layer_test

from bert_trainer.layers import SelfAttentionMask, TransformerEncoder

RNG = np.random.default_rng(0)
DATA = RNG.standard_normal((2, 5, 8)).astype("float32")  # (batch, seq, hidden)
PADDING = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype="int32")
MASK = np.broadcast_to(PADDING[:, None, :], (2, 5, 5)).astype("float32")  # (batch, from, to)
LAYER_ARGS = dict(num_attention_heads=2, inner_dim=12, inner_activation="gelu")


def test_self_attention_mask_values_in_both_call_styles(tmp_path):
    from_tensor = np.zeros((2, 4, 3), "float32")
    _, mask = run_layer_test(
        SelfAttentionMask, {}, [from_tensor, PADDING], expected_output_shape=(2, 4, 5),
        expected_num_trainable_weights=0, tmp_path=tmp_path, run_training_step=False)
    expected = np.broadcast_to(PADDING[:, None, :], (2, 4, 5))
    np.testing.assert_array_equal(mask, expected)
    np.testing.assert_array_equal(SelfAttentionMask()(from_tensor, PADDING), expected)
    with pytest.raises(ValueError, match="to_mask must be \\[batch, to_seq\\], got rank 3"):
        SelfAttentionMask()(from_tensor, MASK)


def test_transformer_encoder_layer_checks(tmp_path):
    # 8 attention weights (q, k, v, o kernels and biases) + 2 LayerNorms x 2 + 2 Dense x 2.
    run_layer_test(TransformerEncoder, LAYER_ARGS, [DATA, MASK], expected_output_shape=(2, 5, 8),
                   expected_num_trainable_weights=16, tmp_path=tmp_path, atol=1e-5)


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
def test_transformer_encoder_matches_numpy_reference(norm_first):
    layer = TransformerEncoder(**LAYER_ARGS, norm_first=norm_first, norm_epsilon=1e-6)
    layer([DATA, MASK])
    _randomize(layer)
    np.testing.assert_allclose(layer([DATA, MASK]), _reference(layer, DATA, MASK), atol=2e-5)


def test_call_styles_and_padding_mask_rank_agree():
    layer = TransformerEncoder(**LAYER_ARGS)
    listed = layer([DATA, MASK]).numpy()
    np.testing.assert_array_equal(layer(DATA, attention_mask=MASK), listed)
    np.testing.assert_allclose(layer(DATA, attention_mask=PADDING), listed, atol=1e-6)
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
    np.testing.assert_allclose(ranged_output, full_output[:, :1], atol=1e-6)


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


def test_mixed_bfloat16_keeps_layer_norm_in_float32():
    layer = TransformerEncoder(**LAYER_ARGS, dtype="mixed_bfloat16")
    output = layer([DATA, MASK])
    assert keras.backend.standardize_dtype(output.dtype) == "bfloat16"
    assert layer.output_layer_norm.gamma.dtype == "float32"
    assert layer.attention_layer.query_dense.kernel.dtype == "float32"
    # The float32 reference with the same weights agrees to bfloat16 precision.
    np.testing.assert_allclose(np.asarray(output, "float32"), _reference(layer, DATA, MASK),
                               atol=0.1)
