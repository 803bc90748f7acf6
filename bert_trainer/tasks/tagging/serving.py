"""Token tagging (NER) on raw text: word-level entities with character spans, in graph.

Words are BERT's basic-tokenizer words: the text is split at whitespace and around every
punctuation character (and CJK character), which is what `FastBertTokenizer` does before
WordPiece; a piece without the `##` prefix starts a word (`tokenizer.group_words`'s rule).
Fine-tuning tokenizes each CoNLL word on its own and labels its first piece, so a word here is
encoded exactly as a training word of the same spelling; one difference remains: a training
word such as "U.S." is one word, here it is four ("u", ".", "s", ".") and each gets a tag.

Entities are read from the IOB2 word tags as conlleval does (`metrics.tagging.get_entities`):
B-X starts an entity, I-X continues one of type X and starts one after O or another type.
A text longer than `seq_length - 2` pieces is cut into windows (`data/windows.py`) and each
piece takes its tag from the window where it has the most context, as the fine-tuning
evaluation does; a model trained with FinetuneConfig.long_texts = "truncate" tags it up to
`seq_length - 2` pieces, later words get no tag, and `truncated` [b] says so.

Ragged outputs cannot cross a signature, so each output is padded to the batch's largest
entity count E (strings with "", offsets with -1) and `num_entities` [b] says how many are real.
"""

import tensorflow as tf

from bert_trainer.data import windows
from bert_trainer.errors import UserError
from bert_trainer.features import INPUT_MASK, LOGITS
from bert_trainer.serving import TEXT, TaskServing, byte_to_char, padding_counts
from bert_trainer.tasks.family import TRUNCATED

OUTSIDE = "O"
ENTITY_TYPE, ENTITY_TEXT = "entity_type", "entity_text"
ENTITY_START, ENTITY_END, NUM_ENTITIES = "entity_start", "entity_end", "num_entities"


def tag_scheme(label_names) -> tuple[tuple[str, ...], tuple[int, ...], tuple[bool, ...]]:
    """Entity types of IOB2 tags, and per tag its type number and whether it is a B- tag.

    Args:
      label_names: tags in id order, e.g. ("O", "B-PER", "I-PER").

    Returns:
      (types sorted, e.g. ("PER",); type number of each tag, 0 for "O" and 1 + the index in
      `types` otherwise; True for each B- tag).

    Raises:
      UserError: a tag that is neither "O" nor B-TYPE / I-TYPE.
    """
    bad = [t for t in label_names
           if t != OUTSIDE and not (t[:2] in ("B-", "I-") and len(t) > 2)]
    if bad:
        raise UserError(f"tag {bad[0]!r} in task.label_names is not IOB2 (O, B-TYPE, I-TYPE); "
                        "the export reads entities from IOB2 tags")
    types = tuple(sorted({t[2:] for t in label_names if t != OUTSIDE}))
    type_of = [0 if t == OUTSIDE else 1 + types.index(t[2:]) for t in label_names]
    return types, tuple(type_of), tuple(t.startswith("B-") for t in label_names)


def word_pieces(ids: tf.RaggedTensor, is_continuation: tf.Tensor):
    """Where each word's pieces start and end, in flat piece positions.

    Args:
      ids: int RaggedTensor [batch, (pieces)].
      is_continuation: bool [vocab_size], True for `##` pieces.

    Returns:
      (first, last, row): int64 [total_words]: each word's first and last piece (indices into
      `ids.flat_values`) and its row. A row's first piece always starts a word.
    """
    total = tf.size(ids.flat_values, out_type=tf.int64)
    row_ids = ids.value_rowids()
    first_in_row = tf.equal(tf.range(total), tf.gather(ids.row_starts(), row_ids))
    starts = tf.logical_or(tf.logical_not(tf.gather(is_continuation, ids.flat_values)),
                           first_in_row)
    first = tf.where(starts)[:, 0]  # (words,)
    # A word ends where the next one starts; rows never share a word (first_in_row above).
    last = tf.concat([first[1:], [total]], axis=0) - 1
    return first, last, tf.gather(row_ids, first)


def find_entities(tags: tf.Tensor, rows: tf.Tensor, type_of, is_begin):
    """Entities of word tags, read as conlleval reads IOB2.

    Args:
      tags: int [total_words] tag ids of the words of all rows, in order.
      rows: int64 [total_words] row of each word (non-decreasing).
      type_of, is_begin: from `tag_scheme`.

    Returns:
      (first, last, entity_type): [entities] indices into `tags` of each entity's first and
      last word (int64) and its type number (int32, >= 1), in order.
    """
    kind = tf.gather(tf.constant(type_of, tf.int32), tags)  # (words,), 0 for O
    begin = tf.gather(tf.constant(is_begin, tf.bool), tags)
    prev_kind = tf.concat([[0], kind[:-1]], axis=0)
    new_row = tf.not_equal(rows, tf.concat([tf.constant([-1], rows.dtype), rows[:-1]], axis=0))
    starts = (kind > 0) & (begin | new_row | tf.not_equal(kind, prev_kind))
    inside = kind > 0
    # Every non-O word belongs to the entity most recently started (same type, same row).
    entity = tf.cumsum(tf.cast(starts, tf.int64)) - 1
    first = tf.where(starts)[:, 0]
    words = tf.range(tf.size(tags, out_type=tf.int64))
    last = tf.math.unsorted_segment_max(tf.boolean_mask(words, inside),
                                        tf.boolean_mask(entity, inside), tf.size(first))
    return first, last, tf.gather(kind, first)


