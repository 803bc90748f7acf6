"""NER pipeline: IOB1/IOB2, first-sub-token alignment and the round trip back to word tags."""

import numpy as np
import pytest
import tensorflow as tf

from bert_trainer import features
from bert_trainer.data import sources
from bert_trainer.tasks import registry
from bert_trainer.tasks.tagging import data as tagging_data
from bert_trainer.tasks.tagging.family import CONLL2003_LABELS

CONLL = CONLL2003_LABELS


def test_to_iob2():
    iob1 = ["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-LOC", "I-ORG", "I-MISC"]
    iob2 = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC", "B-ORG", "B-MISC"]
    assert tagging_data.to_iob2(iob1) == iob2
    assert tagging_data.to_iob2(iob2) == iob2  # IOB2 passes unchanged.
    assert tagging_data.to_iob2(["O", "PER", "I-X"]) == ["O", "PER", "B-X"]


def test_sorted_tags():
    assert tagging_data.sorted_tags({"I-PER", "B-LOC", "O", "B-PER"}) == [
        "O", "B-LOC", "B-PER", "I-PER"]


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_graph_iob2_matches_python_on_eng_testa(shared_dir):
    sentences = list(sources.read_conll(str(shared_dir / "data/conll2003/eng.testa")))
    raw_ids = [[CONLL.index(t) for t in tags] for _, _, tags in sentences]
    ds = tf.data.Dataset.from_generator(lambda: iter(raw_ids),
                                        output_signature=tf.TensorSpec([None], tf.int64))
    graph = [row.tolist() for row in ds.map(lambda t: tagging_data.iob2_ids(t, CONLL))
             .as_numpy_iterator()]
    python = [[CONLL.index(t) for t in tagging_data.to_iob2(tags)] for _, _, tags in sentences]
    assert graph == python
    assert sum(a != b for a, b in zip(raw_ids, python, strict=True)) > 1000  # Really IOB1.


def _eval_batches(shared_dir, tokenizer, seq_length):
    raw = registry.get_task_data("conll2003").load(
        "eval", file=str(shared_dir / "data/conll2003/eng.testa"))
    return raw, list(tagging_data.tagging_dataset(raw, tokenizer, seq_length=seq_length,
                                                  batch_size=128, is_training=False))


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_labels_on_first_sub_tokens_and_round_trip(shared_dir, tokenizer):
    raw, batches = _eval_batches(shared_dir, tokenizer, seq_length=128)
    rows = list(raw.as_numpy_iterator())
    assert sum(b[features.LABEL_IDS].shape[0] for b in batches) == len(rows) == 3250
    for batch in batches:
        n = batch[features.LABEL_IDS].shape[0]
        for key in (*features.ENCODER_INPUTS, features.LABEL_IDS):
            assert batch[key].shape == (n, 128) and batch[key].dtype == tf.int32, key
    label_ids = np.concatenate([b[features.LABEL_IDS].numpy() for b in batches])
    word_ids = np.concatenate([b[features.INPUT_WORD_IDS].numpy() for b in batches])
    # Word labels sit on the first piece of each word, everything else is ignored.
    for i in (0, 1, 7, 100):
        words = [w.decode() for w in rows[i]["tokens"]]
        firsts = [tokenizer.tokenize([w]).flat_values.numpy()[0] for w in words]
        starts = np.flatnonzero(label_ids[i] != features.IGNORE_LABEL)
        assert word_ids[i, starts].tolist() == firsts
        assert label_ids[i, starts].tolist() == rows[i]["tags"].tolist()
        assert label_ids[i, 0] == features.IGNORE_LABEL  # [CLS]
    # Round trip: the labels as "predictions" (noise where ignored) give back every word's tag.
    noisy = np.where(label_ids == features.IGNORE_LABEL, 5, label_ids)
    num_words = [len(r["tokens"]) for r in rows]
    back = tagging_data.word_predictions(noisy, label_ids, CONLL, num_words=num_words)
    # A word keeps its label iff its first piece is among the first 126 (128 - [CLS], [SEP]).
    pieces = tokenizer.tokenize(np.concatenate([r["tokens"] for r in rows])).row_lengths()
    per_word = np.split(np.maximum(pieces.numpy(), 1), np.cumsum(num_words)[:-1])  # [UNK]: 1.
    expected = [int((np.cumsum(p) - p < 126).sum()) for p in per_word]
    kept = (label_ids != features.IGNORE_LABEL).sum(axis=1)
    assert kept.tolist() == expected
    assert sum(k < n for k, n in zip(kept, num_words, strict=True)) == 3  # Three long ones.
    for i, row in enumerate(rows):
        gold = [CONLL[t] for t in row["tags"]]
        assert back[i] == gold[:kept[i]] + ["O"] * (num_words[i] - kept[i]), i


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_training_batches_are_static(shared_dir, tokenizer):
    raw = registry.get_task_data("conll2003").load(
        "train", file=str(shared_dir / "data/conll2003/eng.testa"))
    ds = tagging_data.tagging_dataset(raw, tokenizer, seq_length=32, batch_size=8,
                                      is_training=True, shuffle_buffer=64, seed=1)
    batch = next(iter(ds))
    assert batch[features.LABEL_IDS].shape == (8, 32)
    assert ds.element_spec[features.LABEL_IDS].shape.as_list() == [8, 32]


def test_empty_word_kept_as_unk_and_prediction_mode(tokenizer):
    words = tf.ragged.constant([["Hello", "\u200b", "world"], ["Paris"]])
    tags = tf.ragged.constant([[1, 0, 2], [5]], dtype=tf.int64)
    out = tagging_data.tag_features(tokenizer, words, tags, seq_length=8)
    # "\u200b" (zero-width space) has no piece: it becomes [UNK] so its label is not lost.
    ids = out[features.INPUT_WORD_IDS].numpy()
    labels = out[features.LABEL_IDS].numpy()
    assert ids[0, 2] == tokenizer.unk_id
    assert labels[0].tolist() == [-1, 1, 0, 2, -1, -1, -1, -1]
    assert labels[1].tolist() == [-1, 5, -1, -1, -1, -1, -1, -1]
    unlabeled = tagging_data.tag_features(tokenizer, words, None, seq_length=8)
    assert unlabeled[features.LABEL_IDS].numpy()[0].tolist() == [-1, 0, 0, 0, -1, -1, -1, -1]


def test_word_predictions_truncation_and_shape_check():
    labels = np.array([[-1, 3, -1, 0, -1]])
    preds = np.array([[0, 1, 7, 2, 0]])
    assert tagging_data.word_predictions(preds, labels, CONLL) == [["B-PER", "I-PER"]]
    assert tagging_data.word_predictions(preds, labels, CONLL, num_words=[4]) == [
        ["B-PER", "I-PER", "O", "O"]]
    with pytest.raises(ValueError, match=r"predicted_ids \(1, 4\) and label_ids \(1, 5\)"):
        tagging_data.word_predictions(preds[:, :4], labels, CONLL)
