"""In-graph WordPiece tokenizer and `[CLS] A [SEP] (B [SEP])` packer (tensorflow-text).

`Tokenizer` wraps `tensorflow_text.FastBertTokenizer`: on the 712 reference texts of
`tokenizer_golden.jsonl` it gives exactly the ids of Hugging Face's `BertTokenizer` (lower
case, NFD accent strip, punctuation and CJK split, control and zero-width characters
dropped), is about 6x faster than `tensorflow_text.BertTokenizer` on CPU, and - unlike the
latter - reports offsets into the *original* UTF-8 bytes even when normalization changes the
byte length (accents), which SQuAD needs to recover answer text.

Before FastBertTokenizer runs, the text is cleaned the way google-research/bert's
`BasicTokenizer._clean_text` cleans it and FastBertTokenizer alone does not: control characters
other than tab/newline/return (which FastBertTokenizer treats as spaces, splitting the word),
U+FFFD (left by decoding bad bytes, e.g. `errors="replace"`) and private-use characters (which it
keeps as `[UNK]`) are deleted. Format characters (zero-width, soft hyphen) it already deletes.

The word level (`tokenize_words`, for whole-word masking and NER) is derived from the pieces:
a piece whose vocabulary entry starts with `##` continues the previous word, every other piece
starts a word. This is exactly WordPiece's own rule, so it agrees with
`tensorflow_text.BertTokenizer`'s `[batch, (words), (pieces)]` output.
"""

import os

import tensorflow as tf
import tensorflow_text as tf_text

from bert_trainer import features
from bert_trainer.errors import UserError

SUFFIX_INDICATOR = "##"

# Characters the reference deletes and FastBertTokenizer does not (see the module docstring).
_DELETED = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x{9f}\x{fffd}\p{Co}]"
# With offsets, each multi-byte one becomes a format character of the same UTF-8 length, which
# FastBertTokenizer deletes without splitting the word, so byte offsets stay those of the input;
# only the 1-byte ones (C0 controls, DEL) are removed, and the offsets shifted back afterwards.
_SAME_LENGTH = (
    (r"[\x{80}-\x{9f}]", "\u00ad"),  # C1 controls (2 bytes) -> soft hyphen.
    (r"[\x{fffd}\x{e000}-\x{f8ff}]", "\u200b"),  # U+FFFD, BMP private use -> zero-width space.
    (r"[\x{f0000}-\x{10ffff}]", "\U000e0001"),  # Planes 15-16 private use -> language tag.
)
_ONE_BYTE_DELETED = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"


