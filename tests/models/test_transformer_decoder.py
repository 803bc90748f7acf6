"""TransformerDecoder: the causal pass, the key/value cache, cross-attention masking, configs."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import require_bfloat16

from bert_trainer.layers import CausalAttentionMask, SelfAttentionMask, TransformerDecoder

HIDDEN, HEADS, INNER = 32, 4, 64
BATCH, TARGET, SOURCE = 2, 7, 5


def _decoder(**kwargs):
    layer = TransformerDecoder(num_attention_heads=HEADS, inner_dim=INNER,
                               kernel_initializer=keras.initializers.RandomNormal(stddev=0.2,
                                                                                  seed=1),
                               **kwargs)
    layer.build((None, None, HIDDEN))
    return layer


def _data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(BATCH, TARGET, HIDDEN)).astype("float32")
    enc = rng.normal(size=(BATCH, SOURCE, HIDDEN)).astype("float32")
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], "int32")
    return x, enc, mask


def _incremental(layer, x, enc, mask, *, cross_cache=False, chunk=1):
    """The layer run `chunk` positions at a time with the cache; outputs concatenated."""
    cache = layer.init_cache(BATCH, TARGET, encoder_output=enc if cross_cache else None)
    outputs = []
    for start in range(0, TARGET, chunk):
        y, cache = layer(x[:, start:start + chunk], encoder_output=enc, encoder_mask=mask,
                         cache=cache, decode_index=tf.constant(start, tf.int32))
        outputs.append(y)
    return np.concatenate([np.asarray(o) for o in outputs], axis=1), cache


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("cross_cache", [False, True])
def test_cache_equals_full_causal_pass(norm_first, cross_cache):
    layer = _decoder(norm_first=norm_first)
    x, enc, mask = _data()
    full = np.asarray(layer(x, encoder_output=enc, encoder_mask=mask))
    steps, cache = _incremental(layer, x, enc, mask, cross_cache=cross_cache)
    np.testing.assert_allclose(steps, full, rtol=1e-5, atol=1e-5)
    assert cache["key"].shape == (BATCH, HEADS, TARGET, HIDDEN // HEADS)
    assert ("cross_key" in cache) == cross_cache
    # Two positions per step (a prompt, then tokens) give the same outputs too.
    chunked, _ = _incremental(layer, x, enc, mask, chunk=2)
    np.testing.assert_allclose(chunked, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_cache_under_tf_function_with_static_shapes(jit_compile):
    layer = _decoder()
    x, enc, mask = _data(1)
    full = np.asarray(layer(x, encoder_output=enc, encoder_mask=mask))

    @tf.function(jit_compile=jit_compile)
    def decode_all(x, enc, mask):
        cache = layer.init_cache(BATCH, TARGET, encoder_output=enc)

        def body(i, cache, out):
            token = tf.gather(x, [i], axis=1)  # (batch, 1, hidden)
            y, cache = layer(token, encoder_output=enc, encoder_mask=mask, cache=cache,
                             decode_index=i)
            return i + 1, cache, out.write(i, y[:, 0])

        out = tf.TensorArray(tf.float32, size=TARGET)
        _, cache, out = tf.while_loop(lambda i, *_: i < TARGET, body,
                                      (tf.constant(0), cache, out))
        return tf.transpose(out.stack(), (1, 0, 2))

    np.testing.assert_allclose(decode_all(x, enc, mask).numpy(), full, rtol=1e-5, atol=1e-5)


def test_causal_mask_gradient_is_zero_for_future_positions():
    layer = _decoder()
    x, enc, mask = _data(2)
    x = tf.constant(x)
    for t in range(TARGET):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, encoder_output=enc, encoder_mask=mask)
            out = tf.reduce_sum(y[:, t] ** 2)
        grad = tape.gradient(out, x).numpy()  # (batch, target, hidden)
        norms = np.abs(grad).sum(axis=(0, 2))
        assert np.all(norms[t + 1:] == 0.0), (t, norms)  # exactly: masked keys get exp() = 0
        assert np.all(norms[: t + 1] > 0.0), (t, norms)


def test_padded_encoder_positions_change_nothing():
    layer = _decoder()
    x, enc, mask = _data(3)
    y = np.asarray(layer(x, encoder_output=enc, encoder_mask=mask))
    changed = enc.copy()
    changed[0, 3:] = 100.0  # row 0's padding
    y2 = np.asarray(layer(x, encoder_output=changed, encoder_mask=mask))
    np.testing.assert_allclose(y2, y, rtol=1e-6, atol=1e-6)
    changed[0, 1] = 100.0  # a real position: the output must move
    y3 = np.asarray(layer(x, encoder_output=changed, encoder_mask=mask))
    assert np.abs(y3[0] - y[0]).max() > 1e-3


def test_without_cross_attention_is_a_decoder_only_block():
    layer = _decoder(use_cross_attention=False)
    assert layer.cross_attention is None
    names = {w.path.split("/")[-2] for w in layer.weights}
    assert not any("cross" in w.path for w in layer.weights), names
    x, _, _ = _data(4)
    full = np.asarray(layer(x))
    cache = layer.init_cache(BATCH, TARGET)
    steps = []
    for i in range(TARGET):
        y, cache = layer(x[:, i:i + 1], cache=cache, decode_index=i)
        steps.append(np.asarray(y))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="decode_index"):
        layer(x[:, :1], cache=cache)


def test_cross_attention_needs_encoder_output():
    layer = _decoder()
    x, _, _ = _data()
    with pytest.raises(ValueError, match="encoder_output"):
        layer(x)


def test_explicit_mask_equals_default_causal_mask():
    layer = _decoder()
    x, enc, mask = _data(5)
    causal = CausalAttentionMask()(x)
    assert causal.shape == (BATCH, TARGET, TARGET)
    np.testing.assert_array_equal(np.asarray(causal[0]), np.tril(np.ones((TARGET, TARGET))))
    y = layer(x, encoder_output=enc, encoder_mask=mask)
    y2 = layer(x, encoder_output=enc, encoder_mask=mask, self_attention_mask=causal)
    np.testing.assert_allclose(np.asarray(y2), np.asarray(y), rtol=1e-6, atol=1e-6)
    # The bidirectional mask differs: the causal one is not a no-op.
    full = SelfAttentionMask()(x, np.ones((BATCH, TARGET), "int32"))
    y3 = layer(x, encoder_output=enc, encoder_mask=mask, self_attention_mask=full)
    assert np.abs(np.asarray(y3) - np.asarray(y))[:, :-1].max() > 1e-3
    padded = CausalAttentionMask()(x, np.array([[1] * 5 + [0] * 2, [1] * 7]))
    assert float(padded[0, 6, 5]) == 0.0 and float(padded[0, 6, 4]) == 1.0


def test_get_config_round_trip():
    layer = _decoder(norm_first=True, output_dropout=0.1, attention_dropout=0.2,
                     inner_dropout=0.3, inner_activation="relu", norm_epsilon=1e-6,
                     use_cross_attention=False, use_bias=False)
    config = layer.get_config()
    clone = TransformerDecoder.from_config(config)
    assert clone.get_config() == config
    assert config["use_cross_attention"] is False and config["norm_first"] is True
    assert "output_range" not in config
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert isinstance(restored, TransformerDecoder)
    clone.build((None, None, HIDDEN))
    clone.set_weights(layer.get_weights())
    x, _, _ = _data(6)
    np.testing.assert_allclose(np.asarray(clone(x)), np.asarray(layer(x)), rtol=1e-6, atol=1e-6)


def test_sublayer_names_match_the_encoder_block():
    layer = _decoder()
    for name in ("self_attention", "self_attention_layer_norm", "cross_attention",
                 "cross_attention_layer_norm", "intermediate_dense", "output_dense",
                 "output_layer_norm"):
        assert getattr(layer, name) is not None, name
    assert layer.self_attention.query_dense.kernel.shape == (HIDDEN, HEADS, HIDDEN // HEADS)


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_cache_matches_full_pass(policy):
    if policy == "mixed_bfloat16":
        require_bfloat16()
    layer = TransformerDecoder(num_attention_heads=HEADS, inner_dim=INNER, dtype=policy)
    layer.build((None, None, HIDDEN))
    x, enc, mask = _data(7)
    full = layer(x, encoder_output=enc, encoder_mask=mask)
    assert keras.backend.standardize_dtype(full.dtype) == policy.split("_")[1]
    steps, cache = _incremental(layer, x, enc, mask, cross_cache=True)
    assert keras.backend.standardize_dtype(cache["key"].dtype) == policy.split("_")[1]
    tol = 5e-2 if policy == "mixed_bfloat16" else 1e-2
    np.testing.assert_allclose(steps.astype("float32"), np.asarray(full, "float32"),
                               rtol=tol, atol=tol)
    assert np.isfinite(np.asarray(full, "float32")).all()


def test_dropout_applies_in_training_only():
    layer = _decoder(output_dropout=0.3, attention_dropout=0.3, inner_dropout=0.3)
    plain = _decoder()
    plain.set_weights(layer.get_weights())
    x, enc, mask = _data(8)
    inference = np.asarray(layer(x, encoder_output=enc, encoder_mask=mask, training=False))
    np.testing.assert_allclose(inference, np.asarray(plain(x, encoder_output=enc,
                                                           encoder_mask=mask)),
                               rtol=1e-6, atol=1e-6)
    trained = np.asarray(layer(x, encoder_output=enc, encoder_mask=mask, training=True))
    assert np.abs(trained - inference).max() > 1e-2
