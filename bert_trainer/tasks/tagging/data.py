"""Token tagging (NER) input pipeline: word labels on first sub-tokens, and back to words.

Tag scheme: IOB1 (CoNLL-2003's original files: `I-X` opens an entity unless it follows an
entity of the same type; `B-X` only splits two adjacent ones) and IOB2 (every entity opens
with `B-X`) are both read and converted to IOB2, the one scheme used inside bert-train and in
its output. The conversion turns an `I-X` that does not continue an `X` entity into `B-X`; it
leaves IOB2 unchanged, so it is applied to every source without detecting the scheme.

Alignment: each word is tokenized on its own; its first sub-token carries the word's label and
the other sub-tokens carry `features.IGNORE_LABEL` (-1), which the loss ignores. The same mask
maps per-token predictions back to one tag per word (`word_predictions`). A sentence longer
than `seq_length - 2` pieces is either cut there (`tag_features`; `word_predictions` tags the
words cut "O" when told the word count) or windowed (`window_tag_features`: every word is
tagged from the window where its first piece has the most context, see `data/windows.py`).
Cut sentences are not silent: truncated batches carry CUT, which the task counts
(the `cut_sentences` metric), and the serving signature returns `truncated` per text.
"""

import numpy as np
import tensorflow as tf

from bert_trainer import features
from bert_trainer.data import input_utils, windows

OUTSIDE = "O"
CUT = "cut"  # int32 [batch]: 1 when the sentence lost pieces to fit (truncate; counted)


def to_iob2(tags: list[str]) -> list[str]:
    """IOB1 or IOB2 tags of one sentence in IOB2.

    Args:
      tags: e.g. ["I-PER", "I-PER", "O", "I-LOC", "B-LOC"] (IOB1).

    Returns:
      e.g. ["B-PER", "I-PER", "O", "B-LOC", "B-LOC"].
    """
    out, prev_type = [], None
    for tag in tags:
        kind, _, etype = tag.partition("-")
        if kind == "I" and etype and etype != prev_type:
            tag = f"B-{etype}"
        out.append(tag)
        prev_type = etype if kind in ("B", "I") and etype else None
    return out


def sorted_tags(tags) -> list[str]:
    """A tag set in a stable order: "O", then per entity type (sorted) its B- and I- tags."""
    rest = sorted(set(tags) - {OUTSIDE}, key=lambda t: (t.partition("-")[2], t))
    return [OUTSIDE] + rest


def iob2_ids(tag_ids: tf.Tensor, label_names) -> tf.Tensor:
    """`to_iob2` on tag ids inside a graph (for TFDS's integer tags).

    Args:
      tag_ids: int [words] ids into `label_names` of one sentence.
      label_names: tags in id order, e.g. CoNLL-2003's.

    Returns:
      int64 [words] ids of the IOB2 tags.
    """
    names = list(label_names)
    types = sorted({n.partition("-")[2] for n in names if n != OUTSIDE})
    type_of = [types.index(n.partition("-")[2]) + 1 if n != OUTSIDE else 0 for n in names]
    inside = [n.startswith("I-") for n in names]
    begin = [names.index(f"B-{n[2:]}") if n.startswith("I-") and f"B-{n[2:]}" in names else i
             for i, n in enumerate(names)]
    tag_ids = tf.cast(tag_ids, tf.int64)
    prev = tf.concat([tf.fill([1], tf.constant(names.index(OUTSIDE), tf.int64)), tag_ids[:-1]], 0)
    opens = tf.logical_and(tf.gather(inside, tag_ids),
                           tf.not_equal(tf.gather(type_of, prev), tf.gather(type_of, tag_ids)))
    return tf.where(opens, tf.gather(tf.constant(begin, tf.int64), tag_ids), tag_ids)


def _pieces_per_word(tokenizer, words: tf.RaggedTensor) -> tf.RaggedTensor:
    """int32 [total_words, (pieces)]; a word with no piece (control chars only) becomes [UNK]."""
    pieces = tokenizer.tokenize(words.flat_values)
    empty = tf.equal(pieces.row_lengths(), 0)
    filler = tf.RaggedTensor.from_row_lengths(
        tf.fill([tf.reduce_sum(tf.cast(empty, tf.int32))], tf.constant(tokenizer.unk_id, tf.int32)),
        tf.cast(empty, tf.int64))
    return tf.concat([pieces, filler], axis=1)


