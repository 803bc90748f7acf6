"""SQuAD v1.1 / v2.0 input pipeline: doc-stride windows, and logits back to answer text.

Windowing is host-side Python/numpy, as in google-research/bert: each context's word pieces
are cut into windows of `seq_length - len(question) - 3` pieces that start `doc_stride` pieces
apart, and each window becomes `[CLS] question [SEP] context-window [SEP]`. Tokenization runs
in tensorflow-text on chunks of examples (one call per chunk, not per example).

Unlike google-research/bert, which maps tokens to whitespace words and re-aligns the
predicted text heuristically, every context piece keeps its character span in the original
context (the tokenizer's byte offsets, converted to characters), so a predicted span
(start piece, end piece) is exactly `context[start_char:end_char]`.

Labels: the pieces of the first answer that is whole pieces (see `_answer_pieces`); windows
without it point at [CLS] (0, 0) for v2.0 and are dropped from v1.1 training; unanswerable
v2.0 questions point at [CLS]. Training windows stream lazily (generator →
`tf.data.Dataset.from_generator`); evaluation keeps its examples and windows (`SquadFeature`)
host-side for `postprocess_squad`.
"""

import collections
import dataclasses
import itertools
import re
import weakref
from collections.abc import Iterable, Iterator

import numpy as np
import tensorflow as tf
from absl import logging

from bert_trainer import features as feature_names
from bert_trainer.data import input_utils
from bert_trainer.errors import UserError

UNIQUE_IDS = "unique_ids"  # int32 [batch]: index of the window in the eval feature list.
CUT = "cut"  # int32 [batch]: 1 on the first window of a question cut to max_query_length
_CHUNK = 128  # Examples tokenized per tensorflow-text call.
_GRAPHS = weakref.WeakKeyDictionary()  # Tokenizer → its traced tokenize functions.


@dataclasses.dataclass
class SquadExample:
    """One question, host side.

    Attributes:
      id: question id; context: the paragraph; question: the question text.
      answer_texts, answer_starts: gold answers and their character offsets in `context`.
      is_impossible: SQuAD v2.0 question without an answer.
    """

    id: str
    question: str
    context: str
    answer_texts: list
    answer_starts: list
    is_impossible: bool = False


@dataclasses.dataclass
class SquadFeature:
    """One window of one example, host side.

    Attributes:
      unique_id: position of the window among all windows produced (the `UNIQUE_IDS` feature).
      example_index, example_id: position of its example in the example list, and its id.
      window_index: which window of the example (0, 1, ...).
      inputs: features.ENCODER_INPUTS → int32 [seq_length].
      char_spans: int32 [seq_length, 2] (start, end) character span in the context of each
        context piece; (-1, -1) for [CLS], question, [SEP] and padding.
      is_max_context: bool [seq_length]: this window gives the piece its most context.
      start_position, end_position: gold answer pieces in the window, or 0 ([CLS]).
      answer_index: which of the example's answers the positions refer to (-1: none).
    """

    unique_id: int
    example_index: int
    example_id: str
    window_index: int
    inputs: dict
    char_spans: np.ndarray
    is_max_context: np.ndarray
    start_position: int = 0
    end_position: int = 0
    answer_index: int = -1
    question_cut: bool = False  # the question lost pieces to max_query_length (counted)


def squad_examples(raw: tf.data.Dataset) -> Iterator[SquadExample]:
    """Host-side examples of raw SQuAD dicts (`TaskData.load` of a squad task).

    Reads `_CHUNK` examples per step: one tf.data element costs about a millisecond in
    Python, a batch of them hardly more.
    """
    as_list = lambda t: t.to_list() if isinstance(t, tf.RaggedTensor) else t.numpy().tolist()
    for batch in raw.ragged_batch(_CHUNK):
        texts = as_list(batch["answers"]["text"])
        starts = as_list(batch["answers"]["answer_start"])
        columns = [batch[k].numpy() for k in ("id", "question", "context", "is_impossible")]
        for i, (qid, question, context, impossible) in enumerate(zip(*columns, strict=True)):
            yield SquadExample(
                id=qid.decode(), question=question.decode("utf-8"),
                context=context.decode("utf-8"), answer_texts=[t.decode("utf-8") for t in
                                                               texts[i]],
                answer_starts=[int(s) for s in starts[i]], is_impossible=bool(impossible))


def _rows(ragged) -> list[np.ndarray]:
    values, splits = ragged.flat_values.numpy(), ragged.row_splits.numpy()
    return [values[a:b] for a, b in zip(splits[:-1], splits[1:], strict=True)]


