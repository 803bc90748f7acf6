"""Learning a WordPiece vocabulary with tensorflow-text's BERT vocabulary learner.

Text is streamed from the files through
tensorflow-text's WordPiece learner (`tensorflow_text.tools.wordpiece_vocab`, the steps of its
`bert_vocab_from_dataset`): words split the way BERT's basic tokenizer does, counted once,
then a search for a count threshold giving at most `vocab_size` tokens (`learn_within`). The
special tokens come first, so `[PAD]` is id 0.

Inputs are plain text (one line at a time, Project Gutenberg headers skipped) or, given
`columns`, tables: the named columns of TSV/CSV/JSONL files (Tatoeba's `.txt` pair files read
as TSV). Both sides of a translation pair file then give one joint vocabulary, the one a
sequence-to-sequence model shares between its encoder and decoder.
"""

import os
import sys
import time
from collections.abc import Sequence

import tensorflow as tf
import tensorflow_text as tf_text
from tensorflow_text.python.ops import bert_tokenizer
from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as learner

from bert_trainer import features, outputs
from bert_trainer.data import bert_normalizer, sources, text_corpus
from bert_trainer.errors import UserError

_LINES_PER_ELEMENT = 1024  # Lines per dataset element: fewer, larger tokenizer calls.


TABLE_FORMATS = ("tsv", "csv", "jsonl")


def _line_dataset(files, texts_of, progress, failures: list) -> tf.data.Dataset:
    """The texts of `files` in batches; a UserError while reading ends the dataset early and
    is appended to `failures` (the caller raises it once the dataset is consumed).

    The error is not raised through tf.data: it would come out wrapped in an
    InvalidArgumentError, and the caller would drop the iterator while later stages still had
    calls into this generator in flight. Dropping it then waits for those calls, which wait
    for the GIL the dropping thread holds: the process hangs.
    """
    def lines():
        try:
            yield from _line_batches(files, texts_of, progress)
        except UserError as e:
            failures.append(e)

    return tf.data.Dataset.from_generator(
        lines, output_signature=tf.TensorSpec([None], tf.string))


def _line_batches(files, texts_of, progress):
    """Yields the non-blank texts of `files` in lists of `_LINES_PER_ELEMENT`, per file."""
    for i, path in enumerate(files, 1):
        if progress is not None:
            print(f"vocab: reading {path} ({i}/{len(files)})", file=progress, flush=True)
        batch = []
        for line in texts_of(path):
            if line.strip():
                batch.append(line)
            if len(batch) == _LINES_PER_ELEMENT:
                yield batch
                batch = []
        if batch:
            yield batch


def table_columns(columns: Sequence[str | int]) -> sources.TextColumns:
    """The `TextColumns` of one or two column selectors.

    Args:
      columns: header names or JSONL keys, or 0-based indices (ints or digit strings).

    Returns:
      `TextColumns` with `text` (and `text_b`) set and no label.

    Raises:
      UserError: not one or two columns, or the same column twice.
    """
    picked = [int(c) if isinstance(c, str) and c.strip().isdigit() else c for c in columns]
    picked = [c.strip() if isinstance(c, str) else c for c in picked]
    if not 1 <= len(picked) <= 2 or any(c == "" for c in picked):
        raise UserError(f"--columns={','.join(map(str, columns))} must name one or two "
                        "columns (e.g. --columns=english,spanish or --columns=0,1)")
    if len(picked) == 2 and picked[0] == picked[1]:
        raise UserError(f"--columns names '{picked[0]}' twice; give two different columns")
    return sources.TextColumns(text=picked[0], text_b=picked[1] if len(picked) == 2 else None,
                               label=None)


