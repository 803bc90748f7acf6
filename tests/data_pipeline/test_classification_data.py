"""Classification/regression pipeline on the real SST-2, MRPC and IMDB samples."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from bert_trainer import features
from bert_trainer.data import input_utils
from bert_trainer.errors import UserError
from bert_trainer.tasks import registry
from bert_trainer.tasks.classification.data import classification_dataset


def _raw(shared_dir, task, file, **kwargs):
    return registry.get_task_data(task).load("eval", file=str(shared_dir / "data" / file),
                                              **kwargs)


def _check_batch(batch, batch_size, seq_length, label_dtype=tf.int32):
    for key in features.ENCODER_INPUTS:
        assert batch[key].shape == (batch_size, seq_length) and batch[key].dtype == tf.int32, key
    assert batch[features.LABEL_IDS].shape == (batch_size,)
    assert batch[features.LABEL_IDS].dtype == label_dtype


def _pieces(tokenizer, text):
    return tokenizer.tokenize([text]).flat_values.numpy().tolist()


def test_sst2_eval_batches(shared_dir, tokenizer):
    raw = _raw(shared_dir, "sst2", "sst2/dev.tsv")
    batches = list(classification_dataset(raw, tokenizer, seq_length=32, batch_size=64,
                                          is_training=False))
    assert [b[features.LABEL_IDS].shape[0] for b in batches] == [64] * 13 + [40]  # 872 rows.
    for batch in batches:
        _check_batch(batch, batch[features.LABEL_IDS].shape[0], 32)
    first = batches[0]
    text = "it 's a charming and often affecting journey . "
    expected = [tokenizer.cls_id] + _pieces(tokenizer, text) + [tokenizer.sep_id]
    ids = first[features.INPUT_WORD_IDS][0].numpy()
    assert ids[:len(expected)].tolist() == expected
    assert (ids[len(expected):] == tokenizer.pad_id).all()
    assert first[features.INPUT_MASK][0].numpy().sum() == len(expected)
    assert first[features.INPUT_TYPE_IDS].numpy().sum() == 0  # Single sentences: all type 0.
    labels = np.concatenate([b[features.LABEL_IDS].numpy() for b in batches])
    assert labels.sum() == 444 and labels[:3].tolist() == [1, 0, 1]
    # Evaluation keeps file order even without deterministic=True (parallel map).
    assert labels.tolist() == [int(r["label"]) for r in raw.as_numpy_iterator()]


def test_mrpc_pairs_and_truncation(shared_dir, tokenizer):
    seq = 24
    raw = _raw(shared_dir, "mrpc", "mrpc/dev.tsv")
    batch = next(iter(classification_dataset(raw, tokenizer, seq_length=seq, batch_size=8,
                                             is_training=False)))
    _check_batch(batch, 8, seq)
    rows = list(raw.take(8).as_numpy_iterator())
    for i, row in enumerate(rows):
        a = _pieces(tokenizer, row["text"].decode())
        b = _pieces(tokenizer, row["text_b"].decode())
        while len(a) + len(b) > seq - 3:  # google-research/bert's _truncate_seq_pair.
            (a if len(a) > len(b) else b).pop()
        expected = [tokenizer.cls_id] + a + [tokenizer.sep_id] + b + [tokenizer.sep_id]
        ids = batch[features.INPUT_WORD_IDS][i].numpy()
        assert ids[:len(expected)].tolist() == expected, i
        types = batch[features.INPUT_TYPE_IDS][i].numpy()
        assert types.tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1) + [0] * (
            seq - len(expected))
    assert batch[features.LABEL_IDS].numpy().tolist() == [int(r["label"]) for r in rows]


def test_training_repeats_with_static_batches(shared_dir, tokenizer):
    raw = _raw(shared_dir, "imdb", "imdb/train_sample.tsv", skip_bad_rows=True)
    ds = classification_dataset(raw, tokenizer, seq_length=64, batch_size=16, is_training=True,
                                shuffle_buffer=256, seed=3)
    assert ds.element_spec[features.INPUT_WORD_IDS].shape.as_list() == [16, 64]
    assert ds.element_spec[features.LABEL_IDS].shape.as_list() == [16]
    # 1949 examples / 16 = 121.8: taking 130 batches only works because training repeats.
    labels = [b[features.LABEL_IDS].numpy() for b in ds.take(130)]
    assert len(labels) == 130 and set(np.concatenate(labels)) == {0, 1}


def _sentences(ds):
    rows = []
    for batch in ds:
        rows += [tuple(r) for r in batch[features.INPUT_WORD_IDS].numpy().tolist()]
    return rows


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_input_context_shards_are_disjoint_and_complete(shared_dir, tokenizer):
    raw = _raw(shared_dir, "sst2", "sst2/dev.tsv")
    build = lambda ctx: classification_dataset(raw, tokenizer, seq_length=48, batch_size=32,
                                               is_training=False, input_context=ctx)
    shards = [_sentences(build(tf.distribute.InputContext(2, i, 2))) for i in range(2)]
    everything = _sentences(build(None))
    assert len(shards[0]) == len(shards[1]) == 436
    assert not set(shards[0]) & set(shards[1])
    assert collections.Counter(shards[0] + shards[1]) == collections.Counter(everything)


def test_per_replica_batch_size():
    ctx = tf.distribute.InputContext(1, 0, 4)
    assert input_utils.per_replica_batch_size(64, ctx) == 16
    assert input_utils.per_replica_batch_size(64) == 64
    with pytest.raises(UserError, match="global batch size 62 does not divide among 4 replicas"):
        input_utils.per_replica_batch_size(62, ctx)


def test_one_options_object_or_its_fields(shared_dir, tokenizer):
    """Every family's builder takes `PipelineOptions` (as the tasks pass them) or its fields."""
    raw = _raw(shared_dir, "sst2", "sst2/dev.tsv").take(20)
    options = input_utils.PipelineOptions(batch_size=8, is_training=False)
    by_object = list(classification_dataset(raw, tokenizer, seq_length=32, options=options))
    by_fields = list(classification_dataset(raw, tokenizer, seq_length=32, batch_size=8,
                                            is_training=False))
    assert [len(b[features.LABEL_IDS]) for b in by_object] == [8, 8, 4]
    for a, b in zip(by_object, by_fields, strict=True):
        np.testing.assert_array_equal(a[features.INPUT_WORD_IDS], b[features.INPUT_WORD_IDS])
    with pytest.raises(TypeError, match=r"pass options= or its fields, not both \(\['seed'\]\)"):
        classification_dataset(raw, tokenizer, seq_length=32, options=options, seed=3)
    # Also a mapping of its fields, as pipeline_options' dict was (plugin families read it).
    assert dict(**options)["batch_size"] == options["batch_size"] == 8
    assert not options["is_training"] and set(options.keys()) >= {"seed", "length_buckets"}
    with pytest.raises(KeyError):
        options["batch"]
    with pytest.raises(UserError, match="batch size 0 must be >= 1"):
        input_utils.PipelineOptions(batch_size=0)
    with pytest.raises(UserError, match="shuffle buffer 0 must be >= 1"):
        input_utils.PipelineOptions(batch_size=8, shuffle_buffer=0)


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_deterministic_mode_repeats_order(shared_dir, tokenizer):
    raw = _raw(shared_dir, "sst2", "sst2/dev.tsv")

    def first_batches(seed):
        ds = classification_dataset(raw, tokenizer, seq_length=32, batch_size=8,
                                    is_training=True, seed=seed, deterministic=True,
                                    shuffle_buffer=100)
        return [b[features.INPUT_WORD_IDS].numpy() for b in ds.take(3)]

    assert all((a == b).all() for a, b in zip(first_batches(7), first_batches(7), strict=True))
    assert not all((a == b).all() for a, b in zip(first_batches(7), first_batches(8),
                                                  strict=True))


def test_regression_labels_are_float(tmp_path, tokenizer):
    path = tmp_path / "sts.tsv"
    path.write_text("sentence1\tsentence2\tscore\na cat\ta dog\t3.5\nhi\tbye\t0.25\n")
    raw = registry.get_task_data("stsb").load("train", file=str(path))
    batch = next(iter(classification_dataset(raw, tokenizer, seq_length=16, batch_size=2,
                                             is_training=False, regression=True)))
    _check_batch(batch, 2, 16, label_dtype=tf.float32)
    assert batch[features.LABEL_IDS].numpy().tolist() == [3.5, 0.25]
