"""In-graph WordPiece tokenizer and `[CLS] A [SEP] (B [SEP])` packer (tensorflow-text).

`Tokenizer` wraps `tensorflow_text.FastBertTokenizer` with google-research/bert's own character
normalization (`bert_normalizer`): BERT's `_clean_text` (control, format and private-use
characters, NUL and U+FFFD deleted; whitespace to spaces), then for uncased models Python's
lower-casing, NFD and dropping of the non-spacing marks. FastBertTokenizer's built-in
normalization differs on compatibility characters (it applies NFKC_Casefold: `it´s` -> `it s`,
`½` -> `1⁄2`, `ﬁ` -> `fi`) and keeps private-use characters. With BERT's table the ids are those
of Hugging Face's `BertTokenizer` on every golden text (`tokenizer_golden.jsonl` and
`tests/data/tokenizer_compat_golden.jsonl`), the tokenizer is several times faster than
`tensorflow_text.BertTokenizer` on CPU, and - unlike the latter - it reports offsets into the
*original* UTF-8 bytes even when normalization changes the byte length (accents, deletions),
which SQuAD needs to recover answer text. Known differences from google-research/bert's Python:
a final capital sigma lower-cases to `σ`, not `ς`, and unassigned characters are kept (both as
Hugging Face's `tokenizers` does; see `bert_normalizer`); the 100-character word limit counts
UTF-8 bytes (tf-text's `max_bytes_per_word`).

The word level (`tokenize_words`, for whole-word masking and NER) is derived from the pieces:
a piece whose vocabulary entry starts with `##` continues the previous word, every other piece
starts a word. This is exactly WordPiece's own rule, so it agrees with
`tensorflow_text.BertTokenizer`'s `[batch, (words), (pieces)]` output.

`detokenize` goes back to readable text in-graph (a SavedModel can serve it): pieces joined by
that same rule, then `restore_spacing` removes the spaces the basic tokenizer put around
punctuation, as Hugging Face's `clean_up_tokenization` and the Moses detokenizer do.
"""

import io
import os

import tensorflow as tf
import tensorflow_text as tf_text

from bert_trainer import (
    autograph_rules,  # noqa: F401 (AutoGraph leaves tensorflow_text as is)
    features,
)
from bert_trainer.data import bert_normalizer
from bert_trainer.errors import UserError

SUFFIX_INDICATOR = "##"


def vocab_is_cased(vocab: list[str]) -> bool:
    """Whether a vocabulary was learned from cased text: a lower-cased one has no capital
    letter outside its bracketed special tokens ([CLS], [unused0], ...)."""
    return any(token != token.lower() for token in vocab
               if not (token.startswith("[") and token.endswith("]")))


def load_vocab(vocab_file: str) -> list[str]:
    """Reads a `vocab.txt` (one token a line, id = line number).

    Args:
      vocab_file: path of the vocabulary.

    Returns:
      The tokens in id order.

    Raises:
      UserError: the file is missing, not UTF-8, starts with a byte-order mark, is empty, has
        duplicates or lacks a special token.
    """
    remote = "://" in vocab_file  # gs://, ram://: through TensorFlow's file systems.
    if not (tf.io.gfile.exists(vocab_file) and not tf.io.gfile.isdir(vocab_file) if remote
            else os.path.isfile(vocab_file)):
        raise UserError(f"vocab file {vocab_file} does not exist; pass a vocab.txt "
                        "(make one with 'bert-train vocab')")
    try:
        if remote:
            with tf.io.gfile.GFile(vocab_file, "rb") as f:
                data = f.read()
            vocab = [line.rstrip("\r\n") for line in io.TextIOWrapper(io.BytesIO(data),
                                                                       encoding="utf-8")]
        else:
            with open(vocab_file, encoding="utf-8") as f:
                vocab = [line.rstrip("\r\n") for line in f]
    except UnicodeDecodeError as e:
        raise UserError(f"vocab file {vocab_file} is not UTF-8 ({e.reason} at byte {e.start}); "
                        "re-save it as UTF-8") from None
    # A BOM (Windows editors write one) is refused, not stripped: model directories and
    # exports copy vocab.txt byte for byte, and other tools would read it into token 0.
    if vocab and vocab[0].startswith("\ufeff"):
        raise UserError(f"vocab file {vocab_file} starts with a UTF-8 byte-order mark (BOM), "
                        f"which the tokenizer would read as part of its first token "
                        f"{vocab[0][1:]!r}; re-save it as UTF-8 without a BOM (e.g. "
                        "sed -i '1s/^\\xEF\\xBB\\xBF//' FILE)")
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


