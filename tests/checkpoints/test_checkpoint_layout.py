"""Stable checkpoint names: what they are, why they survive code changes, and the old layout."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from numerics import assert_close
from toy_task import ToyConfig, ToyTask

from bert_trainer import features
from bert_trainer.checkpoints import layout as checkpoint_layout
from bert_trainer.checkpoints import model_dir
from bert_trainer.encoders import AlbertEncoder, BertEncoder
from bert_trainer.errors import UserError
from bert_trainer.models import (
    BertClassifier,
    BertPretrainer,
    BertSpanLabeler,
    BertTokenClassifier,
)
from bert_trainer.training.optimization import OptimizerConfig
from bert_trainer.training.trainer import Trainer, TrainerConfig

TINY = dict(vocab_size=50, hidden_size=32, num_layers=1, num_attention_heads=2, inner_dim=64,
            max_sequence_length=16, type_vocab_size=2)
LAYER_0 = [f"encoder/transformer_layer_0/{name}" for name in (
    "attention/query/kernel", "attention/query/bias", "attention/key/kernel",
    "attention/key/bias", "attention/value/kernel", "attention/value/bias",
    "attention/attention_output/kernel", "attention/attention_output/bias",
    "attention_layer_norm/gamma", "attention_layer_norm/beta", "intermediate/kernel",
    "intermediate/bias", "output/kernel", "output/bias", "output_layer_norm/gamma",
    "output_layer_norm/beta")]
PRETRAINER_NAMES = [
    "encoder/word_embeddings/embeddings", "encoder/position_embedding/embeddings",
    "encoder/type_embeddings/embeddings", "encoder/embeddings_layer_norm/gamma",
    "encoder/embeddings_layer_norm/beta", *LAYER_0, "encoder/pooler_transform/kernel",
    "encoder/pooler_transform/bias", "masked_lm/bias", "masked_lm/transform/kernel",
    "masked_lm/transform/bias", "masked_lm/transform_layer_norm/gamma",
    "masked_lm/transform_layer_norm/beta", "next_sentence/logits/kernel",
    "next_sentence/logits/bias"]


class ShiftedEncoder(BertEncoder):
    """BertEncoder's weights, plus one weightless op first: the op list is renumbered."""

    def _forward(self, word_ids, mask, type_ids, **kwargs):
        word_ids = keras.layers.Identity(name="extra_identity")(word_ids)
        return super()._forward(word_ids, mask, type_ids, **kwargs)


def _inputs():
    ids = np.array([[2, 7, 9, 3, 0, 0], [2, 5, 3, 8, 4, 3]], np.int32)
    return {features.INPUT_WORD_IDS: ids, features.INPUT_MASK: (ids > 0).astype(np.int32),
            features.INPUT_TYPE_IDS: np.array([[0] * 6, [0, 0, 0, 1, 1, 1]], np.int32)}


def _sequence(encoder):
    return keras.ops.convert_to_numpy(encoder(_inputs())[features.SEQUENCE_OUTPUT])


def _assert_same_encoder(restored, source):
    """Restored weights equal the saved ones bit for bit; the outputs to float32 rounding
    (a fresh model may pick other oneDNN blockings on its first call)."""
    for a, b in zip(restored.weights, source.weights, strict=True):
        np.testing.assert_array_equal(a, b, err_msg=a.path)
    assert_close(_sequence(restored), _sequence(source))


def _model_keys(prefix):
    return {k for k, _ in tf.train.list_variables(prefix) if k.startswith("model/")}


def _trainer_like_save(model, directory, trackable):
    """A root like the trainer's (model, optimizer with slots, step), saved as ckpt-3."""
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    root = tf.train.Checkpoint(model=trackable, optimizer=optimizer, step=tf.Variable(3))
    return tf.train.CheckpointManager(root, str(directory), 1, checkpoint_name="ckpt").save(3)