def load_vocab(vocab_file: str) -> list[str]:
    """Reads a `vocab.txt` (one token a line, id = line number).

    Args:
      vocab_file: path of the vocabulary.

    Returns:
      The tokens in id order.

    Raises:
      UserError: the file is missing, not UTF-8, empty, has duplicates or lacks a special token.
    """
    if not os.path.isfile(vocab_file):
        raise UserError(f"vocab file {vocab_file} does not exist; pass a vocab.txt "
                        "(make one with 'bert-train vocab')")
    try:
        with open(vocab_file, encoding="utf-8") as f:
            vocab = [line.rstrip("\r\n") for line in f]
    except UnicodeDecodeError as e:
        raise UserError(f"vocab file {vocab_file} is not UTF-8 ({e.reason} at byte {e.start}); "
                        "re-save it as UTF-8") from None
    while vocab and not vocab[-1]:  # A trailing blank line is an editor artifact, not a token.
        vocab.pop()
    if not vocab:
        raise UserError(f"vocab file {vocab_file} is empty; pass a vocab.txt with one token a line")
    missing = [t for t in features.SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise UserError(f"vocab file {vocab_file} lacks the special tokens {' '.join(missing)}; "
                        "add them (bert-train vocab reserves them)")
    seen = set()
    dupes = [t for t in vocab if t in seen or seen.add(t)]
    if dupes:
        raise UserError(f"vocab file {vocab_file} repeats tokens {dupes[:5]}; "
                        "each token must appear once (its line number is its id)")
    return vocab


def _one_byte_deleted_positions(texts: tf.Tensor) -> tf.RaggedTensor:
    """Where each deleted 1-byte character would sit in the text without them.

    Args:
      texts: string tensor [batch].

    Returns:
      int64 RaggedTensor [batch, (deleted)]: for the k-th deleted character of a row, its byte
      offset in the original text minus k (the bytes kept before it), ascending.
    """
    codepoints, offsets = tf.strings.unicode_decode_with_offsets(texts, "UTF-8")
    deleted = ((codepoints < 32) & (codepoints != 9) & (codepoints != 10) & (codepoints != 13)
               | (codepoints == 127))
    positions = tf.ragged.boolean_mask(offsets, deleted)
    return positions - tf.ragged.range(positions.row_lengths(), dtype=tf.int64)


def _shift_offsets(offsets: tf.RaggedTensor, deleted: tf.RaggedTensor, side: str):
    """Adds to each offset the number of deleted bytes before it in its row.

    Args:
      offsets: int64 RaggedTensor [batch, (pieces)], byte offsets into the cleaned text.
      deleted: from `_one_byte_deleted_positions`, [batch, (deleted)].
      side: "right" for start offsets (a deletion at the offset precedes the piece), "left" for
        exclusive end offsets (one at the end follows the piece).

    Returns:
      int64 RaggedTensor [batch, (pieces)] of offsets into the original text.
    """
    # One flat sorted search instead of a padded one per row: key = (row, offset) as one int64.
    row_shift = tf.constant(2**32, tf.int64)  # Above any byte offset of a string.
    rows = offsets.value_rowids()
    keys = deleted.value_rowids() * row_shift + deleted.flat_values
    queries = rows * row_shift + offsets.flat_values
    in_earlier_rows = tf.gather(deleted.row_starts(), rows)
    before = tf.searchsorted(keys, queries, side=side, out_type=tf.int64) - in_earlier_rows
    return offsets.with_flat_values(offsets.flat_values + before)


def group_words(pieces: tf.RaggedTensor, is_continuation: tf.Tensor) -> tf.RaggedTensor:
    """Groups word pieces into words: a piece whose token starts with `##` continues a word.

    Args:
      pieces: int RaggedTensor [batch, (pieces)].
      is_continuation: bool [vocab_size]; True for `##` tokens.

    Returns:
      RaggedTensor [batch, (words), (pieces)] with the same flat values as `pieces`.
    """
    flat = pieces.flat_values  # (total_pieces,)
    row_ids = pieces.value_rowids()
    # The first piece of a row starts a word even if it were a lone `##x` piece.
    first_in_row = tf.equal(tf.range(tf.size(flat, out_type=row_ids.dtype)),
                            tf.gather(pieces.row_starts(), row_ids))
    starts = tf.logical_or(tf.logical_not(tf.gather(is_continuation, flat)), first_in_row)
    words = tf.RaggedTensor.from_row_starts(
        flat, tf.where(starts)[:, 0], validate=False)  # (total_words, (pieces))
    words_per_row = tf.math.unsorted_segment_sum(
        tf.cast(starts, tf.int64), row_ids, pieces.nrows())
    return tf.RaggedTensor.from_row_lengths(words, words_per_row, validate=False)


class Tokenizer(tf.Module):
    """WordPiece tokenizer built from a `vocab.txt`; all methods run inside `tf.data`/`tf.function`.

    Attributes:
      vocab_file, lower_case: the constructor arguments.
      vocab: list of tokens, id = index.
      vocab_size: `len(vocab)`.
      pad_id, unk_id, cls_id, sep_id, mask_id: ids of the special tokens.
      is_continuation: bool tensor [vocab_size], True for `##` (word-continuing) pieces.
    """

    def __init__(self, vocab_file: str, lower_case: bool = True):
        """Args:
          vocab_file: path of a `vocab.txt` holding `features.SPECIAL_TOKENS`.
          lower_case: lower-case and strip accents (NFD) first, as uncased BERT does.
        """
        super().__init__(name="tokenizer")
        self.vocab_file = str(vocab_file)
        self.lower_case = bool(lower_case)
        vocab = load_vocab(self.vocab_file)
        # A plain list, not a tracked ListWrapper: 30k strings are data, not checkpoint state.
        self._setattr_tracking = False
        self.vocab = vocab
        self._setattr_tracking = True
        self.vocab_size = len(vocab)
        index = {token: i for i, token in enumerate(vocab)}
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            index[t] for t in features.SPECIAL_TOKENS)
        self._tokenizer = tf_text.FastBertTokenizer(
            vocab=vocab, suffix_indicator=SUFFIX_INDICATOR, unknown_token=features.UNK,
            token_out_type=tf.int32, lower_case_nfd_strip_accents=self.lower_case)
        # is_continuation[id]: the piece continues the previous word (its token starts with ##).
        self.is_continuation = tf.constant([t.startswith(SUFFIX_INDICATOR) for t in vocab])
        self._tokens = tf.constant(vocab)

    @property
    def special_ids(self) -> tuple[int, ...]:
        """Ids of [PAD] [UNK] [CLS] [SEP] [MASK], in that order."""
        return (self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id)

    def tokenize(self, texts) -> tf.RaggedTensor:
        """Word pieces of each text.

        Args:
          texts: string tensor (or list) of shape [batch].

        Returns:
          int32 RaggedTensor [batch, (pieces)].
        """
        texts = tf.strings.regex_replace(tf.convert_to_tensor(texts, tf.string), _DELETED, "")
        return self._tokenizer.tokenize(texts)

    def tokenize_with_offsets(self, texts):
        """Word pieces with their byte span in the original (un-normalized) UTF-8 text.

        Args:
          texts: string tensor (or list) of shape [batch].

        Returns:
          (ids, starts, ends): RaggedTensors [batch, (pieces)]; ids int32, starts/ends int64 byte
          offsets such that `text[start:end]` is the source of the piece.
        """
        texts = tf.convert_to_tensor(texts, tf.string)

        def clean():
            cleaned = texts
            for pattern, same_length in _SAME_LENGTH:
                cleaned = tf.strings.regex_replace(cleaned, pattern, same_length)
            return tf.strings.regex_replace(cleaned, _ONE_BYTE_DELETED, "")

        # One search pass; the four rewrites run only for a batch that needs them (rare).
        needs_cleaning = tf.reduce_any(tf.strings.regex_full_match(texts, f"(?s).*{_DELETED}.*"))
        cleaned = tf.cond(needs_cleaning, clean, lambda: texts)
        ids, starts, ends = self._tokenizer.tokenize_with_offsets(cleaned)

        def shift():
            deleted = _one_byte_deleted_positions(texts)
            return _shift_offsets(starts, deleted, "right"), _shift_offsets(ends, deleted, "left")

        # Only the 1-byte deletions change lengths; most batches have none and skip the decode.
        any_deleted = tf.reduce_any(tf.strings.length(cleaned) < tf.strings.length(texts))
        starts, ends = tf.cond(any_deleted, shift, lambda: (starts, ends))
        return ids, starts, ends

    def word_starts(self, ids):
        """True where a piece starts a word (its token has no `##` prefix).

        Args:
          ids: int tensor or RaggedTensor of piece ids, any shape.

        Returns:
          bool tensor of the same shape.
        """
        is_cont = tf.gather(self.is_continuation, ids)
        return tf.logical_not(is_cont)

    def tokenize_words(self, texts) -> tf.RaggedTensor:
        """Word pieces grouped by word.

        Args:
          texts: string tensor (or list) of shape [batch].

        Returns:
          int32 RaggedTensor [batch, (words), (pieces)].
        """
        return group_words(self.tokenize(texts), self.is_continuation)

    def convert_ids_to_tokens(self, ids):
        """Tokens (strings) of ids; works on dense and ragged tensors of any shape."""
        if isinstance(ids, tf.RaggedTensor):
            return ids.with_flat_values(tf.gather(self._tokens, ids.flat_values))
        return tf.gather(self._tokens, ids)

    def detokenize(self, ids) -> tf.Tensor:
        """Joins pieces back into text (lower-cased if `lower_case`), dropping special tokens.

        Args:
          ids: int RaggedTensor [batch, (pieces)] or dense [batch, seq].

        Returns:
          string tensor [batch].
        """
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(ids)
        keep = tf.reduce_all(tf.not_equal(
            tf.expand_dims(ids, -1), [self.pad_id, self.cls_id, self.sep_id]), axis=-1)
        tokens = self.convert_ids_to_tokens(tf.ragged.boolean_mask(ids, keep))
        text = tf.strings.reduce_join(tokens, axis=-1, separator=" ")
        return tf.strings.regex_replace(text, " " + SUFFIX_INDICATOR, "")

    def pack(self, segments, seq_length: int) -> dict:
        """Packs 1 or 2 segments into `[CLS] A [SEP] (B [SEP])`, padded to `seq_length`.

        Truncation removes pieces from the end of the longer segment first (ties: the second),
        which is google-research/bert's `_truncate_seq_pair`; `RoundRobinTrimmer` gives the
        same lengths.

        Args:
          segments: list of 1 or 2 int RaggedTensors [batch, (pieces)].
          seq_length: length of the packed sequence; >= 2 for one segment, >= 3 for two.

        Returns:
          dict of int32 [batch, seq_length]: features.INPUT_WORD_IDS, INPUT_MASK, INPUT_TYPE_IDS.
        """
        segments = list(segments)
        if len(segments) not in (1, 2):
            raise UserError(f"pack takes 1 or 2 segments, got {len(segments)}")
        special = len(segments) + 1  # [CLS] + one [SEP] per segment.
        if seq_length < special:
            raise UserError(f"seq_length={seq_length} is too short for {len(segments)} segment(s); "
                            f"use at least {special}")
        segments = [tf.cast(s, tf.int32) for s in segments]
        trimmed = tf_text.RoundRobinTrimmer(seq_length - special).trim(segments)
        ids, type_ids = tf_text.combine_segments(
            trimmed, start_of_sequence_id=self.cls_id, end_of_segment_id=self.sep_id)
        word_ids, mask = tf_text.pad_model_inputs(ids, seq_length, pad_value=self.pad_id)
        type_ids, _ = tf_text.pad_model_inputs(type_ids, seq_length, pad_value=0)
        return {
            features.INPUT_WORD_IDS: tf.cast(word_ids, tf.int32),
            features.INPUT_MASK: tf.cast(mask, tf.int32),
            features.INPUT_TYPE_IDS: tf.cast(type_ids, tf.int32),
        }
