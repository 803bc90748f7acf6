"""CausalLM: the causal mask, the cache against the full pass, configs, saving, gin, FLOPs."""

import json

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf
from numerics import assert_close

from bert_trainer import configurables
from bert_trainer.checkpoints import layout, model_dir
from bert_trainer.errors import UserError
from bert_trainer.models import CausalLM
from bert_trainer.models.causal_lm import gelu_approximate

VOCAB, HIDDEN, LAYERS, HEADS, INNER, MAX_LEN = 97, 32, 2, 4, 64, 16


def _model(**kwargs):
    # A wide initializer: logits far from uniform, so position mix-ups show.
    args = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=LAYERS,
                num_attention_heads=HEADS, inner_dim=INNER, max_sequence_length=MAX_LEN,
                initializer_range=0.3)
    args.update(kwargs)
    return CausalLM(**args)


def _ids(batch=3, length=10, seed=0):
    return np.random.default_rng(seed).integers(1, VOCAB, (batch, length)).astype("int32")


def _logits(model, ids, **extra):
    return np.asarray(model({"input_word_ids": ids, **extra}, training=False)["logits"])


@pytest.mark.parametrize("norm_first", [True, False])
def test_no_position_sees_the_future_gradient(norm_first):
    """d logits[:, t] / d position-table rows after t is exactly 0 (those rows are only the
    inputs after t), and nonzero for the rows up to t."""
    model = _model(norm_first=norm_first)
    ids = _ids(length=MAX_LEN)
    table = model.position_embedding.embeddings
    for t in (0, 5, MAX_LEN - 2):
        with tf.GradientTape() as tape:
            logits = model({"input_word_ids": ids}, training=False)["logits"]
            target = tf.reduce_sum(logits[:, t] * tf.random.stateless_normal(
                logits[:, t].shape, [t, 1]))
        grad = np.asarray(tf.convert_to_tensor(tape.gradient(target, table)))  # (MAX_LEN, h)
        np.testing.assert_array_equal(grad[t + 1:], 0.0)
        assert np.all(np.abs(grad[:t + 1]).max(axis=1) > 0), f"position {t} ignores its past"


def test_changing_later_tokens_leaves_earlier_logits_equal():
    model = _model()
    ids = _ids()
    changed = ids.copy()
    changed[:, 6:] = (changed[:, 6:] + 13) % (VOCAB - 1) + 1
    before, after = _logits(model, ids), _logits(model, changed)
    assert_close(after[:, :6], before[:, :6])
    assert np.abs(after[:, 6:] - before[:, 6:]).max() > 1e-2  # the change does show later


@pytest.mark.parametrize("norm_first", [True, False])
def test_decode_step_position_by_position_equals_call(norm_first):
    model = _model(norm_first=norm_first)
    ids = _ids()
    full = _logits(model, ids)
    cache = model.init_cache(3, ids.shape[1])
    steps = []
    for i in range(ids.shape[1]):
        logits, cache = model.decode_step(ids[:, i], tf.constant(i), cache)
        assert logits.dtype == tf.float32 and logits.shape == (3, VOCAB)
        steps.append(np.asarray(logits))
    assert_close(np.stack(steps, axis=1), full, rtol=1e-4, atol=1e-5)
    # A prefill of 4 tokens in one call, then steps: the same logits.
    cache = model.init_cache(3, ids.shape[1])
    prefill, cache = model.decode(ids[:, :4], 0, cache)
    rest = [np.asarray(model.decode_step(ids[:, i], i, cache)[0]) for i in range(4, 5)]
    assert_close(np.asarray(prefill), full[:, :4], rtol=1e-4, atol=1e-5)
    assert_close(rest[0], full[:, 4], rtol=1e-4, atol=1e-5)
    # With the transposed table a generation loop makes once: the same logits.
    table = model.decoding_table()
    assert table.shape == (HIDDEN, VOCAB)
    step, _ = model.decode_step(ids[:, 4], 4, cache, output_table=table)
    assert_close(np.asarray(step), rest[0], rtol=1e-5, atol=1e-6)
    # Without the projection: the blocks' output, which `logits` turns into call's logits.
    hidden, _ = model.decode(ids[:, :4], 0, model.init_cache(3, 4), project=False)
    assert hidden.shape == (3, 4, HIDDEN)
    assert_close(model.logits(hidden), full[:, :4], rtol=1e-4, atol=1e-5)
    states = model.hidden_states({"input_word_ids": ids})
    assert_close(model.logits(states), full, rtol=1e-6, atol=1e-6)  # call is this


def test_input_mask_left_or_right_padding_gives_the_unpadded_logits():
    model = _model()
    ids = _ids(batch=1, length=6)
    alone = _logits(model, ids)[0]
    right = np.concatenate([ids, np.zeros((1, 3), "int32")], axis=1)
    left = np.concatenate([np.zeros((1, 3), "int32"), ids], axis=1)
    mask = np.array([[1] * 6 + [0] * 3], "int32")
    assert_close(_logits(model, right, input_mask=mask)[0, :6], alone)
    assert_close(_logits(model, left, input_mask=mask[:, ::-1])[0, 3:], alone)
    # Without the mask, the left padding would shift the positions: a real difference.
    assert np.abs(_logits(model, left)[0, 3:] - alone).max() > 1e-2


def test_output_projection_is_the_tied_word_table():
    model = _model(num_layers=1)
    names = [w.path for w in model.weights]
    assert not [n for n in names if "bias" in n and "transformer_layer" not in n
                and "norm" not in n]
    # Doubling the word table's rows changes the logits through the output as well.
    ids = _ids(batch=1)
    before = _logits(model, ids)
    table = model.word_embeddings.embeddings
    table.assign(table * 2.0)
    assert np.abs(_logits(model, ids) - before).max() > 1e-2


