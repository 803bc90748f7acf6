"""The task models: outputs, tying, serialization, checkpoints, mixed precision."""

import dataclasses
import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from numerics import ATOL, assert_close

from bert_trainer import features
from bert_trainer.encoders import AlbertEncoder, BertEncoder
from bert_trainer.features import END_LOGITS, LOGITS, MLM_LOGITS, NEXT_SENTENCE_LOGITS, START_LOGITS
from bert_trainer.heads.span_labeling import PADDING_LOGIT
from bert_trainer.models import (
    BertClassifier,
    BertPretrainer,
    BertSpanLabeler,
    BertTokenClassifier,
)
from bert_trainer.models.bert_pretrainer import Execution

TINY = dict(vocab_size=40, hidden_size=16, num_layers=1, num_attention_heads=2, inner_dim=32,
            max_sequence_length=12, type_vocab_size=2)
MASK = np.array([[1] * 8, [1] * 5 + [0] * 3], "int32")
WORD_IDS = np.random.default_rng(0).integers(1, 40, (2, 8)).astype("int32") * MASK
FEATURES = {
    features.INPUT_WORD_IDS: WORD_IDS,
    features.INPUT_MASK: MASK,
    features.INPUT_TYPE_IDS: np.zeros((2, 8), "int32"),
    features.MASKED_LM_POSITIONS: np.array([[1, 2, 6], [3, 0, 0]], "int32"),
}

# (model class, extra kwargs, expected {output: shape})
CASES = [
    (BertPretrainer, {}, {MLM_LOGITS: (2, 3, 40), NEXT_SENTENCE_LOGITS: (2, 2)}),
    (BertPretrainer, dict(num_next_sentence_labels=0), {MLM_LOGITS: (2, 3, 40)}),
    (BertClassifier, dict(num_classes=3), {LOGITS: (2, 3)}),
    (BertClassifier, dict(num_classes=3, pooling="mean"), {LOGITS: (2, 3)}),
    (BertSpanLabeler, {}, {START_LOGITS: (2, 8), END_LOGITS: (2, 8)}),
    (BertTokenClassifier, dict(num_classes=5), {LOGITS: (2, 8, 5)}),
]
IDS = [f"{cls.__name__}-{len(kwargs)}" for cls, kwargs, _ in CASES]


def _assert_same_outputs(a, b, atol=ATOL):
    assert a.keys() == b.keys()
    for key in a:
        assert_close(a[key], b[key], atol=atol, err_msg=key)


@pytest.mark.parametrize("cls, kwargs, shapes", CASES, ids=IDS)
def test_outputs_are_float32_dicts_of_the_documented_shapes(cls, kwargs, shapes):
    outputs = cls(BertEncoder(**TINY), **kwargs)(FEATURES)
    assert {key: tuple(value.shape) for key, value in outputs.items()} == shapes
    assert {value.dtype for value in outputs.values()} == {tf.float32}


@pytest.mark.parametrize("cls, kwargs, shapes", CASES, ids=IDS)
def test_keras_save_load_and_config_round_trip(tmp_path, cls, kwargs, shapes):
    model = cls(BertEncoder(**TINY), **kwargs)
    config = json.loads(json.dumps(model.get_config()))
    revived = cls.from_config(config)
    assert (json.dumps(revived.get_config(), sort_keys=True)
            == json.dumps(model.get_config(), sort_keys=True))
    assert len(revived.trainable_weights) == len(model.trainable_weights)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    _assert_same_outputs(loaded(FEATURES), model(FEATURES))


@pytest.mark.parametrize("cls, kwargs, shapes", CASES, ids=IDS)
def test_checkpoint_restores_into_a_fresh_model_before_any_call(tmp_path, cls, kwargs, shapes):
    model = cls(BertEncoder(**TINY), **kwargs)
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    fresh = cls(BertEncoder(**TINY), **kwargs)
    tf.train.Checkpoint(model=fresh).restore(path).assert_consumed()
    for a, b in zip(fresh.weights, model.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)  # the saved bytes
    _assert_same_outputs(fresh(FEATURES), model(FEATURES))


def test_pretrainer_ties_the_mlm_projection_to_the_word_embeddings():
    model = BertPretrainer(BertEncoder(**TINY, embedding_width=8))
    table = model.encoder.get_embedding_table()
    assert model.masked_lm.embedding_table is table and table.shape == (40, 8)
    revived = BertPretrainer.from_config(model.get_config())
    assert revived.masked_lm.embedding_table is revived.encoder.get_embedding_table()
    # Shared once, counted once: encoder + MLM transform/LN/bias + NSP head.
    mlm_own = 16 * 8 + 8 + 2 * 8 + 40
    assert model.count_params() == model.encoder.count_params() + mlm_own + 16 * 2 + 2


def test_sparse_last_layer_gives_the_dense_logits_and_gradients():
    encoder = BertEncoder(**dict(TINY, num_layers=2), output_dropout=0.0, attention_dropout=0.0)
    sparse = BertPretrainer(encoder)
    dense = BertPretrainer(encoder)
    dense.execution = Execution(sparse_last_layer=False)
    dense.set_weights(sparse.get_weights())
    assert sparse.sparse_last_layer_active and not dense.sparse_last_layer_active
    labels = np.array([[5, 6, 7], [8, 9, 9]], "int32")

    def loss_and_grads(model):
        with tf.GradientTape() as tape:
            outputs = model(FEATURES, training=True)
            loss = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(
                labels, outputs[MLM_LOGITS], from_logits=True)) + tf.reduce_sum(
                outputs[NEXT_SENTENCE_LOGITS][:, 0])
        return outputs, tape.gradient(loss, model.trainable_weights)

    (out_s, grads_s), (out_d, grads_d) = loss_and_grads(sparse), loss_and_grads(dense)
    _assert_same_outputs(out_s, out_d, atol=1e-5)
    assert len(grads_s) == len(grads_d) == len(sparse.trainable_weights)
    for a, b in zip(grads_s, grads_d, strict=True):
        np.testing.assert_allclose(tf.convert_to_tensor(a), tf.convert_to_tensor(b), atol=1e-5)
    # An encoder that computes only its first positions cannot serve masked positions.
    ranged = BertPretrainer(BertEncoder(**TINY, output_range=1))
    assert not ranged.sparse_last_layer_active