def _piece_labels(tokenizer, words: tf.RaggedTensor, tags: tf.RaggedTensor | None):
    """(ids, labels) int32 RaggedTensors [batch, (pieces)] of whole sentences: each word's
    tag on its first piece, IGNORE_LABEL on the others (0 on first pieces when `tags` is
    None)."""
    pieces = _pieces_per_word(tokenizer, words)  # (total_words, (pieces))
    row_ids = pieces.value_rowids()
    is_first = tf.equal(tf.range(tf.size(pieces.flat_values, out_type=tf.int64)),
                        tf.gather(pieces.row_starts(), row_ids))
    word_tags = (tf.zeros_like(words.flat_values, tf.int32) if tags is None
                 else tf.cast(tags.flat_values, tf.int32))
    piece_labels = tf.where(is_first, tf.gather(word_tags, row_ids), features.IGNORE_LABEL)

    splits = pieces.row_splits
    ids = tf.RaggedTensor.from_row_splits(pieces.flat_values, tf.gather(splits, words.row_splits))
    return ids, tf.RaggedTensor.from_row_splits(piece_labels, ids.row_splits)


def _row_labels(labels: tf.RaggedTensor, seq_length: int) -> tf.Tensor:
    """int32 [rows, seq_length]: IGNORE_LABEL at [CLS], the labels, IGNORE_LABEL after."""
    ignore_cls = tf.fill([labels.nrows(), 1], tf.constant(features.IGNORE_LABEL, tf.int32))
    labels = tf.concat([tf.RaggedTensor.from_tensor(ignore_cls), labels], axis=1)
    return labels.to_tensor(features.IGNORE_LABEL, shape=[None, seq_length])


def tag_features(tokenizer, words: tf.RaggedTensor, tags: tf.RaggedTensor | None,
                 seq_length: int, *, with_cut: bool = False) -> dict:
    """Encoder inputs and per-token labels of a batch of tagged sentences.

    Args:
      tokenizer: a `bert_trainer.data.tokenizer.Tokenizer`.
      words: string RaggedTensor [batch, (words)].
      tags: int RaggedTensor [batch, (words)] of tag ids, or None when predicting (then word
        starts are labelled 0 so that `word_predictions` still finds them).
      seq_length: packed length; a sentence keeps at most `seq_length - 2` pieces.
      with_cut: add CUT (which sentences lost pieces).

    Returns:
      features.ENCODER_INPUTS int32 [batch, seq_length] and features.LABEL_IDS int32
      [batch, seq_length]: the word's tag on its first piece, IGNORE_LABEL elsewhere; CUT
      int32 [batch].
    """
    ids, labels = _piece_labels(tokenizer, words, tags)
    keep = seq_length - 2  # Room for [CLS] and [SEP]; cut here so pack() never trims again.
    cut = ids.row_lengths() > keep
    ids, labels = ids[:, :keep], labels[:, :keep]
    inputs = tokenizer.pack([ids], seq_length)
    if with_cut:
        inputs[CUT] = tf.cast(cut, tf.int32)
    inputs[features.LABEL_IDS] = _row_labels(labels, seq_length)
    return inputs


def window_tag_features(tokenizer, words: tf.RaggedTensor, tags: tf.RaggedTensor | None,
                        seq_length: int, *, doc_stride: int | None = None,
                        example_index=None) -> dict:
    """`tag_features` of every window of a batch of sentences (see `data/windows.py`).

    A sentence of at most `seq_length - 2` pieces is one window, equal to its `tag_features`
    row. Each window labels every word whose first piece it holds; `windows.IS_MAX_CONTEXT`
    marks the pieces whose prediction the window gives (each piece has exactly one).

    Args:
      tokenizer, words, tags, seq_length: as for `tag_features`.
      doc_stride: pieces between window starts (None: half a window).
      example_index: int [batch] the sentences' numbers (None: 0..batch-1).

    Returns:
      features.ENCODER_INPUTS and LABEL_IDS int32 [W, seq_length], windows.IS_MAX_CONTEXT
      bool [W, seq_length] and windows.EXAMPLE_INDEX, NUM_WINDOWS, WINDOW_START int32 [W].
    """
    ids, labels = _piece_labels(tokenizer, words, tags)
    cut = windows.cut(ids.row_lengths(), seq_length - 2, doc_stride)
    inputs = tokenizer.pack([windows.gather(ids, cut)], seq_length)
    inputs[features.LABEL_IDS] = _row_labels(windows.gather(labels, cut), seq_length)
    best = windows.max_context(ids, cut)  # (W, (length))
    no_cls = tf.RaggedTensor.from_tensor(tf.zeros([best.nrows(), 1], tf.bool))
    inputs[windows.IS_MAX_CONTEXT] = tf.concat([no_cls, best], axis=1).to_tensor(
        False, shape=[None, seq_length])
    inputs.update(windows.row_features(cut, example_index))
    return inputs


