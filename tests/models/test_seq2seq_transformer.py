"""Seq2SeqTransformer: teacher forcing, incremental decoding, sharing options, configs."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from bert_trainer import features
from bert_trainer.encoders import BertEncoder
from bert_trainer.models import Seq2SeqTransformer

VOCAB, HIDDEN, LAYERS, HEADS, INNER, MAX_LEN = 50, 32, 2, 4, 64, 16
BATCH, SOURCE, TARGET = 2, 6, 7


def _encoder(**kwargs):
    config = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=LAYERS,
                  num_attention_heads=HEADS, inner_dim=INNER, max_sequence_length=MAX_LEN,
                  type_vocab_size=2, output_dropout=0.0, attention_dropout=0.0)
    config.update(kwargs)
    return BertEncoder(**config)


def _model(encoder_kwargs=None, **kwargs):
    return Seq2SeqTransformer(_encoder(**(encoder_kwargs or {})), **kwargs)


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    mask = np.array([[1] * 4 + [0] * 2, [1] * SOURCE], "int32")
    return {
        features.INPUT_WORD_IDS: rng.integers(1, VOCAB, (BATCH, SOURCE)).astype("int32") * mask,
        features.INPUT_MASK: mask,
        features.INPUT_TYPE_IDS: np.zeros((BATCH, SOURCE), "int32"),
        features.DECODER_INPUT_IDS: rng.integers(1, VOCAB, (BATCH, TARGET)).astype("int32"),
    }


def _step_logits(model, inputs, *, cross_cache=False, table=False):
    """decode_step over every target position, stacked: [batch, target, vocab]; `table`
    projects with the `decoding_table()` a decoding loop makes once."""
    encoder_output, encoder_mask = model.encode(inputs)
    cache = model.init_cache(BATCH, TARGET, encoder_output if cross_cache else None)
    ids = inputs[features.DECODER_INPUT_IDS]
    output_table = model.decoding_table() if table else None
    if table:
        width = model.target_embeddings.embedding_width
        assert output_table.shape == (width, VOCAB)
    rows = []
    for i in range(TARGET):
        logits, cache = model.decode_step(tf.constant(ids[:, i]), tf.constant(i), cache,
                                          encoder_output, encoder_mask,
                                          output_table=output_table)
        assert logits.shape == (BATCH, VOCAB) and logits.dtype == tf.float32
        rows.append(np.asarray(logits))
    return np.stack(rows, axis=1)


@pytest.fixture(scope="module")
def models_by_options():
    """`_model(**options)` and its teacher-forcing logits on `_inputs()`, made once per options
    for the four ways of stepping that are checked against them (each only reads the model)."""
    made = {}

    def get(options):
        key = tuple(sorted(options.items()))
        if key not in made:
            model = _model(**options)
            made[key] = model, model(_inputs())[features.LOGITS]
        return made[key]

    return get


@pytest.mark.parametrize("options", [
    {},
    {"share_embeddings": False, "position_encoding": "sinusoidal"},
    {"share_encoder_decoder": True, "num_decoder_layers": 1},
])
@pytest.mark.parametrize("cross_cache", [False, True])
@pytest.mark.parametrize("table", [False, True])
def test_decode_step_equals_call_position_by_position(models_by_options, options, cross_cache,
                                                      table):
    model, logits = models_by_options(options)
    inputs = _inputs()
    assert logits.shape == (BATCH, TARGET, VOCAB) and logits.dtype == tf.float32
    np.testing.assert_allclose(_step_logits(model, inputs, cross_cache=cross_cache, table=table),
                               np.asarray(logits), rtol=1e-4, atol=1e-4)


def test_decode_step_in_a_tf_function_loop(models_by_options):
    model, _ = models_by_options({})
    inputs = _inputs(1)
    logits = np.asarray(model(inputs)[features.LOGITS])
    ids = tf.constant(inputs[features.DECODER_INPUT_IDS])

    @tf.function
    def decode(inputs):
        encoder_output, encoder_mask = model.encode(inputs)
        cache = model.init_cache(BATCH, TARGET, encoder_output)

        def body(i, cache, out):
            step, cache = model.decode_step(ids[:, i], i, cache, encoder_output, encoder_mask)
            return i + 1, cache, out.write(i, step)

        _, _, out = tf.while_loop(lambda i, *_: i < TARGET, body,
                                  (tf.constant(0), cache, tf.TensorArray(tf.float32, TARGET)))
        return tf.transpose(out.stack(), (1, 0, 2))

    np.testing.assert_allclose(decode(inputs).numpy(), logits, rtol=1e-4, atol=1e-4)


def test_factorized_embeddings_are_projected_and_tied():
    model = _model({"embedding_width": 16})
    assert model.target_embedding_projection is model.encoder.embedding_projection
    assert model.output_transform.kernel.shape == (HIDDEN, 16)
    inputs = _inputs(2)
    logits = np.asarray(model(inputs)[features.LOGITS])
    np.testing.assert_allclose(_step_logits(model, inputs), logits, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(_step_logits(model, inputs, table=True), logits, rtol=1e-4,
                               atol=1e-4)


def test_sharing_options_share_variables():
    model = _model()
    assert model.target_embeddings is model.encoder.word_embeddings
    ids = {id(w) for w in model.weights}
    assert len(ids) == len(model.weights)  # each shared variable listed once
    separate = _model(share_embeddings=False)
    assert separate.target_embeddings.embeddings.shape == (VOCAB, HIDDEN)
    assert len(separate.weights) == len(model.weights) + 1

    shared = _model(share_encoder_decoder=True)
    encoder_layer = shared.encoder.transformer_layers[1]
    decoder_layer = shared.decoder_layers[1]
    assert decoder_layer.self_attention.query_dense.kernel is \
        encoder_layer.attention_layer.query_dense.kernel
    assert decoder_layer.output_dense.kernel is encoder_layer.output_dense.kernel
    assert decoder_layer.cross_attention.query_dense.kernel is not \
        encoder_layer.attention_layer.query_dense.kernel
    # The shared blocks are counted once: the unshared model's decoder self-attention, its
    # norm and the feed-forward network (with its norm) are what BERTShare saves.
    assert shared.count_params() == model.count_params() - LAYERS * (
        4 * (HIDDEN * HIDDEN + HIDDEN) + 2 * HIDDEN + 2 * HIDDEN * INNER + INNER + HIDDEN
        + 2 * HIDDEN)


def test_output_projection_is_tied_to_the_target_table():
    model = _model(share_embeddings=False)
    inputs = _inputs(3)
    before = np.asarray(model(inputs)[features.LOGITS])
    table = model.target_embeddings.embeddings
    table.assign(table.numpy() * 2.0)
    after = np.asarray(model(inputs)[features.LOGITS])
    assert np.abs(after - before).max() > 1e-3
    model.output_bias.assign(np.arange(VOCAB, dtype="float32"))
    shifted = np.asarray(model(inputs)[features.LOGITS])
    np.testing.assert_allclose(shifted - after, np.broadcast_to(np.arange(VOCAB), after.shape),
                               rtol=1e-4, atol=1e-4)


def test_get_config_round_trip_and_saved_weights(tmp_path):
    model = _model(share_embeddings=False, position_encoding="sinusoidal", max_target_length=12,
                   num_decoder_layers=1, name="s2s")
    config = model.get_config()
    clone = Seq2SeqTransformer.from_config(config)
    assert clone.get_config() == config
    assert (clone.vocab_size, clone.max_target_length) == (VOCAB, 12)
    path = str(tmp_path / "model.weights.h5")
    model.save_weights(path)
    clone.load_weights(path)
    inputs = _inputs(4)
    np.testing.assert_allclose(np.asarray(clone(inputs)[features.LOGITS]),
                               np.asarray(model(inputs)[features.LOGITS]), rtol=1e-6, atol=1e-6)
    keras_path = str(tmp_path / "model.keras")
    model.save(keras_path)
    loaded = keras.saving.load_model(keras_path)
    np.testing.assert_allclose(np.asarray(loaded(inputs)[features.LOGITS]),
                               np.asarray(model(inputs)[features.LOGITS]), rtol=1e-6, atol=1e-6)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="position_encoding"):
        _model(position_encoding="rotary")
    with pytest.raises(ValueError, match="num_decoder_layers"):
        _model(share_encoder_decoder=True, num_decoder_layers=3)
    with pytest.raises(ValueError, match="output_range"):
        _model({"output_range": 1})
    model = _model(max_target_length=4)
    with pytest.raises(ValueError, match="max_target_length"):
        model(_inputs())
    with pytest.raises(ValueError, match="max_target_length"):
        model.init_cache(BATCH, 5)
    with pytest.raises(ValueError, match="decoder_input_ids"):
        model({k: v for k, v in _inputs().items() if k != features.DECODER_INPUT_IDS})


def test_training_flops_grow_with_the_target(models_by_options):
    model, _ = models_by_options({})
    inputs = _inputs()
    short = float(model.training_flops(inputs, None))
    longer = dict(inputs, **{features.DECODER_INPUT_IDS: np.ones((BATCH, 2 * TARGET), "int32")})
    assert float(model.training_flops(longer, None)) > short > 0


def test_mixed_bfloat16_trains_and_decodes(bfloat16_required):
    model = _model({"dtype": "mixed_bfloat16"})
    inputs = _inputs(5)
    with tf.GradientTape() as tape:
        logits = model(inputs, training=True)[features.LOGITS]
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            inputs[features.DECODER_INPUT_IDS], logits))
    assert logits.dtype == tf.float32
    grads = tape.gradient(loss, model.trainable_variables)
    # Every variable but the encoder's pooler (nothing reads [CLS]'s pooled vector) learns.
    missing = [v.path for v, g in zip(model.trainable_variables, grads, strict=True) if g is None]
    assert missing and all("pooler" in path for path in missing), missing
    assert all(np.isfinite(np.asarray(tf.convert_to_tensor(g), "float32")).all()
               for g in grads if g is not None)
    assert model.decoding_table().dtype == tf.bfloat16
    for table in (False, True):
        steps = _step_logits(model, inputs, cross_cache=True, table=table)
        np.testing.assert_allclose(steps, np.asarray(logits), rtol=0.1, atol=0.1)


def test_decode_step_projects_with_the_table_it_is_given(models_by_options):
    model, inputs = models_by_options({})[0], _inputs(6)
    encoder_output, encoder_mask = model.encode(inputs)
    ids = tf.constant(inputs[features.DECODER_INPUT_IDS][:, 0])
    table = model.decoding_table()

    def step(output_table):
        cache = model.init_cache(BATCH, TARGET)
        return np.asarray(model.decode_step(ids, 0, cache, encoder_output, encoder_mask,
                                            output_table=output_table)[0])

    bias = np.asarray(model.output_bias)
    # logits = x @ table + bias: doubling the table doubles the product, the bias stays.
    np.testing.assert_allclose(step(2 * table) - bias, 2 * (step(table) - bias), rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize("options", [{}, {"share_encoder_decoder": True}])
def test_bert_train_checkpoint_layout_round_trip(tmp_path, options):
    from bert_trainer.checkpoints import layout  # noqa: PLC0415

    model = _model(**options)
    names = layout.variable_names(model)
    assert len(names) == len({id(v) for v in model.weights})  # shared variables named once
    assert "encoder/word_embeddings/embeddings" in names
    assert any(name.startswith("decoder_layer_1/cross_attention/") for name in names), names
    prefix = tf.train.Checkpoint(model=layout.model_trackable(model)).write(
        str(tmp_path / "ckpt"))
    keras.utils.set_random_seed(11)
    clone = _model(**options)
    inputs = _inputs(6)
    assert np.abs(np.asarray(clone(inputs)[features.LOGITS])
                  - np.asarray(model(inputs)[features.LOGITS])).max() > 1e-3
    layout.restore_model(clone, prefix)
    np.testing.assert_allclose(np.asarray(clone(inputs)[features.LOGITS]),
                               np.asarray(model(inputs)[features.LOGITS]), rtol=1e-6, atol=1e-6)


def test_target_ids_give_the_logits_of_the_real_target_tokens_only(models_by_options):
    from bert_trainer.models import seq2seq_transformer as s2s  # noqa: PLC0415

    model, full = models_by_options({})
    inputs = _inputs()
    full = np.asarray(full)
    targets = np.array([[5, 9, 3, 0, 0, 0, 0], [4, 8, 6, 7, 2, 3, 0]], "int32")
    out = model({**inputs, features.TARGET_IDS: targets})
    assert features.LOGITS not in out
    rows, cols = np.nonzero(targets)
    assert out[s2s.TARGET_LOGITS].shape == (len(rows), VOCAB)
    np.testing.assert_array_equal(np.asarray(out[s2s.TARGET_ROWS]), rows)
    np.testing.assert_array_equal(np.asarray(out[s2s.TARGET_LABELS]), targets[rows, cols])
    np.testing.assert_allclose(np.asarray(out[s2s.TARGET_LOGITS]), full[rows, cols],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("position_encoding", ["learned", "sinusoidal"])
def test_packed_decoder_equals_the_padded_one_and_its_gradients(monkeypatch, position_encoding):
    """The training call computes the decoder on the real target tokens only (TokenPacking)
    where packing is free: the same logits and gradients as the decoder on every slot."""
    from bert_trainer.models import seq2seq_transformer as s2s  # noqa: PLC0415

    model = _model(position_encoding=position_encoding)
    targets = np.array([[5, 9, 3, 0, 0, 0, 0], [4, 8, 6, 7, 2, 3, 0]], "int32")
    inputs = {**_inputs(), features.TARGET_IDS: targets}

    def run(packs: bool):
        monkeypatch.setattr(type(model), "packs_tokens", lambda self: packs)
        with tf.GradientTape() as tape:
            logits = model(inputs, training=False)[s2s.TARGET_LOGITS]
            loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
                targets[np.nonzero(targets)], logits))
        grads = tape.gradient(loss, model.trainable_variables)
        # None: a variable the loss does not reach (the encoder's pooler), in both.
        return np.asarray(logits), [None if g is None else np.asarray(tf.convert_to_tensor(g))
                                    for g in grads]

    packed, packed_grads = run(True)
    padded, padded_grads = run(False)
    assert packed.shape == (int((targets != 0).sum()), VOCAB)
    np.testing.assert_allclose(packed, padded, rtol=1e-5, atol=1e-5)
    for variable, a, b in zip(model.trainable_variables, packed_grads, padded_grads,
                              strict=True):
        assert (a is None) == (b is None), variable.path
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=variable.path)
    reached = [g for g in packed_grads if g is not None]
    assert len(reached) > len(packed_grads) // 2 and all(np.abs(g).max() > 0 for g in reached)