def _byte_to_char(text: str, byte_offsets: np.ndarray) -> np.ndarray:
    """Character offsets of UTF-8 byte offsets that fall on character boundaries."""
    if text.isascii():
        return byte_offsets
    char_bytes = np.fromiter((len(c.encode("utf-8")) for c in text), np.int64, len(text))
    boundaries = np.concatenate([[0], np.cumsum(char_bytes)])
    return np.searchsorted(boundaries, byte_offsets)


def _graph_functions(tokenizer):
    """`tokenize_with_offsets` and `tokenize` as traced graphs, traced once per tokenizer.

    Eager tensorflow-text runs op by op, many times slower per call than its graph; tracing
    costs seconds, so the graphs are kept for the tokenizer's lifetime (every epoch reuses).
    """
    if tokenizer not in _GRAPHS:
        strings = [tf.TensorSpec([None], tf.string)]
        _GRAPHS[tokenizer] = tuple(
            tf.function(fn, input_signature=strings, autograph=False)
            for fn in (tokenizer.tokenize_with_offsets, tokenizer.tokenize))
    return _GRAPHS[tokenizer]


def _tokenized(examples: Iterable[SquadExample], tokenizer, max_query_length: int):
    """Yields (example, question ids, context ids, char starts, char ends, question cut),
    chunk by chunk."""
    with_offsets, tokenize = _graph_functions(tokenizer)
    it = iter(examples)
    while chunk := list(itertools.islice(it, _CHUNK)):
        contexts = list(dict.fromkeys(ex.context for ex in chunk))  # Shared paragraphs once.
        ids, starts, ends = with_offsets(tf.constant(contexts))
        tokenized = {}
        for text, i, s, e in zip(contexts, _rows(ids), _rows(starts), _rows(ends), strict=True):
            tokenized[text] = (i, _byte_to_char(text, s), _byte_to_char(text, e))
        questions = _rows(tokenize(tf.constant([ex.question for ex in chunk])))
        for ex, q in zip(chunk, questions, strict=True):
            yield (ex, q[:max_query_length], *tokenized[ex.context], len(q) > max_query_length)