def tagging_dataset(raw: tf.data.Dataset, tokenizer, *, seq_length: int,
                    long_texts: str = "truncate", doc_stride: int | None = None,
                    options: input_utils.PipelineOptions | None = None,
                    **fields) -> tf.data.Dataset:
    """Batches of a tagging task from raw examples {"tokens", "tags"} (`TaskData.load`).

    Args:
      raw: unbatched raw examples; "tags" may be absent (prediction).
      tokenizer: a `Tokenizer`.
      seq_length: packed sequence length.
      long_texts: "truncate" (one row per sentence) or "windows" (one row per window, see
        `window_tag_features` and `windows.window_pipeline`).
      doc_stride: pieces between window starts (None: half a window).
      options: the `input_utils.PipelineOptions` (or their fields as keyword arguments:
        batch_size, is_training, ...); see `input_utils.batch_pipeline`.

    Returns:
      Dataset of dicts: ENCODER_INPUTS and LABEL_IDS, int32 [batch, seq_length]; with
      windows, evaluation rows also carry the `windows.EVAL_KEYS`.
    """
    options = input_utils.pipeline_options(options, **fields)
    if long_texts == "windows":
        def to_rows(batch):
            return window_tag_features(tokenizer, batch["tokens"], batch.get("tags"),
                                       seq_length, doc_stride=doc_stride,
                                       example_index=batch[windows.EXAMPLE_INDEX])

        return windows.window_pipeline(raw, to_rows, options, ragged=True)

    def featurize(batch):
        return tag_features(tokenizer, batch["tokens"], batch.get("tags"), seq_length,
                            with_cut=True)

    return input_utils.batch_pipeline(raw, featurize, options, ragged=True)


def count_windows(raw: tf.data.Dataset, tokenizer, *, seq_length: int,
                  doc_stride: int | None = None) -> tuple[int, int]:
    """(sentences, windows) of raw tagging examples at `seq_length` (tokenizes them once)."""
    return windows.count_rows(raw, lambda batch: window_tag_features(
        tokenizer, batch["tokens"], batch.get("tags"), seq_length, doc_stride=doc_stride),
        ragged=True)


def word_predictions(predicted_ids, label_ids, label_names, num_words=None) -> list[list[str]]:
    """Per-token predictions back to one tag per word.

    Args:
      predicted_ids: int [batch, seq_length] predicted tag ids (argmax of the logits).
      label_ids: int [batch, seq_length] the batch's `features.LABEL_IDS`; its non-ignored
        positions are the first pieces of the words, in word order.
      label_names: tags in id order.
      num_words: optional [batch] word counts; words cut by truncation are tagged "O".

    Returns:
      One list of tag strings per sentence.
    """
    predicted_ids, label_ids = np.asarray(predicted_ids), np.asarray(label_ids)
    if predicted_ids.shape != label_ids.shape:
        raise ValueError(f"predicted_ids {predicted_ids.shape} and label_ids {label_ids.shape} "
                         "must have the same shape")
    out = []
    for i, (pred, labels) in enumerate(zip(predicted_ids, label_ids, strict=True)):
        tags = [label_names[p] for p in pred[labels != features.IGNORE_LABEL]]
        if num_words is not None:
            tags += [OUTSIDE] * (int(num_words[i]) - len(tags))
        out.append(tags)
    return out