def table_texts(path: str, columns: sources.TextColumns, *, skip_bad_rows: bool = False):
    """The texts of `columns` in a TSV/CSV/JSONL file, row by row (`text` then `text_b`).

    TSV/CSV files start with a header row when a column is named, and have none when all are
    indices; `.txt` files are read as TSV (Tatoeba's `english<TAB>spanish<TAB>attribution`).

    Args:
      path: the file.
      columns: from `table_columns`.
      skip_bad_rows: skip rows that lack a column instead of failing.

    Returns:
      An iterator of strings; reading it raises UserError (naming file:line) on bad input.

    Raises:
      UserError: the file is not a table, or JSONL columns are indices (raised at once).
    """
    ext = os.path.splitext(path)[1].lower()
    fmt = "tsv" if ext == ".txt" else sources.FORMATS.get(ext)
    if fmt not in TABLE_FORMATS:
        raise UserError(f"--columns reads TSV, CSV or JSONL files (.tsv .csv .jsonl, or .txt "
                        f"as TSV); {path} is not one: rename it or drop --columns")
    named = [c for c in (columns.text, columns.text_b) if isinstance(c, str)]
    if fmt == "jsonl":
        if len(named) != len([c for c in (columns.text, columns.text_b) if c is not None]):
            raise UserError(f"{path}: JSONL rows are objects; give --columns as their keys, "
                            "not indices")
        records = sources.read_jsonl(path, columns, skip_bad_rows=skip_bad_rows)
    else:
        records = sources.read_table(path, columns, delimiter="\t" if fmt == "tsv" else ",",
                                     has_header=bool(named), skip_bad_rows=skip_bad_rows)
    return (text for record in records for text in (record.text, record.text_b)
            if text is not None)


def is_vocab_file(path: str) -> bool:
    """Whether `path` is a WordPiece vocabulary: UTF-8, one token a line, BERT's specials in it.

    This is what `vocab --overwrite` may replace; any other file is kept.
    """
    try:
        if os.path.getsize(path) > _LARGEST_VOCAB_BYTES:
            return False
        with open(path, encoding="utf-8") as f:
            tokens = f.read().split("\n")
    except (OSError, UnicodeDecodeError):
        return False
    if tokens and tokens[-1] == "":
        tokens.pop()
    if not all(t and t == t.strip() and len(t.split()) == 1 for t in tokens):
        return False
    return set(features.SPECIAL_TOKENS) <= set(tokens)


_LARGEST_VOCAB_BYTES = 16 << 20  # far above any WordPiece vocabulary (BERT's: 230 kB)
VOCAB = outputs.Kind("vocab", "a WordPiece vocabulary (one token a line, with [PAD] [UNK] "
                     "[CLS] [SEP] [MASK])", directory=False, recognizes=is_vocab_file)


def learn_vocab(inputs, vocab_size: int, output: str, *, lower_case: bool = True,
                encoding_errors: str = "strict", overwrite: bool = False,
                columns: Sequence[str | int] | None = None, skip_bad_rows: bool = False,
                progress=sys.stderr, **learn_params) -> dict:
    """Learns a WordPiece vocabulary and writes it as `vocab.txt`.

    Args:
      inputs: text files (or, with `columns`, TSV/CSV/JSONL files): comma list / globs (see
        `text_corpus.expand_inputs`).
      vocab_size: the most tokens in the vocabulary, special tokens included. The learner
        stops within 5 % below it; a small corpus may give fewer.
      output: path of the vocabulary file to write.
      lower_case: lower-case and strip accents first (uncased BERT); False keeps case and
        accents (`ñ`, `á`, `¿`). Use the same value for the tokenizer.
      encoding_errors: see `text_corpus.read_documents` (text files only; tables must be
        UTF-8).
      overwrite: replace an existing `output` that is a vocabulary (`is_vocab_file`); any
        other existing file is refused, and without it any existing file is.
      columns: one or two columns (header names, 0-based indices or JSONL keys) whose texts
        are learned from, e.g. both sides of a translation pair file; None reads text files.
      skip_bad_rows: with `columns`, skip rows lacking a column instead of failing.
      progress: stream for progress lines, or None.
      **learn_params: passed to tensorflow-text's `learn` (e.g. `lower_thresh`,
        `num_iterations`, `max_unique_chars`).

    Returns:
      dict with vocab_size (actual), requested, files, seconds, output.
    """
    if vocab_size <= len(features.SPECIAL_TOKENS):
        raise UserError(f"--vocab_size={vocab_size} must exceed the "
                        f"{len(features.SPECIAL_TOKENS)} special tokens (BERT uses 30522)")
    files = text_corpus.expand_inputs(inputs)
    text_corpus.check_not_outputs(
        files, inputs, {output: f"the vocabulary this run writes (--output={output})"})
    output = outputs.check_output(output, VOCAB, overwrite=overwrite)  # before the slow part
    text_corpus.check_encoding_errors(encoding_errors)
    texts_of = _texts_reader(files, columns, encoding_errors, skip_bad_rows)
    start = time.time()
    failures = []  # a UserError raised while reading (e.g. a line that is not UTF-8)
    # The text is normalized as the Tokenizer normalizes it (BERT's own table), so the learner
    # sees the characters the tokenizer will look up; its own lower_case would apply
    # NFKC_Casefold instead (`½` -> `1⁄2`), leaving such words without a piece.
    normalizer = tf_text.FastBertNormalizer(
        model_buffer=bert_normalizer.normalizer_model(lower_case))
    dataset = _line_dataset(files, texts_of, progress, failures).map(
        lambda lines: normalizer.normalize(bert_normalizer.mark_deleted(lines)))
    words = dataset.map(bert_tokenizer.BasicTokenizer(lower_case=False).tokenize)
    try:
        counts = learner.count_words(words)
    except StopIteration:  # The learner peeks at the first word of an empty count.
        if failures:
            raise failures[0] from None
        what = f"the columns {columns} of " if columns else ""
        raise UserError(f"{what}--input={inputs} holds no text; pass non-empty files") from None
    if failures:  # The reading stopped at a bad line (see `_line_dataset`).
        raise failures[0]
    vocab = learn_within(counts, vocab_size, list(features.SPECIAL_TOKENS), **learn_params)
    text = "".join(token + "\n" for token in vocab)
    # Written whole or not at all: a run killed mid-write must not leave a short vocabulary
    # that a rerun (the demo's, say) would take for a finished one.
    with outputs.new_file(output, writing="the vocabulary",
                          needed_bytes=len(text.encode("utf-8"))) as f:
        f.write(text)
    seconds = time.time() - start
    if progress is not None:
        print(f"vocab: wrote {len(vocab):,} tokens to {output} in {seconds:.1f}s",
              file=progress, flush=True)
    return {"vocab_size": len(vocab), "requested": vocab_size, "files": len(files),
            "seconds": round(seconds, 3), "output": output}