def test_pretrainer_execution_is_neither_a_constructor_argument_nor_config():
    """How the pretrainer computes is set after construction and never serialized; a config
    written when the switches were constructor arguments still loads, with them applied."""
    model = BertPretrainer(BertEncoder(**TINY))
    assert model.execution == Execution()  # the documented `mlm_logits` in training too
    assert not model.execution.skip_unweighted_predictions
    config = model.get_config()
    assert not {f.name for f in dataclasses.fields(Execution)} & set(config)
    with pytest.raises(ValueError, match="pack_tokens"):
        BertPretrainer(BertEncoder(**TINY), pack_tokens=False)
    legacy = dict(config, sparse_last_layer=False, skip_unweighted_predictions=True,
                  pack_tokens=False, mlm_projection_in_compute_dtype=True)
    revived = BertPretrainer.from_config(json.loads(json.dumps(legacy)))
    assert revived.execution == Execution(sparse_last_layer=False, pack_tokens=False,
                                          skip_unweighted_predictions=True,
                                          mlm_projection_in_compute_dtype=True)
    assert revived.masked_lm.projection_in_compute_dtype and not revived.sparse_last_layer_active
    assert BertPretrainer.from_config(config).execution == Execution()
    with pytest.raises(TypeError, match="Execution"):
        model.execution = {"pack_tokens": False}


def test_pretraining_steps_reduce_the_loss():
    model = BertPretrainer(BertEncoder(**TINY, output_dropout=0.0, attention_dropout=0.0))
    labels = np.array([[5, 6, 7], [8, 9, 9]], "int32")
    optimizer = keras.optimizers.Adam(1e-2)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    losses = []
    for _ in range(5):
        with tf.GradientTape() as tape:
            outputs = model(FEATURES, training=True)
            loss = (loss_fn(labels, outputs[MLM_LOGITS])
                    + loss_fn(np.array([0, 1]), outputs[NEXT_SENTENCE_LOGITS]))
        grads = tape.gradient(loss, model.trainable_variables)
        assert all(g is not None for g in grads)
        optimizer.apply(grads, model.trainable_variables)
        losses.append(float(loss))
    assert losses[-1] < losses[0] - 0.5, losses


def test_span_labeler_masks_padding():
    outputs = BertSpanLabeler(BertEncoder(**TINY))(FEATURES)
    for key in (START_LOGITS, END_LOGITS):
        assert (outputs[key].numpy()[1, 5:] == PADDING_LOGIT).all()
        assert (outputs[key].numpy()[0] > PADDING_LOGIT).all()


def test_mean_pooling_reads_the_mean_of_the_real_tokens():
    encoder = BertEncoder(**TINY, output_dropout=0.0, attention_dropout=0.0)
    model = BertClassifier(encoder, num_classes=3, pooling="mean")
    tokens = encoder(FEATURES)[features.SEQUENCE_OUTPUT].numpy()  # the full (unpacked) call
    expected = np.stack([tokens[row, :MASK[row].sum()].mean(axis=0) for row in range(2)])
    kernel, bias = (w.numpy() for w in model.classifier.weights)
    assert_close(model(FEATURES)[LOGITS], expected @ kernel + bias, atol=1e-5)
    cls = BertClassifier(encoder, num_classes=3)
    cls.classifier.set_weights(model.classifier.get_weights())
    assert np.abs(cls(FEATURES)[LOGITS].numpy() - model(FEATURES)[LOGITS].numpy()).max() > 1e-4
    with pytest.raises(ValueError, match="pooling='max' is unknown; use one of cls, mean"):
        BertClassifier(encoder, num_classes=3, pooling="max")


def test_albert_pretrainer_and_classifier():
    encoder = AlbertEncoder(**dict(TINY, embedding_width=8, num_layers=3))
    outputs = BertPretrainer(encoder)(FEATURES)
    assert outputs[MLM_LOGITS].shape == (2, 3, 40)
    assert BertClassifier(encoder, num_classes=2)(FEATURES)[LOGITS].shape == (2, 2)


def test_mixed_bfloat16_models_give_float32_logits(bfloat16_required):
    keras.mixed_precision.set_global_policy("mixed_bfloat16")  # conftest restores float32
    encoder = BertEncoder(**TINY)
    for model in (BertPretrainer(encoder), BertClassifier(encoder, num_classes=2),
                  BertSpanLabeler(encoder), BertTokenClassifier(encoder, num_classes=3)):
        outputs = model(FEATURES)
        assert {value.dtype for value in outputs.values()} == {tf.float32}, model.name
    assert encoder(FEATURES)[features.SEQUENCE_OUTPUT].dtype == tf.bfloat16


def test_missing_features_are_named():
    model = BertPretrainer(BertEncoder(**TINY))
    with pytest.raises(ValueError, match="lack 'masked_lm_positions'"):
        model({key: FEATURES[key] for key in features.ENCODER_INPUTS})
    with pytest.raises(ValueError, match=r"lack \['input_mask', 'input_type_ids'\]"):
        BertClassifier(BertEncoder(**TINY), num_classes=2)({features.INPUT_WORD_IDS: WORD_IDS})
