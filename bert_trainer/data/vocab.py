"""Learning a WordPiece vocabulary with tensorflow-text's BERT vocabulary learner.

Text is streamed from the files (Project Gutenberg headers skipped) through
`tensorflow_text.tools.wordpiece_vocab.bert_vocab_from_dataset`, which splits words the way
BERT's basic tokenizer does, counts them and searches for a count threshold giving at most
`vocab_size` tokens. The special tokens come first, so `[PAD]` is id 0.
"""

import os
import sys
import time

import tensorflow as tf
import tensorflow_text as tf_text
from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset as bert_vocab

from bert_trainer import features, outputs
from bert_trainer.data import bert_normalizer, text_corpus
from bert_trainer.errors import UserError

_LINES_PER_ELEMENT = 1024  # Lines per dataset element: fewer, larger tokenizer calls.


def _line_dataset(files, encoding_errors: str, progress, failures: list) -> tf.data.Dataset:
    def lines():
        try:
            yield from _line_batches(files, encoding_errors, progress)
        except UserError as e:  # tf.data would wrap it in an InvalidArgumentError
            failures.append(e)
            raise

    return tf.data.Dataset.from_generator(
        lines, output_signature=tf.TensorSpec([None], tf.string))


def _line_batches(files, encoding_errors: str, progress):
    """Yields the non-blank lines of `files` in lists of `_LINES_PER_ELEMENT`, per file."""
    for i, path in enumerate(files, 1):
        if progress is not None:
            print(f"vocab: reading {path} ({i}/{len(files)})", file=progress, flush=True)
        batch = []
        for line in text_corpus.content_lines(path, encoding_errors):
            if line.strip():
                batch.append(line)
            if len(batch) == _LINES_PER_ELEMENT:
                yield batch
                batch = []
        if batch:
            yield batch


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
                encoding_errors: str = "strict", overwrite: bool = False, progress=sys.stderr,
                **learn_params) -> dict:
    """Learns a WordPiece vocabulary and writes it as `vocab.txt`.

    Args:
      inputs: text files: comma list / globs (see `text_corpus.expand_inputs`).
      vocab_size: the most tokens in the vocabulary, special tokens included. The learner
        stops within 5 % below it; a small corpus may give fewer.
      output: path of the vocabulary file to write.
      lower_case: lower-case and strip accents first (uncased BERT); use the same value for
        the tokenizer.
      encoding_errors: see `text_corpus.read_documents`.
      overwrite: replace an existing `output` that is a vocabulary (`is_vocab_file`); any
        other existing file is refused, and without it any existing file is.
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
    output = outputs.check_output(output, VOCAB, overwrite=overwrite)  # before the slow part
    if encoding_errors not in text_corpus.ENCODING_ERRORS:
        raise UserError(f"encoding_errors='{encoding_errors}' is unknown; "
                        f"use one of {text_corpus.ENCODING_ERRORS}")
    start = time.time()
    failures = []  # a UserError raised while reading (e.g. a line that is not UTF-8)
    # The text is normalized as the Tokenizer normalizes it (BERT's own table), so the learner
    # sees the characters the tokenizer will look up; its own lower_case would apply
    # NFKC_Casefold instead (`½` -> `1⁄2`), leaving such words without a piece.
    normalizer = tf_text.FastBertNormalizer(
        model_buffer=bert_normalizer.normalizer_model(lower_case))
    dataset = _line_dataset(files, encoding_errors, progress, failures).map(
        lambda lines: normalizer.normalize(bert_normalizer.mark_deleted(lines)))
    try:
        vocab = bert_vocab.bert_vocab_from_dataset(
            dataset, vocab_size=vocab_size, reserved_tokens=list(features.SPECIAL_TOKENS),
            bert_tokenizer_params={"lower_case": False}, learn_params=learn_params)
    except StopIteration:  # The learner peeks at the first word of an empty count.
        raise UserError(f"--input={inputs} holds no text; pass non-empty files") from None
    except tf.errors.OpError:
        if failures:
            raise failures[0] from None
        raise
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
