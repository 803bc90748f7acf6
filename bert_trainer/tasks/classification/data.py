"""Sentence (pair) classification and regression input pipeline, tokenized in graph.

Raw examples {"text", ["text_b"], ["label"]} (`TaskData.load`) are batched first and then
tokenized and packed as a batch (`[CLS] A [SEP] (B [SEP])`, the longer segment trimmed
first), so tensorflow-text runs vectorized inside `tf.data`.

Texts longer than `seq_length` are either truncated (`text_features`: the first pieces, or
with `head_tail` the first quarter of the room and the last three quarters, Sun et al. 2019)
or cut into windows (`window_features`, see `data/windows.py`): one row per window, each with
its text's label.
A pair keeps its first text (at least half the row when both are long, all of it when the
second is short) in every window and windows the second, as SQuAD windows the context
behind its question.

No silent truncation: the batches of `classification_dataset` carry CUT, 1 for a
text (pair) that lost pieces: truncated, or a pair whose first text was cut to leave room for
the second's windows (marked on its first window only, so a sum counts texts). The task counts
them (the `cut_texts` metric) and the serving signature returns `truncated` per text.
"""

import tensorflow as tf

from bert_trainer import features
from bert_trainer.data import input_utils, windows

CUT = "cut"  # int32 [rows]: 1 when the row's text (pair) lost pieces to fit (counted)


def head_and_tail(pieces: tf.RaggedTensor, room: int) -> tf.RaggedTensor:
    """Each row of `pieces` cut to `room`: a longer row keeps its first `room // 4` pieces and
    its last `room - room // 4` (Sun et al. 2019, "How to Fine-Tune BERT for Text
    Classification?": the head and the tail, 128 and 382 of 510 pieces, read IMDB best)."""
    head = room // 4
    lengths = pieces.row_lengths()
    position = tf.ragged.range(lengths)  # (b, (pieces))
    long = tf.expand_dims(lengths > room, 1)
    drop = long & (position >= head) & (position < tf.expand_dims(lengths - (room - head), 1))
    return tf.ragged.boolean_mask(pieces, ~drop)


def text_features(tokenizer, batch: dict, seq_length: int, *, regression: bool = False,
                  with_cut: bool = False, head_tail: bool = False,
                  pad_to_longest: bool = False) -> dict:
    """Encoder inputs (and labels) of a batch of raw classification examples.

    Args:
      tokenizer: a `bert_trainer.data.tokenizer.Tokenizer`.
      batch: "text" string [batch], optionally "text_b" string [batch] and "label" [batch].
      seq_length: packed sequence length.
      regression: labels are float scores rather than class ids.
      with_cut: add CUT (which texts `pack` truncates).
      head_tail: a single text longer than the row keeps its head and tail
        (`head_and_tail`) instead of its first pieces.
      pad_to_longest: pad to the batch's longest row, not to `seq_length` (`Tokenizer.pack`).

    Returns:
      features.ENCODER_INPUTS int32 [batch, seq_length]; features.LABEL_IDS [batch], int32 for
      classes or float32 for regression, when the batch has labels; CUT int32 [batch].
    """
    segments = [tokenizer.tokenize(batch["text"])]
    if "text_b" in batch:
        if head_tail:
            raise ValueError("head_tail reads single texts, not pairs")
        segments.append(tokenizer.tokenize(batch["text_b"]))
    pack = segments
    if head_tail:  # `pack` then trims nothing; CUT still counts the texts that lost pieces
        pack = [head_and_tail(segments[0], seq_length - 2)]
    inputs = tokenizer.pack(pack, seq_length, pad_to_longest=pad_to_longest)
    if with_cut:
        pieces = tf.add_n([s.row_lengths() for s in segments])
        inputs[CUT] = tf.cast(pieces > seq_length - 1 - len(segments), tf.int32)
    if "label" in batch:
        dtype = tf.float32 if regression else tf.int32
        inputs[features.LABEL_IDS] = tf.cast(batch["label"], dtype)
    return inputs


def _keep_first(pieces: tf.RaggedTensor, keep) -> tf.RaggedTensor:
    """The first `keep[i]` pieces of row i."""
    return tf.ragged.boolean_mask(
        pieces, tf.ragged.range(pieces.row_lengths()) < tf.expand_dims(keep, 1))


