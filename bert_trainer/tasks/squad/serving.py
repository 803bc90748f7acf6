"""Extractive question answering on raw text: doc-stride windows and span selection in graph.

The in-graph counterpart of `bert_trainer.tasks.squad.data` (evaluation side), with the same
semantics so that an export answers exactly as `postprocess_squad` scores in fine-tuning:
- the question keeps its first `max_query_length` pieces; each window is
  `[CLS] question [SEP] context-window [SEP]`, holds `seq_length - len(question) - 3` context
  pieces and starts `doc_stride` pieces after the previous one (`squad_windows`);
- a piece belongs to the window that gives it the most context (google-research/bert's score,
  ties to the earlier window);
- per window, the best `start_logit + end_logit` span among the top `n_best` starts and ends,
  both in the context, start where the window has max context, at most `max_answer_length`
  pieces; across windows the best such span (ties to the earlier window); SQuAD v2.0 answers ""
  when the [CLS] score beats it by more than `null_threshold` (`postprocess_squad`).
One difference: logits that tie exactly may be ranked in another order than numpy's argsort.

Outputs per question: answer string, score float32 (its start + end logit; the [CLS] score
for a v2.0 null answer; -inf when no span is valid), start and end int32, the answer's
character span in the original context (end exclusive; -1 when there is no answer), and
truncated bool: the question was cut to `max_query_length` pieces (`predict` marks it).
"""

import tensorflow as tf

from bert_trainer.errors import UserError
from bert_trainer.features import END_LOGITS, INPUT_MASK, INPUT_WORD_IDS, START_LOGITS
from bert_trainer.serving import SCORE, TaskServing, byte_to_char, padding_counts
from bert_trainer.tasks.family import TRUNCATED

QUESTION, CONTEXT = "question", "context"
ANSWER, START, END = "answer", "start", "end"
# Window features besides features.ENCODER_INPUTS (see `SquadServing.windows`).
CHAR_START, CHAR_END = "char_start", "char_end"
IS_MAX_CONTEXT, EXAMPLE_INDEX = "is_max_context", "example_index"


def _dense(prefix_lengths, values: tf.RaggedTensor, prefix_value, width):
    """[W, width]: `prefix_lengths[w]` times `prefix_value`, then `values[w]`, padded."""
    prefix = tf.RaggedTensor.from_row_lengths(
        tf.fill([tf.reduce_sum(prefix_lengths)], tf.constant(prefix_value, values.dtype)),
        prefix_lengths)
    shape = tf.stack([tf.constant(-1, tf.int64), tf.cast(width, tf.int64)])  # [None, width]
    return tf.concat([prefix, values], axis=1).to_tensor(default_value=prefix_value,
                                                         shape=shape)


def _max_context(pieces: tf.RaggedTensor, lengths: tf.Tensor, num_ids) -> tf.RaggedTensor:
    """Whether each window gives each of its pieces the most context.

    Args:
      pieces: int64 RaggedTensor [W, (length)] of batch-global piece ids.
      lengths: int64 [W] window lengths.
      num_ids: int64 scalar, the number of piece ids.

    Returns:
      bool RaggedTensor shaped like `pieces`.
    """
    j = tf.ragged.range(lengths)  # (W, (length)) position in the window
    # google-research/bert's score, in float64 as squad_data computes it, so ties agree.
    score = (tf.cast(tf.minimum(j, tf.expand_dims(lengths, 1) - 1 - j), tf.float64)
             + 0.01 * tf.cast(tf.expand_dims(lengths, 1), tf.float64))
    ids, window = pieces.flat_values, pieces.value_rowids()
    best = tf.math.unsorted_segment_max(score.flat_values, ids, num_ids)
    never = tf.size(lengths, out_type=tf.int64)
    candidate = tf.where(tf.equal(score.flat_values, tf.gather(best, ids)), window, never)
    first_best = tf.math.unsorted_segment_min(candidate, ids, num_ids)  # Ties: earlier window.
    return pieces.with_flat_values(tf.equal(tf.gather(first_best, ids), window))