def learn_within(counts, vocab_size: int, reserved_tokens: list[str], **learn_params) -> list:
    """tensorflow-text's `learn`, with the vocabulary's size held to at most `vocab_size`.

    The learner's binary search over count thresholds can end on a threshold whose vocabulary
    is larger than asked (near the target the size is not monotone in the threshold, and the
    search stops when its bounds meet): e.g. 1,138 tokens for `--vocab_size=1000`. Then the
    thresholds are searched here, each learned alone, for the lowest whose vocabulary fits.

    Args:
      counts: {word: count}.
      vocab_size: the most tokens, reserved tokens included.
      reserved_tokens: the special tokens, first in the vocabulary.
      **learn_params: `learn`'s other arguments (`lower_thresh`, ...).

    Returns:
      The vocabulary, a list of at most `vocab_size` tokens.

    Raises:
      UserError: even the highest threshold (the single characters and the reserved tokens
        alone) gives more than `vocab_size` tokens.
    """
    vocab = learner.learn(counts, vocab_size, reserved_tokens, **learn_params)
    if len(vocab) <= vocab_size:
        return vocab
    low, high = max(int(learn_params.get("lower_thresh") or 1), 1), max(counts.values())
    best = None
    while low <= high:
        threshold = (low + high) // 2
        fixed = {**learn_params, "lower_thresh": threshold, "upper_thresh": threshold}
        candidate = learner.learn(counts, vocab_size, reserved_tokens, **fixed)
        if len(candidate) <= vocab_size:
            best, high = candidate, threshold - 1
        else:
            low = threshold + 1
    if best is None:
        raise UserError(f"--vocab_size={vocab_size} is smaller than the characters of the text "
                        f"alone ({len(vocab)} tokens at the highest count threshold); raise "
                        "--vocab_size")
    return best


def _texts_reader(files, columns, encoding_errors: str, skip_bad_rows: bool):
    """`path -> iterator of texts` for `learn_vocab`; tables are checked here, before the
    slow part, up to their first row (format, header, columns, an empty file)."""
    if columns is None:
        return lambda path: text_corpus.content_lines(path, encoding_errors)
    if encoding_errors != "strict":
        raise UserError(f"--encoding_errors={encoding_errors} applies to text files; the "
                        "--columns tables must be UTF-8 (a bad byte is reported by offset)")
    table = table_columns(columns)
    for path in files:
        next(table_texts(path, table, skip_bad_rows=skip_bad_rows), None)
    return lambda path: table_texts(path, table, skip_bad_rows=skip_bad_rows)