# The spacing rules of `restore_spacing`, in order: (RE2 pattern, rewrite). They invert what
# BERT's basic tokenizer does to ordinary prose (a space on both sides of every punctuation
# character), as Hugging Face's `clean_up_tokenization` and the Moses detokenizer do, plus
# the number and abbreviation cases of English and Spanish. A rule whose match consumes the
# character the next match needs ("in - law", "1, 234, 567") appears twice.
_COMPOUND = (r"([\pL\pN]) - ([\pL\pN])", r"\1-\2")
_THOUSANDS = (r"([0-9],) ([0-9]{3})($|[^0-9])", r"\1\2\3")
_SPACING_RULES = (
    # Closing punctuation attaches to the word before: "hola ." -> "hola.", "6 %" -> "6%".
    (r" ([.,!?;:)\]}%»])", r"\1"),
    # Opening punctuation attaches to the word after: "¿ qué" -> "¿qué", "( sí )" -> "(sí)".
    (r"([(\[{¿¡«]) ", r"\1"),
    # A currency sign before a number: "$ 30" -> "$30" (Spanish "200 $" keeps its space).
    (r"([$£]) ([0-9])", r"\1\2"),
    # Straight double quotes pair up, left to right: 'dijo " hola "' -> 'dijo "hola"'.
    (r'" (.*?) "', r'"\1"'),
    # English contractions: "don ' t" -> "don't", "it ’ s" -> "it’s".
    (r"(\pL) (['’]) ((?i:s|t|m|d|re|ve|ll))\b", r"\1\2\3"),
    # A plural possessive keeps the space after it: "parents ' house" -> "parents' house".
    (r"([sS]) (['’]) ", r"\1\2 "),
    # Any other apostrophe between words is inside one: "O ' Brien" -> "O'Brien".
    (r" (['’]) ", r"\1"),
    # A hyphen between letters or digits joins a compound: "Coca - Cola" -> "Coca-Cola".
    _COMPOUND, _COMPOUND,
    # Abbreviations of single letters or capital pairs: "p. m." -> "p.m.", "U. S. A." ->
    # "U.S.A.", Spanish "EE. UU." -> "EE.UU." (longer words would catch "Sí. No.").
    (r"(^|[^\pL\pN.])(\pL|\p{Lu}\p{Lu})\. (\pL|\p{Lu}\p{Lu})\.", r"\1\2.\3."),
    (r"(\.\pL\.) (\pL\.)", r"\1\2"),  # a third letter onward: "U.S. A." -> "U.S.A."
    # Separators inside numbers: "8: 30" -> "8:30", "3. 5" -> "3.5", "20 / 20" -> "20/20".
    (r"([0-9]) ?([.:/]) ([0-9])", r"\1\2\3"),
    # A comma before exactly three digits groups thousands ("3, 000" -> "3,000"); before
    # other numbers it separates them ("October 20, 2013").
    _THOUSANDS, _THOUSANDS,
)