class SquadServing(TaskServing):
    """Answers questions about contexts of any length (see the module docstring).

    Args:
      model: a `BertSpanLabeler`.
      doc_stride, max_query_length, version_2: as in `squad_data.squad_windows`.
      max_answer_length, n_best, null_threshold: as in `squad_data.postprocess_squad`.
      **kwargs: `ServingModule` arguments.

    `serving_default(question [b] string, context [b] string)` returns answer string [b],
    score float32 [b], start and end int32 [b], truncated bool [b], and input_tokens,
    padding_tokens int32 [b] (`serving.padding_counts`: windows are padded to the batch's
    longest).
    """

    family = "squad"

    def __init__(self, model, *, doc_stride: int = 128, max_query_length: int = 64,
                 max_answer_length: int = 30, n_best: int = 20, version_2: bool = False,
                 null_threshold: float = 0.0, **kwargs):
        super().__init__(model, **kwargs)
        if max_query_length < 1 or self.seq_length < max_query_length + 4:
            raise UserError(f"seq_length={self.seq_length} must exceed max_query_length="
                            f"{max_query_length} + 3 and max_query_length must be >= 1")
        if doc_stride < 1 or max_answer_length < 1 or n_best < 1:
            raise UserError(f"doc_stride={doc_stride}, max_answer_length={max_answer_length} "
                            f"and n_best={n_best} must all be >= 1")
        self.doc_stride, self.max_query_length = int(doc_stride), int(max_query_length)
        self.max_answer_length, self.n_best = int(max_answer_length), int(n_best)
        self.version_2, self.null_threshold = bool(version_2), float(null_threshold)

    def _text_spec(self):
        return self._answer, [tf.TensorSpec([None], tf.string, name=QUESTION),
                              tf.TensorSpec([None], tf.string, name=CONTEXT)]

    def _answer(self, question, context):
        windows = self.windows(question, context)
        logits = self._run_model(windows)
        answers = self.select(windows, logits[START_LOGITS], logits[END_LOGITS], context)
        # The question kept its first max_query_length pieces: say so (no silent truncation).
        cut = self.tokenizer.tokenize(question).row_lengths() > self.max_query_length
        padding = padding_counts(windows[INPUT_MASK], windows[EXAMPLE_INDEX],
                                 tf.shape(question)[0])
        return {**answers, TRUNCATED: cut, **padding}

    def windows(self, question, context) -> dict:
        """Every doc-stride window of every (question, context), as `squad_windows` cuts them.

        Args:
          question, context: string [b].

        Returns:
          dict of [W, ...] over all W windows, example after example: features.ENCODER_INPUTS
          int32 [W, width] (width: `seq_length`, or the longest window with
          `pad_to_longest`); char_start, char_end int64 [W, width], the character span of
          each context piece (-1 elsewhere); is_max_context bool [W, width]; example_index
          int64 [W].
        """
        seq = self.seq_length
        q = self.tokenizer.tokenize(question)[:, :self.max_query_length]  # (b, (q))
        ids, starts, ends = self.tokenizer.tokenize_with_offsets(context)  # (b, (pieces))
        num, q_len = ids.row_lengths(), q.row_lengths()  # (b,)
        room = seq - 3 - q_len  # Context pieces per window.
        step = tf.minimum(room, self.doc_stride)
        num_windows = 1 + (tf.maximum(num - room, 0) + step - 1) // step  # ceil
        example = tf.repeat(tf.range(tf.size(num, out_type=tf.int64)), num_windows)  # (W,)
        start = tf.ragged.range(num_windows).flat_values * tf.gather(step, example)
        length = tf.minimum(tf.gather(num, example) - start, tf.gather(room, example))
        # Batch-global ids of each window's context pieces: (W, (length)).
        pieces = (tf.ragged.range(start, start + length)
                  + tf.expand_dims(tf.gather(ids.row_starts(), example), 1))
        inputs = self.pack([tf.gather(q, example), tf.gather(ids.flat_values, pieces)])
        width = tf.shape(inputs[INPUT_WORD_IDS], out_type=tf.int64)[1]
        prefix = tf.gather(q_len, example) + 2  # [CLS] question [SEP]
        outputs = dict(inputs)
        for name, offsets in ((CHAR_START, starts), (CHAR_END, ends)):
            chars = byte_to_char(context, offsets).flat_values
            outputs[name] = _dense(prefix, tf.gather(chars, pieces), -1, width)
        outputs[IS_MAX_CONTEXT] = _dense(
            prefix, _max_context(pieces, length, tf.size(ids.flat_values, out_type=tf.int64)),
            False, width)
        outputs[EXAMPLE_INDEX] = example
        return outputs

    def _window_best(self, windows, start_logits, end_logits):
        """(score, start, end) [W] of each window's best valid span; score -inf if none."""
        seq = tf.shape(start_logits)[1]  # seq_length, or the longest window
        in_context = windows[CHAR_START] >= 0  # (W, seq)

        def top(logits):  # (W, seq) True at the n_best largest logits
            index = tf.math.top_k(logits, tf.minimum(self.n_best, seq)).indices
            return tf.reduce_any(tf.one_hot(index, seq, on_value=True, off_value=False), axis=1)

        ok_start = in_context & windows[IS_MAX_CONTEXT] & top(start_logits)
        ok_end = in_context & top(end_logits)
        position = tf.range(seq)
        span = tf.expand_dims(position, 0) - tf.expand_dims(position, 1)  # (start, end): e - s
        allowed = (span >= 0) & (span < self.max_answer_length)  # (seq, seq)
        valid = ok_start[:, :, None] & ok_end[:, None, :] & allowed  # (W, seq, seq)
        scores = tf.where(valid, start_logits[:, :, None] + end_logits[:, None, :],
                          tf.constant(-float("inf"), tf.float32))
        flat = tf.reshape(scores, [-1, seq * seq])
        best = tf.argmax(flat, axis=-1, output_type=tf.int32)  # (W,)
        return tf.reduce_max(flat, axis=-1), best // seq, best % seq

    def select(self, windows: dict, start_logits, end_logits, context) -> dict:
        """The answer to each question from its windows' logits.

        Args:
          windows: from `windows`.
          start_logits, end_logits: float32 [W, seq].
          context: string [b].

        Returns:
          {answer string [b], score float32 [b], start int32 [b], end int32 [b]}.
        """
        score, first, last = self._window_best(windows, start_logits, end_logits)
        example = windows[EXAMPLE_INDEX]
        batch = tf.shape(context, out_type=tf.int64)[0]
        best = tf.math.unsorted_segment_max(score, example, batch)  # (b,) -inf: no span
        count = tf.size(score, out_type=tf.int64)
        window = tf.range(count)
        is_best = tf.equal(score, tf.gather(best, example)) & (score > -float("inf"))
        chosen = tf.math.unsorted_segment_min(tf.where(is_best, window, count), example, batch)
        found = chosen < count
        chosen = tf.minimum(chosen, count - 1)  # Safe index; `found` masks the rest.
        null = tf.math.unsorted_segment_min(start_logits[:, 0] + end_logits[:, 0], example, batch)
        if self.version_2:
            answered = found & ~(null - best > self.null_threshold)
            fallback = null
        else:
            answered, fallback = found, tf.fill([batch], -float("inf"))
        at = tf.stack([chosen, tf.cast(tf.gather(first, chosen), tf.int64)], axis=1)
        begin = tf.where(answered, tf.gather_nd(windows[CHAR_START], at), -1)
        at = tf.stack([chosen, tf.cast(tf.gather(last, chosen), tf.int64)], axis=1)
        end = tf.where(answered, tf.gather_nd(windows[CHAR_END], at), -1)
        text = tf.strings.substr(context, tf.maximum(begin, 0), tf.maximum(end - begin, 0),
                                 unit="UTF8_CHAR")
        return {ANSWER: text, SCORE: tf.where(answered, best, fallback),
                START: tf.cast(begin, tf.int32), END: tf.cast(end, tf.int32)}

