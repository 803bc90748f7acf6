"""The bert-train model directory: bert_train.json, vocab, and warm-start restores."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from numerics import assert_close

from bert_trainer import features
from bert_trainer.checkpoints import layout as checkpoint_layout
from bert_trainer.checkpoints import model_dir
from bert_trainer.checkpoints.select import select_checkpoint
from bert_trainer.encoders import BertEncoder
from bert_trainer.errors import UserError
from bert_trainer.models import BertPretrainer

TINY = dict(vocab_size=50, hidden_size=32, num_layers=2, num_attention_heads=2, inner_dim=64,
            max_sequence_length=16, type_vocab_size=2)


def tiny_encoder(**overrides):
    return BertEncoder(**{**TINY, **overrides})


@pytest.fixture
def vocab(tmp_path):
    path = tmp_path / "vocab_in.txt"
    path.write_text("".join(f"tok{i}\n" for i in range(50)), encoding="utf-8")
    return path


def _inputs():
    ids = np.array([[2, 7, 9, 3, 0, 0], [2, 5, 3, 8, 4, 3]], np.int32)
    mask = (ids > 0).astype(np.int32)
    types = np.array([[0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1]], np.int32)
    return {features.INPUT_WORD_IDS: ids, features.INPUT_MASK: mask,
            features.INPUT_TYPE_IDS: types}


def _values(layer):
    return [keras.ops.convert_to_numpy(v) for v in layer.weights]


def test_model_info_round_trip(tmp_path, vocab):
    encoder = tiny_encoder(output_dropout=0.0)
    task = {"name": "sst2", "family": "classification", "label_names": ["neg", "pos"]}
    path = model_dir.write_model_info(str(tmp_path / "m"), encoder, vocab_file=str(vocab),
                                      lower_case=False, task=task)
    raw = json.loads(open(path).read())
    assert raw["format"] == "bert_train" and raw["version"] == 2
    assert raw["encoder"]["class_name"] == "BertEncoder" and raw["vocab_file"] == "vocab.txt"
    info = model_dir.read_model_info(str(tmp_path / "m"))
    assert info.vocab_file == str(tmp_path / "m" / "vocab.txt")
    assert (tmp_path / "m" / "vocab.txt").read_text() == vocab.read_text()
    assert info.lower_case is False and info.task == task
    rebuilt = model_dir.build_encoder(info)
    assert isinstance(rebuilt, BertEncoder)
    assert rebuilt.get_config() == encoder.get_config()
    assert rebuilt.count_params() == encoder.count_params()


def test_read_model_info_errors(tmp_path, vocab):
    with pytest.raises(UserError, match=r"bert_train.json does not exist; .* is not a bert-train"):
        model_dir.read_model_info(str(tmp_path))
    model_dir.write_model_info(str(tmp_path), tiny_encoder(), vocab_file=str(vocab))
    info_file = tmp_path / "bert_train.json"
    raw = json.loads(info_file.read_text())
    info_file.write_text(json.dumps({**raw, "version": 9}))
    with pytest.raises(UserError, match="version 9 is not supported"):
        model_dir.read_model_info(str(tmp_path))
    info_file.write_text("{not json")
    with pytest.raises(UserError, match="bert_train.json is not valid JSON"):
        model_dir.read_model_info(str(tmp_path))
    info_file.write_text(json.dumps(raw))
    (tmp_path / "vocab.txt").unlink()
    with pytest.raises(UserError, match=r"vocab.txt does not exist but .*bert_train.json names it"):
        model_dir.read_model_info(str(tmp_path))


def test_write_and_restore_pretrained_with_heads(tmp_path, vocab):
    source = BertPretrainer(tiny_encoder())
    prefix = model_dir.write_pretrained(
        str(tmp_path), encoder=source.encoder, masked_lm=source.masked_lm,
        next_sentence=source.next_sentence, vocab_file=str(vocab))
    assert prefix == str(tmp_path / "ckpt-0")
    assert select_checkpoint(str(tmp_path)) == prefix
    target = BertPretrainer(model_dir.build_encoder(model_dir.read_model_info(str(tmp_path))))
    result = model_dir.restore_pretrained(str(tmp_path), encoder=target.encoder,
                                          masked_lm=target.masked_lm,
                                          next_sentence=target.next_sentence)
    assert result["initialized"] == []
    assert len(set(result["loaded"])) == len({id(v) for v in target.weights})
    for a, b in zip(_values(source), _values(target), strict=True):
        np.testing.assert_array_equal(a, b)  # the saved bytes
    features_in = {**_inputs(), features.MASKED_LM_POSITIONS: np.array([[1, 2], [3, 4]])}
    for key, value in source(features_in).items():
        assert_close(value, target(features_in)[key], err_msg=key)


def test_warm_start_from_a_trainer_checkpoint(tmp_path):
    """A pretraining run's checkpoint (model + optimizer + step) warm-starts an encoder."""
    pretrainer = BertPretrainer(tiny_encoder(), num_next_sentence_labels=0)
    optimizer = keras.optimizers.Adam()
    optimizer.build(pretrainer.trainable_variables)
    root = tf.train.Checkpoint(model=pretrainer, optimizer=optimizer, step=tf.Variable(7))
    tf.train.CheckpointManager(root, str(tmp_path), max_to_keep=2, checkpoint_name="ckpt").save(
        checkpoint_number=7)
    encoder = tiny_encoder()
    heads = BertPretrainer(encoder)  # asks for an NSP head the checkpoint does not have
    result = model_dir.restore_pretrained(str(tmp_path), encoder=encoder,
                                          masked_lm=heads.masked_lm,
                                          next_sentence=heads.next_sentence)
    assert sorted(result["initialized"]) == sorted(v.path for v in heads.next_sentence.weights)
    for a, b in zip(encoder.weights, pretrainer.encoder.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)  # the saved bytes
    assert_close(encoder(_inputs())[features.SEQUENCE_OUTPUT],
                 pretrainer.encoder(_inputs())[features.SEQUENCE_OUTPUT])
    np.testing.assert_array_equal(heads.masked_lm.bias, pretrainer.masked_lm.bias)