def _window_starts(num_pieces: int, max_pieces: int, doc_stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window over `num_pieces` context pieces."""
    spans, start = [], 0
    while True:
        length = min(num_pieces - start, max_pieces)
        spans.append((start, length))
        if start + length >= num_pieces:
            return spans
        start += min(length, doc_stride)


def _max_context(spans, num_pieces: int) -> np.ndarray:
    """Index of the window giving each piece its most context (google-research/bert's score)."""
    best, best_score = np.zeros(num_pieces, np.int64), np.full(num_pieces, -np.inf)
    for w, (start, length) in enumerate(spans):
        pos = np.arange(start, start + length)
        score = np.minimum(pos - start, start + length - 1 - pos) + 0.01 * length
        better = score > best_score[pos]  # Strict: ties keep the earlier window.
        best[pos[better]], best_score[pos[better]] = w, score[better]
    return best


def _exact_pieces(begin: int, end: int, starts: np.ndarray, ends: np.ndarray):
    """(first, last) pieces spanning exactly characters [begin, end), or None."""
    first = int(np.searchsorted(starts, begin))
    last = int(np.searchsorted(ends, end))
    if first <= last < len(ends) and starts[first] == begin and ends[last] == end:
        return first, last
    return None


def _answer_pieces(ex: SquadExample, starts: np.ndarray, ends: np.ndarray):
    """(answer index, first piece, last piece) of the answer to learn, or None.

    Some SQuAD `answer_start`s point inside another word ("5" at the "5" of "50", "L" inside
    "NFL"): the pieces covering them spell a different text ("50"), which a model could then
    never get exactly right. So the label is the first answer that is whole pieces at its
    own offset; else the first answer whose text occurs elsewhere as whole pieces (the nearest
    occurrence); else the pieces covering the first answer.
    """
    answers = list(enumerate(zip(ex.answer_starts, ex.answer_texts, strict=True)))
    for index, (begin, text) in answers:
        exact = _exact_pieces(begin, begin + len(text), starts, ends)
        if exact is not None:
            return index, *exact
    for index, (begin, text) in answers:
        found = [m.start() for m in re.finditer(re.escape(text), ex.context) if text]
        for i in sorted(found, key=lambda i: abs(i - begin)):
            exact = _exact_pieces(i, i + len(text), starts, ends)
            if exact is not None:
                return index, *exact
    begin, text = ex.answer_starts[0], ex.answer_texts[0]
    first = int(np.searchsorted(ends, begin, side="right"))  # First piece ending after begin.
    last = int(np.searchsorted(starts, begin + len(text))) - 1  # Last piece starting before end.
    if first > last or first >= len(starts) or last < 0:
        return None
    return 0, first, last


def _window(tokenizer, question, ids, starts, ends, span, seq_length) -> tuple[dict, np.ndarray]:
    """Inputs and per-position char spans of `[CLS] question [SEP] window [SEP]`."""
    start, length = span
    offset = len(question) + 2
    word_ids = np.full(seq_length, tokenizer.pad_id, np.int32)
    word_ids[:offset + length + 1] = np.concatenate([
        [tokenizer.cls_id], question, [tokenizer.sep_id], ids[start:start + length],
        [tokenizer.sep_id]])
    mask = (np.arange(seq_length) < offset + length + 1).astype(np.int32)
    type_ids = ((np.arange(seq_length) >= offset) & (mask == 1)).astype(np.int32)
    char_spans = np.full((seq_length, 2), -1, np.int32)
    char_spans[offset:offset + length, 0] = starts[start:start + length]
    char_spans[offset:offset + length, 1] = ends[start:start + length]
    inputs = {feature_names.INPUT_WORD_IDS: word_ids, feature_names.INPUT_MASK: mask,
              feature_names.INPUT_TYPE_IDS: type_ids}
    return inputs, char_spans


def _example_windows(tokenizer, example_index, item, *, seq_length, doc_stride, is_training,
                     version_2, skipped):
    """The `SquadFeature`s (unique_id unset) of one tokenized example."""
    ex, question, ids, starts, ends, question_cut = item
    answerable = bool(ex.answer_texts) and not ex.is_impossible
    gold = _answer_pieces(ex, starts, ends) if answerable else None
    if is_training and gold is None and not (version_2 and ex.is_impossible):
        skipped["unanswerable"] += 1  # v1.1 without a usable answer: nothing to learn.
        return
    max_pieces = seq_length - len(question) - 3
    spans = _window_starts(len(ids), max_pieces, doc_stride)
    best = _max_context(spans, len(ids))
    offset = len(question) + 2
    for w, (start, length) in enumerate(spans):
        inputs, char_spans = _window(tokenizer, question, ids, starts, ends, (start, length),
                                     seq_length)
        is_max = np.zeros(seq_length, bool)
        is_max[offset:offset + length] = best[start:start + length] == w
        label = (0, 0, -1)
        if gold is not None and start <= gold[1] and gold[2] < start + length:
            label = (gold[1] - start + offset, gold[2] - start + offset, gold[0])
        elif is_training and not version_2:
            continue  # google-research/bert drops v1.1 windows that miss the answer.
        yield SquadFeature(-1, example_index, ex.id, w, inputs, char_spans, is_max, *label,
                           question_cut=question_cut)


def squad_windows(examples: Iterable[SquadExample], tokenizer, *, seq_length: int = 384,
                  doc_stride: int = 128, max_query_length: int = 64, is_training: bool,
                  version_2: bool = False) -> Iterator[SquadFeature]:
    """Lazily cuts examples into windows (see the module docstring for the labels).

    Args:
      examples: host-side examples, e.g. `squad_examples(raw)`.
      tokenizer: a `Tokenizer`.
      seq_length: packed length of a window.
      doc_stride: pieces between the starts of consecutive windows.
      max_query_length: question pieces kept.
      is_training: drop what cannot be learned (v1.1 windows without the answer).
      version_2: SQuAD v2.0 (unanswerable questions point at [CLS]).

    Yields:
      `SquadFeature`s with `unique_id` 0, 1, 2, ... in order.
    """
    if max_query_length < 1 or seq_length < max_query_length + 4:
        raise UserError(f"seq_length={seq_length} must exceed max_query_length="
                        f"{max_query_length} + 3 and max_query_length must be >= 1")
    if doc_stride < 1:
        raise UserError(f"doc_stride={doc_stride} must be >= 1")
    skipped = collections.Counter()
    unique_id = 0
    items = _tokenized(examples, tokenizer, max_query_length)
    for example_index, item in enumerate(items):
        for feature in _example_windows(tokenizer, example_index, item, seq_length=seq_length,
                                        doc_stride=doc_stride, is_training=is_training,
                                        version_2=version_2, skipped=skipped):
            feature.unique_id = unique_id
            unique_id += 1
            yield feature
    if skipped:
        logging.warning("SQuAD: skipped %d training questions without a usable answer",
                        skipped["unanswerable"])


def _feature_dict(feature: SquadFeature, with_unique_id: bool) -> dict:
    out = dict(feature.inputs)
    out[feature_names.START_POSITIONS] = np.int32(feature.start_position)
    out[feature_names.END_POSITIONS] = np.int32(feature.end_position)
    out[CUT] = np.int32(feature.question_cut and feature.window_index == 0)  # once a question
    if with_unique_id:
        out[UNIQUE_IDS] = np.int32(feature.unique_id)
    return out


def _signature(seq_length: int, with_unique_id: bool) -> dict:
    scalars = [feature_names.START_POSITIONS, feature_names.END_POSITIONS, CUT]
    scalars += [UNIQUE_IDS] if with_unique_id else []
    spec = {k: tf.TensorSpec([seq_length], tf.int32) for k in feature_names.ENCODER_INPUTS}
    return spec | {k: tf.TensorSpec([], tf.int32) for k in scalars}


def squad_dataset(raw: tf.data.Dataset, tokenizer, *, seq_length: int = 384,
                  doc_stride: int = 128, max_query_length: int = 64, version_2: bool = False,
                  options: input_utils.PipelineOptions | None = None,
                  **fields) -> tf.data.Dataset:
    """Streaming batches of SQuAD windows (training; evaluation uses `squad_eval_data`).

    Examples are sharded by the options' `input_context` before windowing, so each input
    pipeline tokenizes only its share. Each pass over the data re-runs the generator lazily.

    Args:
      raw: raw SQuAD examples from `TaskData.load`.
      tokenizer: a `Tokenizer`.
      seq_length, doc_stride, max_query_length, version_2: see `squad_windows`.
      options: the `input_utils.PipelineOptions` (or their fields as keyword arguments:
        batch_size, is_training, ...; see `input_utils.batch_pipeline`). Training: training
        labels, shuffle, repeat, drop the remainder; otherwise every window once, in order,
        with `UNIQUE_IDS`.

    Returns:
      Dataset of dicts: ENCODER_INPUTS int32 [batch, seq_length], START_POSITIONS and
      END_POSITIONS int32 [batch] (and UNIQUE_IDS int32 [batch] when not training).
    """
    options = input_utils.pipeline_options(options, **fields)
    is_training = options.is_training
    raw = input_utils.shard(raw, options.input_context)
    window_options = dict(seq_length=seq_length, doc_stride=doc_stride,
                          max_query_length=max_query_length, is_training=is_training,
                          version_2=version_2)

    def generate():  # Stacks of windows: from_generator costs ~1 ms per element.
        windows = squad_windows(squad_examples(raw), tokenizer, **window_options)
        while chunk := list(itertools.islice(windows, _CHUNK)):
            dicts = [_feature_dict(w, with_unique_id=not is_training) for w in chunk]
            yield {k: np.stack([d[k] for d in dicts]) for k in dicts[0]}

    signature = {k: tf.TensorSpec([None, *spec.shape], spec.dtype)
                 for k, spec in _signature(seq_length, not is_training).items()}
    windows = tf.data.Dataset.from_generator(generate, output_signature=signature).unbatch()
    # Sharded above, by example: the windows are not sharded again.
    return input_utils.batch_pipeline(windows, None,
                                      dataclasses.replace(options, input_context=None))


@dataclasses.dataclass
class SquadEvalData:
    """Evaluation batches with the host-side examples and windows `postprocess_squad` needs."""

    dataset: tf.data.Dataset
    examples: list
    features: list


def squad_eval_data(raw: tf.data.Dataset, tokenizer, *, seq_length: int = 384,
                    doc_stride: int = 128, max_query_length: int = 64, version_2: bool = False,
                    options: input_utils.PipelineOptions | None = None,
                    **fields) -> SquadEvalData:
    """Every window of an evaluation split, in order, plus its examples and windows.

    Args:
      raw: raw SQuAD examples from `TaskData.load`.
      tokenizer: a `Tokenizer`.
      seq_length, doc_stride, max_query_length, version_2: see `squad_windows`.
      options: the `input_utils.PipelineOptions` (or their fields as keyword arguments) of
        its batch_size (the last batch may be smaller), input_context (shard the examples;
        the lists then hold this pipeline's share) and length_buckets; it reads as an
        evaluation (in order, every window once) whatever their is_training says.

    Returns:
      `SquadEvalData`; batches carry UNIQUE_IDS (index into `features`) and gold positions.
    """
    options = input_utils.pipeline_options(options, **fields)
    examples = list(squad_examples(input_utils.shard(raw, options.input_context)))
    windows = list(squad_windows(examples, tokenizer, seq_length=seq_length,
                                 doc_stride=doc_stride, max_query_length=max_query_length,
                                 is_training=False, version_2=version_2))
    if not windows:
        raise UserError("the SQuAD evaluation data holds no questions; check the eval split/file")
    dicts = [_feature_dict(w, with_unique_id=True) for w in windows]
    stacked = {k: np.stack([d[k] for d in dicts]) for k in dicts[0]}
    dataset = input_utils.batch_pipeline(
        tf.data.Dataset.from_tensor_slices(stacked), None, input_utils.PipelineOptions(
            batch_size=options.batch_size, is_training=False, deterministic=True,
            length_buckets=options.length_buckets))
    return SquadEvalData(dataset, examples, windows)


# Kept importable from here: tasks and exports call `squad_data.postprocess_squad`.
from bert_trainer.tasks.squad.postprocess import postprocess_squad  # noqa: E402, F401