def window_features(tokenizer, batch: dict, seq_length: int, *, doc_stride: int | None = None,
                    regression: bool = False, with_cut: bool = False,
                    pad_to_longest: bool = False) -> dict:
    """Encoder inputs (and labels) of every window of a batch of raw classification examples.

    A text that fits is one window, equal to its `text_features` row. A pair keeps
    `min(len(A), max(room - len(B), room // 2))` pieces of its first text (room:
    `seq_length - 3`), which is what truncation keeps whenever B fits, and windows B over
    the rest of the row.

    Args:
      tokenizer: a `bert_trainer.data.tokenizer.Tokenizer`.
      batch: as for `text_features`, optionally with windows.EXAMPLE_INDEX int [batch].
      seq_length: packed sequence length.
      doc_stride: pieces between window starts (None: half a window).
      regression: labels are float scores rather than class ids.
      with_cut: add CUT (a pair's first text was cut; on the text's first window only).
      pad_to_longest: pad to the longest window, not to `seq_length` (`Tokenizer.pack`).

    Returns:
      features.ENCODER_INPUTS int32 [W, seq_length] over the W windows, text after text;
      LABEL_IDS [W] when the batch has labels; windows.EXAMPLE_INDEX, NUM_WINDOWS and
      WINDOW_START int32 [W]; CUT int32 [W].
    """
    first = tokenizer.tokenize(batch["text"])  # (b, (pieces))
    cut_first = tf.zeros_like(first.row_lengths(), tf.bool)  # One text is windowed, never cut.
    if "text_b" in batch:
        second = tokenizer.tokenize(batch["text_b"])
        room = seq_length - 3
        keep = tf.minimum(first.row_lengths(),
                          tf.maximum(room - second.row_lengths(), room // 2))  # (b,)
        cut_first = keep < first.row_lengths()
        first = _keep_first(first, keep)
        cut = windows.cut(second.row_lengths(), room - keep, doc_stride)
        segments = [tf.gather(first, cut.example), windows.gather(second, cut)]
    else:
        cut = windows.cut(first.row_lengths(), seq_length - 2, doc_stride)
        segments = [windows.gather(first, cut)]
    # Every window fits: nothing is trimmed.
    inputs = tokenizer.pack(segments, seq_length, pad_to_longest=pad_to_longest)
    inputs.update(windows.row_features(cut, batch.get(windows.EXAMPLE_INDEX)))
    if with_cut:
        inputs[CUT] = tf.cast(tf.gather(cut_first, cut.example) & tf.equal(cut.start, 0),
                              tf.int32)
    if "label" in batch:
        dtype = tf.float32 if regression else tf.int32
        inputs[features.LABEL_IDS] = tf.gather(tf.cast(batch["label"], dtype), cut.example)
    return inputs


def classification_dataset(raw: tf.data.Dataset, tokenizer, *, seq_length: int,
                           regression: bool = False, long_texts: str = "truncate",
                           doc_stride: int | None = None,
                           options: input_utils.PipelineOptions | None = None,
                           **fields) -> tf.data.Dataset:
    """Batches of a classification (or regression) task.

    Args:
      raw: unbatched raw examples from `TaskData.load`.
      tokenizer: a `Tokenizer`.
      seq_length: packed sequence length.
      regression: float32 labels (STS-B).
      long_texts: "truncate" or "head_tail" (one row per example, see `text_features`) or
        "windows" (one row per window, see `window_features` and `windows.window_pipeline`).
      doc_stride: pieces between window starts (None: half a window).
      options: the `input_utils.PipelineOptions` (or their fields as keyword arguments:
        batch_size, is_training, ...); see `input_utils.batch_pipeline`.

    Returns:
      Dataset of dicts: ENCODER_INPUTS int32 [batch, seq_length], LABEL_IDS [batch], CUT; with
      windows, evaluation rows also carry windows.EXAMPLE_INDEX, NUM_WINDOWS, WINDOW_START.
    """
    options = input_utils.pipeline_options(options, **fields)
    if long_texts == "windows":
        def to_rows(batch):
            return window_features(tokenizer, batch, seq_length, doc_stride=doc_stride,
                                   regression=regression, with_cut=True)

        return windows.window_pipeline(raw, to_rows, options)

    def featurize(batch):
        return text_features(tokenizer, batch, seq_length, regression=regression,
                             with_cut=True, head_tail=long_texts == "head_tail")

    return input_utils.batch_pipeline(raw, featurize, options)


def count_windows(raw: tf.data.Dataset, tokenizer, *, seq_length: int,
                  doc_stride: int | None = None) -> tuple[int, int]:
    """(examples, windows) of raw examples at `seq_length` (tokenizes them once)."""
    return windows.count_rows(raw, lambda batch: window_features(
        tokenizer, batch, seq_length, doc_stride=doc_stride))