class TaggerServing(TaskServing):
    """Named entities of raw text (see the module docstring).

    Args:
      model: a `BertTokenClassifier`.
      label_names: IOB2 tags in id order.
      long_texts, doc_stride: how texts longer than `seq_length - 2` pieces are read
        (`FinetuneConfig`'s fields of the same names).
      **kwargs: `ServingModule` arguments.

    `serving_default(text [b] string)` returns entity_type, entity_text string [b, E],
    entity_start, entity_end int32 [b, E] (characters of `text`, end exclusive),
    num_entities int32 [b], truncated bool [b] (later pieces untagged: truncate only), and
    input_tokens, padding_tokens int32 [b] (`serving.padding_counts`: rows are padded to the
    batch's longest).
    """

    family = "tagging"

    def __init__(self, model, *, label_names, long_texts: str = "windows",
                 doc_stride: int | None = None, **kwargs):
        super().__init__(model, **kwargs)
        windows.check_options(long_texts, doc_stride)
        self.long_texts, self.doc_stride = long_texts, doc_stride
        self.label_names = tuple(str(n) for n in label_names)
        if len(self.label_names) != model.num_classes:
            raise UserError(f"{len(self.label_names)} label_names for a tagger of "
                            f"{model.num_classes} tags; fix task.label_names in bert_train.json")
        self.entity_types, self._type_of, self._is_begin = tag_scheme(self.label_names)

    def _text_spec(self):
        return self._tag, [tf.TensorSpec([None], tf.string, name=TEXT)]

    def _word_tags(self, text):
        """(ids [b, (pieces)], byte starts, byte ends, predicted tag [b, (pieces)], cut
        bool [b]: the text lost pieces, which are left untagged (truncate only), and the
        rows' `padding_counts`)."""
        ids, starts, ends = self.tokenizer.tokenize_with_offsets(text)
        if self.long_texts == "windows":  # every piece is tagged
            tags, padding = self._window_tags(ids)
            return ids, starts, ends, tags, tf.zeros([ids.nrows()], tf.bool), padding
        keep = self.seq_length - 2  # Room for [CLS] and [SEP], as in `tag_features`.
        kept = ids[:, :keep]
        inputs = self.pack([kept])  # (b, width <= seq_length)
        logits = self._run_model(inputs)[LOGITS]
        predicted = tf.argmax(logits[:, 1:keep + 1], axis=-1, output_type=tf.int32)  # (b, <=keep)
        predicted = tf.RaggedTensor.from_tensor(predicted, lengths=kept.row_lengths())
        return (kept, starts[:, :keep], ends[:, :keep], predicted,
                ids.row_lengths() > kept.row_lengths(), padding_counts(inputs[INPUT_MASK]))

    def _window_tags(self, ids: tf.RaggedTensor):
        """(int32 [b, (pieces)]: each piece's tag from its max-context window; the windows'
        `padding_counts`)."""
        cut = windows.cut(ids.row_lengths(), self.seq_length - 2, self.doc_stride)
        inputs = self.pack([windows.gather(ids, cut)])  # (W, width <= seq_length)
        logits = self._run_windows(inputs, [None, None, len(self.label_names)])  # (W, width, T)
        predicted = tf.argmax(logits[:, 1:], axis=-1, output_type=tf.int32)  # (W, seq - 1)
        predicted = tf.RaggedTensor.from_tensor(predicted, lengths=cut.length)  # (W, (len))
        chosen = windows.max_context(ids, cut).flat_values  # one True per piece
        piece = windows.positions(ids, cut).flat_values
        total = tf.size(ids.flat_values, out_type=tf.int64)
        flat = tf.math.unsorted_segment_sum(tf.where(chosen, predicted.flat_values, 0),
                                            piece, total)
        return ids.with_flat_values(flat), padding_counts(inputs[INPUT_MASK], cut.example,
                                                          ids.nrows())

    def _tag(self, text):
        ids, starts, ends, predicted, cut, padding = self._word_tags(text)
        first_piece, last_piece, word_row = word_pieces(ids, self.tokenizer.is_continuation)
        tags = tf.gather(predicted.flat_values, first_piece)  # (words,) tag of the first piece
        first, last, kind = find_entities(tags, word_row, self._type_of, self._is_begin)
        byte_start = tf.gather(starts.flat_values, tf.gather(first_piece, first))  # (entities,)
        byte_end = tf.gather(ends.flat_values, tf.gather(last_piece, last))
        row = tf.gather(word_row, first)
        nrows = tf.shape(text, out_type=tf.int64)[0]

        def by_row(values):
            return tf.RaggedTensor.from_value_rowids(values, row, nrows=nrows)

        char_start = byte_to_char(text, by_row(byte_start))  # (b, (entities))
        char_end = byte_to_char(text, by_row(byte_end))
        surface = tf.strings.substr(tf.gather(text, row), byte_start, byte_end - byte_start)
        names = tf.gather(tf.constant(("",) + self.entity_types), kind)
        return {
            ENTITY_TYPE: by_row(names).to_tensor(default_value=""),  # (b, E)
            ENTITY_TEXT: by_row(surface).to_tensor(default_value=""),
            ENTITY_START: tf.cast(char_start.to_tensor(default_value=-1), tf.int32),
            ENTITY_END: tf.cast(char_end.to_tensor(default_value=-1), tf.int32),
            NUM_ENTITIES: tf.cast(by_row(kind).row_lengths(), tf.int32),
            TRUNCATED: cut,
            **padding,
        }