def test_names_are_keras_paths_and_become_the_checkpoint_keys(tmp_path):
    model = BertPretrainer(BertEncoder(**TINY))
    names = checkpoint_layout.variable_names(model)
    assert list(names) == PRETRAINER_NAMES
    # The tied MLM table is the encoder's word table, named (and saved) once.
    assert names["encoder/word_embeddings/embeddings"] is model.masked_lm.embedding_table
    prefix = _trainer_like_save(model, tmp_path, checkpoint_layout.model_trackable(model))
    # Every model variable is stored under its name, not under optimizer/_trainable_variables/N.
    assert _model_keys(prefix) == {checkpoint_layout.checkpoint_key(n) for n in names}
    assert checkpoint_layout.checkpoint_key("encoder/word_embeddings/embeddings") == (
        "model/encoder.Sword_embeddings.Sembeddings/.ATTRIBUTES/VARIABLE_VALUE")
    assert not any("_trainable_variables" in k for k, _ in tf.train.list_variables(prefix))


def test_renumbered_encoder_ops_keep_names_and_restore_exactly(tmp_path):
    two_layers = {**TINY, "num_layers": 2}
    plain, shifted = BertEncoder(**two_layers), ShiftedEncoder(**two_layers)
    # The object-graph layout names variables by op index, which the extra op changes ...
    old_plain = _model_keys(tf.train.Checkpoint(model=plain).write(str(tmp_path / "a")))
    old_shifted = _model_keys(tf.train.Checkpoint(model=shifted).write(str(tmp_path / "b")))
    assert any("_operations" in k for k in old_plain) and old_plain != old_shifted
    # ... the stable names do not.
    assert (list(checkpoint_layout.variable_names(plain))
            == list(checkpoint_layout.variable_names(shifted)))
    model_dir.write_pretrained(str(tmp_path / "m"), encoder=plain)
    report = model_dir.restore_pretrained(str(tmp_path / "m"), encoder=shifted)
    assert report["initialized"] == [] and len(report["loaded"]) == len(plain.weights)
    _assert_same_encoder(shifted, plain)


def test_old_object_graph_checkpoint_still_warm_starts(tmp_path):
    """A first-layout trainer checkpoint (model object graph + optimizer) restores every weight."""
    source = BertClassifier(BertEncoder(**TINY), num_classes=3)
    prefix = _trainer_like_save(source, tmp_path, source)  # the old layout: the model itself
    graph, _ = checkpoint_layout.read_object_graph(prefix)
    assert checkpoint_layout.layout(graph) == checkpoint_layout.OBJECT_GRAPH
    # Trainable variables are keyed by the optimizer's list index there.
    assert any(k.startswith("optimizer/_trainable_variables/")
               for k, _ in tf.train.list_variables(prefix))
    target = BertClassifier(BertEncoder(**TINY), num_classes=3)
    checkpoint_layout.restore_model(target, prefix)
    for a, b in zip(source.weights, target.weights, strict=True):
        np.testing.assert_array_equal(a, b)
    encoder = BertEncoder(**TINY)
    report = model_dir.restore_pretrained(prefix, encoder=encoder)
    assert len(report["loaded"]) == len(encoder.weights)
    _assert_same_encoder(encoder, source.encoder)


def test_restore_model_refuses_a_shape_or_a_missing_variable_in_one_line(tmp_path):
    source = BertTokenClassifier(BertEncoder(**TINY), num_classes=4)
    prefix = _trainer_like_save(source, tmp_path, checkpoint_layout.model_trackable(source))
    wider = BertTokenClassifier(BertEncoder(**TINY), num_classes=5)
    before = [keras.ops.convert_to_numpy(v) for v in wider.weights]
    with pytest.raises(UserError) as caught:
        checkpoint_layout.restore_model(wider, prefix)
    assert str(caught.value) == (
        f"{prefix}: classifier/logits/kernel is [32, 4] in the checkpoint but [32, 5] in the "
        "model; the checkpoint is of another architecture (check the encoder config)")
    for a, b in zip(before, wider.weights, strict=True):
        np.testing.assert_array_equal(a, b)  # nothing restored
    deeper = BertTokenClassifier(BertEncoder(**{**TINY, "num_layers": 2}), num_classes=4)
    with pytest.raises(UserError, match=r"has no value for encoder/transformer_layer_1/attention"
                                        r"/query/kernel \(16 of the model's 41 variables"):
        checkpoint_layout.restore_model(deeper, prefix)


