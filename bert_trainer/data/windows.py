"""Texts longer than the model's positions: sliding windows over word pieces, and back.

A text of `n` word pieces that does not fit the `room` pieces a packed row has for it
(`seq_length` minus [CLS] and [SEP]) is cut into windows of `room` pieces that start
`stride` pieces apart: 0, stride, 2 * stride, ... until a window reaches the text's end (it
may be shorter). This is SQuAD's `doc_stride` rule (`squad_data._window_starts`), so every
piece lies in at least one window, and a text that fits is one window equal to the truncated
row. The stride defaults to half the room, so every piece away from the text's ends sees at
least a quarter of a window of context on each side.

Windows come back together in two ways:
- a label of the whole text (classification, regression): the mean (or the max) of its
  windows' logits, class by class (`pool`, in graph; `pool_eval`, on the host);
- a label per piece (tagging): each piece takes its prediction from the window where it has
  the most context on both sides, google-research/bert's `_check_is_max_context` score
  `min(left, right) + 0.01 * window length`, ties to the earlier window (`max_context`).

Everything in graph uses TensorFlow and tensorflow-text ops only, so an exported SavedModel
windows texts by itself.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from bert_trainer import features
from bert_trainer.data import input_utils
from bert_trainer.errors import UserError

# Row features besides the encoder inputs and labels (evaluation only).
EXAMPLE_INDEX = "example_index"    # int32 [rows]: the row's text, numbered from 0 in the split
NUM_WINDOWS = "num_windows"        # int32 [rows]: how many windows the row's text has
WINDOW_START = "window_start"      # int32 [rows]: the text's piece at the row's first piece
IS_MAX_CONTEXT = "is_max_context"  # bool [rows, seq]: the row gives this piece its most context
EVAL_KEYS = (EXAMPLE_INDEX, NUM_WINDOWS, WINDOW_START, IS_MAX_CONTEXT)
LONG_TEXTS = ("windows", "truncate", "head_tail")  # head_tail: classification only
POOLINGS = ("mean", "max")
# What a model directory's bert_train.json "task" entry records, and the value of a
# directory written before texts were windowed (the defaults of FinetuneConfig).
OPTIONS = {"long_texts": "windows", "doc_stride": None, "window_pooling": "mean"}
_CHUNK = 64  # Texts tokenized and windowed per tensorflow-text call.


def check_options(long_texts: str = "windows", doc_stride: int | None = None,
                  window_pooling: str = "mean") -> None:
    """Refuses an unknown mode, a stride below 1 or an unknown pooling, as one line naming
    the FinetuneConfig field (the flags bind those).

    Raises:
      UserError: the bad value and the allowed ones.
    """
    if long_texts not in LONG_TEXTS:
        raise UserError(f"FinetuneConfig.long_texts={long_texts!r} is unknown; use one of "
                        f"{', '.join(LONG_TEXTS)}")
    if doc_stride is not None and (isinstance(doc_stride, bool) or not isinstance(doc_stride, int)
                                   or doc_stride < 1):
        raise UserError(f"FinetuneConfig.doc_stride={doc_stride!r} must be an integer >= 1 "
                        "(pieces between window starts; None: half a window)")
    if window_pooling not in POOLINGS:
        raise UserError(f"FinetuneConfig.window_pooling={window_pooling!r} is unknown; use one "
                        f"of {', '.join(POOLINGS)}")


def config_options(config) -> dict:
    """The windowing fields of a `FinetuneConfig`, checked (`OPTIONS`' keys)."""
    options = {name: getattr(config, name) for name in OPTIONS}
    check_options(**options)
    return options


def stored_options(task: dict | None) -> dict:
    """The windowing options a model directory's task entry records (defaults if none)."""
    stored = (task or {}).get("windows") or {}
    return {name: stored.get(name, default) for name, default in OPTIONS.items()}


@dataclasses.dataclass
class Windows:
    """Where the windows of a batch of texts lie.

    Attributes:
      example: int64 [W] the text of each window (non-decreasing).
      start: int64 [W] the window's first piece in its text.
      length: int64 [W] the window's pieces.
      num_windows: int64 [b] windows per text (>= 1: an empty text is one empty window).
    """

    example: tf.Tensor
    start: tf.Tensor
    length: tf.Tensor
    num_windows: tf.Tensor


def cut(num_pieces, room, doc_stride: int | None = None) -> Windows:
    """The windows of texts of `num_pieces` pieces (see the module docstring).

    Args:
      num_pieces: int [b] pieces per text.
      room: int scalar or [b]: pieces a window holds (>= 0).
      doc_stride: pieces between window starts; None: half the room. A stride above the room
        counts as the room (no piece is skipped).

    Returns:
      `Windows`.
    """
    num = tf.cast(num_pieces, tf.int64)
    room = tf.broadcast_to(tf.cast(room, tf.int64), tf.shape(num))
    stride = room // 2 if doc_stride is None else tf.constant(int(doc_stride), tf.int64)
    step = tf.maximum(tf.minimum(room, stride), 1)  # (b,)
    count = 1 + (tf.maximum(num - room, 0) + step - 1) // step  # ceil
    example = tf.repeat(tf.range(tf.size(num, out_type=tf.int64)), count)  # (W,)
    start = tf.ragged.range(count).flat_values * tf.gather(step, example)
    length = tf.minimum(tf.gather(num, example) - start, tf.gather(room, example))
    return Windows(example, start, length, count)


def positions(values: tf.RaggedTensor, windows: Windows) -> tf.RaggedTensor:
    """int64 [W, (length)]: each window's pieces as indices into `values.flat_values`.

    Args:
      values: RaggedTensor [b, (pieces)] the windows were cut from.
      windows: from `cut`.
    """
    offset = tf.gather(values.row_starts(), windows.example)
    return (tf.ragged.range(windows.start, windows.start + windows.length)
            + tf.expand_dims(offset, 1))


def gather(values: tf.RaggedTensor, windows: Windows) -> tf.RaggedTensor:
    """The pieces of each window.

    Args:
      values: RaggedTensor [b, (pieces)] (ids, labels, offsets: anything per piece).
      windows: from `cut` over `values.row_lengths()`.

    Returns:
      RaggedTensor [W, (length)] of `values`' dtype.
    """
    return tf.gather(values.flat_values, positions(values, windows))


def max_context(values: tf.RaggedTensor, windows: Windows) -> tf.RaggedTensor:
    """Whether each window gives each of its pieces the most context of all its windows.

    Args:
      values: RaggedTensor [b, (pieces)] the windows were cut from (only its shape is read).
      windows: from `cut`.

    Returns:
      bool RaggedTensor [W, (length)]; exactly one True per piece of every text.
    """
    pieces = positions(values, windows)  # (W, (length)) text-batch-wide piece ids
    lengths = windows.length
    j = tf.ragged.range(lengths)  # (W, (length)) position in the window
    # google-research/bert's score, in float64 as squad_data computes it, so ties agree.
    score = (tf.cast(tf.minimum(j, tf.expand_dims(lengths, 1) - 1 - j), tf.float64)
             + 0.01 * tf.cast(tf.expand_dims(lengths, 1), tf.float64))
    ids, window = pieces.flat_values, pieces.value_rowids()
    num_ids = tf.size(values.flat_values, out_type=tf.int64)
    best = tf.math.unsorted_segment_max(score.flat_values, ids, num_ids)
    never = tf.size(lengths, out_type=tf.int64)
    candidate = tf.where(tf.equal(score.flat_values, tf.gather(best, ids)), window, never)
    first_best = tf.math.unsorted_segment_min(candidate, ids, num_ids)  # Ties: earlier window.
    return pieces.with_flat_values(tf.equal(tf.gather(first_best, ids), window))


def pool(logits: tf.Tensor, example: tf.Tensor, num_examples, pooling: str = "mean"):
    """Per-text logits from per-window logits, class by class.

    Args:
      logits: float [W, C].
      example: int [W] the text of each window; every text has at least one window.
      num_examples: int scalar, the number of texts b.
      pooling: "mean" or "max".

    Returns:
      float [b, C].
    """
    if pooling == "max":
        return tf.math.unsorted_segment_max(logits, example, num_examples)
    return tf.math.unsorted_segment_mean(logits, example, num_examples)


def row_features(windows: Windows, example_index=None) -> dict:
    """EXAMPLE_INDEX, NUM_WINDOWS and WINDOW_START int32 [W] of a batch's windows.

    Args:
      windows: from `cut`.
      example_index: int [b] the texts' numbers in their split; None: 0..b-1.
    """
    index = (windows.example if example_index is None
             else tf.gather(example_index, windows.example))
    return {EXAMPLE_INDEX: tf.cast(index, tf.int32),
            NUM_WINDOWS: tf.cast(tf.gather(windows.num_windows, windows.example), tf.int32),
            WINDOW_START: tf.cast(windows.start, tf.int32)}


def check_resume(model_dir: str, stored: dict | None, task: dict) -> None:
    """Refuses to resume a model_dir trained on other rows: another `long_texts` or
    `doc_stride` (the pooling only combines outputs, so it may change).

    Args:
      model_dir: the run's directory (named in the error).
      stored: the task entry its bert_train.json records (`model_dir.trained_task`); None for
        a fresh directory, and one that records no windowing (written before windows), passes.
      task: the task entry the new run would write (`task_info()`).

    Raises:
      UserError: naming the option, the stored value, the new one and the way out.
    """
    stored = (stored or {}).get("windows") or {}
    new = task.get("windows") or {}
    for name in ("long_texts", "doc_stride"):
        if name in stored and name in new and stored[name] != new[name]:
            raise UserError(f"--model_dir={model_dir} was trained with {name}={stored[name]!r}; "
                            f"this run asks for {name}={new[name]!r} (other training rows); use "
                            "another --model_dir (or the flags it was trained with)")


# -- tf.data ------------------------------------------------------------------------------


def _chunks(raw: tf.data.Dataset, *, ragged: bool, input_context=None) -> tf.data.Dataset:
    """The raw examples numbered (EXAMPLE_INDEX), sharded by example, in batches of _CHUNK."""
    def numbered(index, example):
        return {**example, EXAMPLE_INDEX: tf.cast(index, tf.int32)}

    examples = input_utils.shard(raw.enumerate().map(numbered), input_context)
    return examples.ragged_batch(_CHUNK) if ragged else examples.batch(_CHUNK)


def window_pipeline(raw: tf.data.Dataset, to_rows,
                    options: input_utils.PipelineOptions | None = None, *,
                    ragged: bool = False, **fields) -> tf.data.Dataset:
    """Batches of windows: every window of every text is one row.

    Texts are numbered, sharded (by text: all windows of a text stay in one input pipeline),
    tokenized and windowed in chunks, then the windows are shuffled and batched like any
    fine-tuning rows (`input_utils.batch_pipeline`), so a batch holds `batch_size` windows.

    Args:
      raw: unbatched raw examples.
      to_rows: a batch of raw examples (with EXAMPLE_INDEX) -> dict of [W, ...] window rows.
      options: the `input_utils.PipelineOptions` (or their fields as keyword arguments); its
        batch_size counts windows; training drops the evaluation keys (`EVAL_KEYS`) from the
        rows.
      ragged: `raw` has variable-length fields (word lists).

    Returns:
      Dataset of dicts of [batch, ...] tensors.
    """
    options = input_utils.pipeline_options(options, **fields)
    rows = _chunks(raw, ragged=ragged, input_context=options.input_context).map(
        to_rows, num_parallel_calls=input_utils.AUTOTUNE, deterministic=True).unbatch()
    if options.is_training:
        rows = rows.map(lambda row: {k: v for k, v in row.items() if k not in EVAL_KEYS})
    # Already sharded by text above: batch_pipeline must not shard the windows again.
    return input_utils.batch_pipeline(
        rows, lambda batch: batch, dataclasses.replace(options, input_context=None))


def count_rows(raw: tf.data.Dataset, to_rows, *, ragged: bool = False) -> tuple[int, int]:
    """(texts, windows) of a split: one pass of tokenization, no model.

    Args:
      raw: unbatched raw examples.
      to_rows, ragged: as for `window_pipeline`.
    """
    def sizes(batch):
        rows = to_rows(batch)
        return tf.stack([tf.shape(batch[EXAMPLE_INDEX], out_type=tf.int64)[0],
                         tf.shape(rows[features.INPUT_WORD_IDS], out_type=tf.int64)[0]])

    total = _chunks(raw, ragged=ragged).map(sizes, num_parallel_calls=input_utils.AUTOTUNE).reduce(
        tf.zeros([2], tf.int64), lambda a, b: a + b)
    texts, windows = (int(v) for v in total.numpy())
    return texts, windows


# -- host side (evaluation) ---------------------------------------------------------------


def complete_rows(example_index, num_windows) -> tuple[np.ndarray, list[np.ndarray]]:
    """The texts whose windows were all evaluated, and their rows.

    An evaluation cut short by `eval_steps` may end inside a text; such a text is left out
    rather than scored on part of its windows.

    Args:
      example_index, num_windows: int [rows] (`row_features`), gathered over an evaluation.

    Returns:
      (text numbers [texts] ascending, per text the indices of its rows in row order).
    """
    example_index = np.asarray(example_index).reshape(-1)
    num_windows = np.asarray(num_windows).reshape(-1)
    order = np.argsort(example_index, kind="stable")
    texts, first, counts = np.unique(example_index[order], return_index=True,
                                     return_counts=True)
    keep = counts == num_windows[order[first]]
    groups = np.split(order, first[1:])
    return texts[keep], [g for g, k in zip(groups, keep, strict=True) if k]


def pool_eval(logits, labels, example_index, num_windows, pooling: str = "mean"):
    """Per-text logits and labels of an evaluation's window rows (`pool` on the host).

    Args:
      logits: float [rows, C]; labels: [rows] (every window carries its text's label).
      example_index, num_windows: int [rows].
      pooling: "mean" or "max".

    Returns:
      (logits float32 [texts, C], labels [texts]) of the complete texts, in text order.
    """
    logits, labels = np.asarray(logits, np.float32), np.asarray(labels)
    _, groups = complete_rows(example_index, num_windows)
    if not groups:
        return np.zeros((0,) + logits.shape[1:], np.float32), labels[:0]
    reduce = np.max if pooling == "max" else np.mean
    pooled = np.stack([reduce(logits[g], axis=0) for g in groups]).astype(np.float32)
    return pooled, labels[[g[0] for g in groups]]


def merge_pieces(columns: dict, example_index, num_windows, window_start, is_max_context,
                 offset: int = 1) -> list[dict]:
    """Per-piece values of whole texts from their window rows, each piece from its
    max-context window.

    Args:
      columns: {name: [rows, seq]} per-position values (predictions, labels).
      example_index, num_windows, window_start: int [rows].
      is_max_context: bool [rows, seq].
      offset: the row position of a window's first piece (1: after [CLS]).

    Returns:
      One {name: [pieces]} per complete text, in text order.
    """
    is_max_context = np.asarray(is_max_context, bool)
    window_start = np.asarray(window_start).reshape(-1)
    out = []
    for rows in complete_rows(example_index, num_windows)[1]:
        r, j = np.nonzero(is_max_context[rows])
        piece = window_start[rows][r] + j - offset
        order = np.argsort(piece, kind="stable")
        out.append({name: np.asarray(values)[rows][r, j][order]
                    for name, values in columns.items()})
    return out