def test_stable_variable_names_and_layout():
    model = _model(norm_first=True)
    names = list(layout.variable_names(model))
    assert names[:2] == ["word_embeddings/embeddings", "position_embedding/embeddings"]
    for expected in ("transformer_layer_0/attention/query/kernel",
                     "transformer_layer_1/intermediate/kernel",
                     "transformer_layer_1/output_layer_norm/gamma",
                     "final_layer_norm/beta"):
        assert expected in names
    assert len(names) == len(model.weights) == len(set(names))
    assert "embedding_layer_norm/gamma" not in names
    # A second model in the same process gets the same names (no counters in them).
    assert list(layout.variable_names(_model(norm_first=True))) == names
    post = list(layout.variable_names(_model(norm_first=False)))
    assert "embedding_layer_norm/gamma" in post and "final_layer_norm/gamma" not in post


def test_get_config_round_trip_and_keras_file(tmp_path):
    model = _model(inner_activation="gelu_new", norm_first=False, norm_epsilon=1e-6)
    config = json.loads(json.dumps(model.get_config()))
    assert config["inner_activation"] == "gelu_new" and config["norm_first"] is False
    rebuilt = CausalLM.from_config(config)
    assert rebuilt.get_config() == config
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, CausalLM)
    ids = _ids()
    assert_close(_logits(loaded, ids), _logits(model, ids), rtol=1e-6, atol=1e-6)  # same weights


def test_activations_gelu_exact_and_tanh_approximation():
    x = np.linspace(-4, 4, 101).astype("float32")
    expected = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    assert_close(gelu_approximate(x), expected)
    ids = _ids()
    exact, approx = _model(inner_activation="gelu"), _model(inner_activation="gelu_approximate")
    approx.set_weights(exact.get_weights())
    difference = np.abs(_logits(exact, ids) - _logits(approx, ids)).max()
    assert 0 < difference < 0.1  # close functions, not the same one
    # The decoder block serializes the approximation by its registered name.
    layer_config = approx.transformer_layers[0].get_config()
    rebuilt = keras.layers.deserialize(keras.layers.serialize(approx.transformer_layers[0]))
    assert rebuilt.inner_activation is gelu_approximate, layer_config["inner_activation"]


def test_mixed_bfloat16_logits_are_float32_and_close(bfloat16_required):
    mixed = _model(dtype="mixed_bfloat16")
    plain = _model()
    plain.set_weights(mixed.get_weights())
    ids = _ids()
    logits = mixed({"input_word_ids": ids})["logits"]
    assert logits.dtype == tf.float32
    assert mixed.transformer_layers[0].compute_dtype == "bfloat16"
    assert all(w.dtype == "float32" for w in mixed.weights)
    reference = _logits(plain, ids)
    # bfloat16 keeps 8 significant bits: ~1 % of the logits' scale through two layers.
    assert np.abs(np.asarray(logits) - reference).max() < 0.05 * np.abs(reference).max()
    cache = mixed.init_cache(3, 4)
    step, _ = mixed.decode_step(ids[:, 0], 0, cache)
    assert step.dtype == tf.float32 and np.isfinite(np.asarray(step)).all()
    assert CausalLM.from_config(mixed.get_config()).dtype_policy.name == "mixed_bfloat16"


def test_bad_arguments_and_inputs():
    with pytest.raises(ValueError, match="hidden_size=30 is not divisible by "
                                         "num_attention_heads=4"):
        _model(hidden_size=30)
    with pytest.raises(ValueError, match="num_layers must be a positive int"):
        _model(num_layers=0)
    with pytest.raises(ValueError, match="length 17, longer than max_sequence_length=16"):
        _model()({"input_word_ids": _ids(length=17)})


def test_gin_build_causal_lm_and_model_dir_rebuild(tmp_path):
    gin.parse_config(["build_causal_lm.vocab_size = 50", "build_causal_lm.hidden_size = 16",
                      "build_causal_lm.num_layers = 1", "build_causal_lm.num_attention_heads = 2",
                      "build_causal_lm.inner_dim = 32", "build_causal_lm.max_sequence_length = 8"])
    model = configurables.build_causal_lm()
    assert isinstance(model, CausalLM)
    assert (model.vocab_size, model.hidden_size, model.num_layers) == (50, 16, 1)
    model_dir.write_model_info(str(tmp_path), model, task={"name": "causal_lm"})
    info = model_dir.read_model_info(str(tmp_path))
    assert info.encoder_class == "CausalLM"
    rebuilt = model_dir.build_encoder(info)
    assert isinstance(rebuilt, CausalLM) and rebuilt.get_config() == model.get_config()
    gin.clear_config()
    gin.parse_config(["build_causal_lm.vocab_size = 50", "build_causal_lm.hiden_size = 16"])
    with pytest.raises(UserError, match="takes no argument 'hiden_size'"):
        configurables.build_causal_lm()
    gin.clear_config()
    with pytest.raises(UserError, match="vocab_size is required"):
        configurables.build_causal_lm()


def test_training_flops_count():
    model = _model()
    assert model.counts_flops
    batch, length = 3, 12
    h, f, L, V = HIDDEN, INNER, LAYERS, VOCAB
    per_token = L * 2 * (4 * h * h + 2 * h * f) + 2 * h * V
    expected = batch * 3 * (length * per_token + L * 2 * 2 * length * length * h)
    inputs = {"input_word_ids": _ids(batch, length)}
    flops = model.training_flops(inputs, None)
    assert flops.dtype == tf.float32
    assert_close(flops, expected)
    assert model.flops_per_example(length) == expected / batch