def restore_spacing(text) -> tf.Tensor:
    """Removes the spaces BERT's basic tokenizer added around punctuation.

    Args:
      text: string tensor of any shape: words and punctuation separated by single spaces.

    Returns:
      string tensor of the same shape, e.g. `¿ Dónde está ?` -> `¿Dónde está?`.
    """
    for pattern, rewrite in _SPACING_RULES:
        text = tf.strings.regex_replace(text, pattern, rewrite)
    return text


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
            token_out_type=tf.int32,
            fast_bert_normalizer_model_buffer=bert_normalizer.normalizer_model(self.lower_case))
        # is_continuation[id]: the piece continues the previous word (its token starts with ##).
        self.is_continuation = tf.constant([t.startswith(SUFFIX_INDICATOR) for t in vocab])
        self._tokens = tf.constant(vocab)

    @property
    def special_ids(self) -> tuple[int, ...]:
        """Ids of [PAD] [UNK] [CLS] [SEP] [MASK], in that order."""
        return (self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id)

    @staticmethod
    def _mark_deleted(texts) -> tf.Tensor:
        return bert_normalizer.mark_deleted(texts)

    def tokenize(self, texts) -> tf.RaggedTensor:
        """Word pieces of each text.

        Args:
          texts: string tensor (or list) of shape [batch].

        Returns:
          int32 RaggedTensor [batch, (pieces)].
        """
        return self._tokenizer.tokenize(self._mark_deleted(texts))

    def tokenize_with_offsets(self, texts):
        """Word pieces with their byte span in the original (un-normalized) UTF-8 text.

        Args:
          texts: string tensor (or list) of shape [batch].

        Returns:
          (ids, starts, ends): RaggedTensors [batch, (pieces)]; ids int32, starts/ends int64 byte
          offsets such that `text[start:end]` is the source of the piece (including deleted
          characters and dropped accents right after it).
        """
        return self._tokenizer.tokenize_with_offsets(self._mark_deleted(texts))

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
        """Readable text of piece ids: `##` pieces joined, punctuation spacing restored.

        `[PAD]`, `[CLS]` and `[SEP]` are dropped (`[UNK]` and `[MASK]` stay visible); the
        pieces are joined into words and `restore_spacing` undoes the spaces the basic
        tokenizer put around punctuation. The text is lower-cased and accent-free when
        `lower_case` is set, since the vocabulary is. Only tf ops: it runs in a SavedModel.

        Args:
          ids: int RaggedTensor [batch, (pieces)] or dense [batch, seq] (padding dropped).

        Returns:
          string tensor [batch].
        """
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(ids)
        keep = tf.reduce_all(tf.not_equal(
            tf.expand_dims(ids, -1), tf.cast([self.pad_id, self.cls_id, self.sep_id],
                                             ids.dtype)), axis=-1)
        ids = tf.ragged.boolean_mask(ids, keep)
        tokens = tf.gather(self._tokens, ids.flat_values)
        # A `##` piece continues the word before it: its prefix goes, and no space precedes it.
        # Checked by id, not by text, so a literal "##" word is not glued to its neighbour.
        continues = tf.gather(self.is_continuation, ids.flat_values)
        pieces = tf.where(continues, tf.strings.regex_replace(tokens, "^" + SUFFIX_INDICATOR, ""),
                          " " + tokens)
        text = tf.strings.reduce_join(ids.with_flat_values(pieces), axis=-1)
        return restore_spacing(tf.strings.strip(text))

    def pack(self, segments, seq_length: int, *, pad_to_longest: bool = False) -> dict:
        """Packs 1 or 2 segments into `[CLS] A [SEP] (B [SEP])`, padded to `seq_length`.

        Truncation removes pieces from the end of the longer segment first (ties: the second),
        which is google-research/bert's `_truncate_seq_pair`; `RoundRobinTrimmer` gives the
        same lengths.

        Args:
          segments: list of 1 or 2 int RaggedTensors [batch, (pieces)].
          seq_length: length of the packed sequence; >= 2 for one segment, >= 3 for two.
          pad_to_longest: pad only to the batch's longest packed row (at most `seq_length`,
            at least the special tokens): the serving signatures' dynamic length axis.

        Returns:
          dict of int32 [batch, seq_length] (with `pad_to_longest`: [batch, longest]):
          features.INPUT_WORD_IDS, INPUT_MASK, INPUT_TYPE_IDS.
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
        width = seq_length
        if pad_to_longest:  # max of no rows is int64's min: an empty batch gets `special`
            width = tf.maximum(tf.reduce_max(ids.row_lengths()), special)
        word_ids, mask = tf_text.pad_model_inputs(ids, width, pad_value=self.pad_id)
        type_ids, _ = tf_text.pad_model_inputs(type_ids, width, pad_value=0)
        return {
            features.INPUT_WORD_IDS: tf.cast(word_ids, tf.int32),
            features.INPUT_MASK: tf.cast(mask, tf.int32),
            features.INPUT_TYPE_IDS: tf.cast(type_ids, tf.int32),
        }