def test_task_initialize_reads_stable_names_and_names_a_mismatch(tmp_path):
    source = ToyTask().build_model()
    prefix = tf.train.Checkpoint(model=checkpoint_layout.model_trackable(source)).write(
        str(tmp_path / "toy"))
    target = ToyTask().build_model()
    ToyTask().initialize(target, prefix)
    for a, b in zip(source.weights, target.weights, strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(UserError) as caught:
        ToyTask().initialize(ToyTask(ToyConfig(hidden_size=24)).build_model(), prefix)
    assert str(caught.value).startswith(f"--init_checkpoint={prefix} does not fit task 'toy'")
    assert "embedding/embeddings is [32, 16] in the checkpoint but [32, 24]" in str(caught.value)
    assert "\n" not in str(caught.value)


def _old_layout_toy_run(directory) -> str:
    """A model_dir whose ckpt-2 has the first layout (the model's own object graph)."""
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=ToyTask().build_model()),
                                         str(directory), 1, checkpoint_name="ckpt")
    return manager.save(2)


def test_resuming_an_object_graph_checkpoint_is_refused_with_the_way_out(tmp_path):
    prefix = _old_layout_toy_run(tmp_path)
    with pytest.raises(UserError) as caught:
        Trainer(ToyTask(), str(tmp_path), config=TrainerConfig(train_steps=4, eval_steps=0),
                optimizer=OptimizerConfig(learning_rate=1e-2))
    assert str(caught.value) == (
        f"model_dir {tmp_path}: {prefix} was written by an older bert-train (object-graph "
        "variable names) and cannot be resumed; finish the run with that version, or start a "
        f"new --model_dir with --init_checkpoint={prefix}")


MODELS = {
    "pretrainer": lambda: BertPretrainer(BertEncoder(**TINY)),
    "classifier": lambda: BertClassifier(BertEncoder(**TINY), num_classes=2),
    "span_labeler": lambda: BertSpanLabeler(BertEncoder(**TINY)),
    "token_classifier": lambda: BertTokenClassifier(BertEncoder(**TINY), num_classes=3),
    "albert": lambda: BertClassifier(AlbertEncoder(**TINY, embedding_width=16), num_classes=2),
}


@pytest.mark.parametrize("build", MODELS.values(), ids=MODELS.keys())
def test_names_are_deterministic_and_never_auto_numbered(build):
    first = list(checkpoint_layout.variable_names(build()))
    # A second build in the same process bumps Keras' name counters (dense -> dense_1): any
    # auto-named layer would show up as a different name here.
    assert list(checkpoint_layout.variable_names(build())) == first
    for name in first:
        for part in name.split("/"):
            assert not re.fullmatch(r"(?!transformer_layer_)[a-z_]+_\d+", part), name


def test_duplicate_names_are_refused():
    class Twins(keras.Model):
        def __init__(self):
            super().__init__()
            self.a = keras.layers.Dense(2, name="dense")
            self.b = keras.layers.Dense(2, name="dense")
            self.a.build((None, 3))
            self.b.build((None, 3))

    with pytest.raises(ValueError, match="two variables are named dense/kernel; give their "
                                         "layers distinct explicit names"):
        checkpoint_layout.variable_names(Twins())


def test_a_head_named_otherwise_is_refused_not_silently_skipped():
    model = BertPretrainer(BertEncoder(**TINY), name="p")
    with pytest.raises(ValueError, match="head 'mlm' holds masked_lm/bias; name the layer 'mlm'"):
        checkpoint_layout.parts_names(model.encoder, {"mlm": model.masked_lm})


def test_evaluate_names_an_object_graph_checkpoint_instead_of_suggesting_a_resume(tmp_path):
    from bert_trainer.training.checkpoint_eval import evaluate_checkpoint

    prefix = _old_layout_toy_run(tmp_path)
    with pytest.raises(UserError) as caught:
        evaluate_checkpoint(ToyTask(), str(tmp_path), prefix)
    assert str(caught.value) == (
        f"{prefix} was written by an older bert-train (object-graph variable names), which "
        "evaluate cannot read; export and predict --model_dir still can, or evaluate with the "
        "bert-train version that wrote it")