def test_shape_mismatch_is_named_and_nothing_is_restored(tmp_path):
    model_dir.write_pretrained(str(tmp_path), encoder=tiny_encoder())
    other = tiny_encoder(inner_dim=48)
    before = _values(other)
    with pytest.raises(UserError) as e:
        model_dir.restore_pretrained(str(tmp_path), encoder=other)
    assert str(e.value) == (
        f"{tmp_path}/ckpt-0: encoder/transformer_layer_0/intermediate/kernel is [32, 64] in the "
        "checkpoint but [32, 48] in the model; the checkpoint is of another architecture "
        "(check the encoder config)")
    for a, b in zip(before, _values(other), strict=True):
        np.testing.assert_array_equal(a, b)


def test_checkpoint_without_an_encoder(tmp_path):
    tf.train.Checkpoint(model=tf.train.Checkpoint(other=tf.Variable(1.0))).save(
        str(tmp_path / "ckpt"))
    with pytest.raises(UserError, match="holds no encoder weights"):
        model_dir.restore_pretrained(str(tmp_path), encoder=tiny_encoder())


def test_match_variables_covers_every_saved_variable(tmp_path):
    pretrainer = BertPretrainer(tiny_encoder())
    root = tf.train.Checkpoint(model=tf.train.Checkpoint(
        encoder=pretrainer.encoder, masked_lm=pretrainer.masked_lm,
        next_sentence=pretrainer.next_sentence))
    prefix = root.save(str(tmp_path / "ckpt"))
    matched = checkpoint_layout.match_variables(*checkpoint_layout.read_object_graph(prefix), root)
    saved = {n for n, _ in tf.train.list_variables(prefix) if n.endswith("VARIABLE_VALUE")}
    assert {key for key, _, _ in matched} == saved
    for key, shape, variable in matched:
        assert tuple(shape) == tuple(variable.shape), key


def test_checkpoint_with_more_layers_is_refused(tmp_path):
    model_dir.write_pretrained(str(tmp_path), encoder=tiny_encoder(num_layers=3))
    with pytest.raises(UserError, match=r"ckpt-0: 16 encoder variables have no place in the "
                                        r"model \(e.g. encoder/transformer_layer_2/.*\); "
                                        r".*num_layers"):
        model_dir.restore_pretrained(str(tmp_path), encoder=tiny_encoder(num_layers=2))


def test_name_based_checkpoint_is_refused(tmp_path):
    prefix = str(tmp_path / "bert_model.ckpt")
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=["bert/pooler/dense/bias"],
                      shape_and_slices=[""], tensors=[tf.zeros([32])])
    with pytest.raises(UserError, match="is a name-based .* convert it first with 'bert-train "
                                        "convert"):
        model_dir.restore_pretrained(prefix, encoder=tiny_encoder())
