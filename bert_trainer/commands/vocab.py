r"""`bert-train vocab`: learn a WordPiece vocabulary (vocab.txt) from text or pair files.

Uses tensorflow-text's BERT vocabulary learner; [PAD] [UNK] [CLS] [SEP] [MASK] come first
([PAD] is id 0). Examples:

  bert-train vocab --input='corpus/*.txt' --vocab_size=30522 --output=vocab.txt
  # one joint cased vocabulary (accents kept) from both sides of a translation pair file:
  bert-train vocab --input=spa_eng/train.tsv --columns=english,spanish --lower_case=false \
    --vocab_size=8000 --output=vocab.txt
"""

import sys

from absl import flags

from bert_trainer.commands import shared_flags
from bert_trainer.commands.shared_flags import Flag, Usage
from bert_trainer.errors import UserError

SHARED_FLAGS = shared_flags.declare(
    __name__,
    input=Usage(None, "Text files: comma-separated list and/or globs."),
    output=Usage(None, "Path of the vocab.txt to write (must be new, see --overwrite)."),
    overwrite=Usage(False, "Replace an existing --output that is a vocabulary (nothing else)."),
    lower_case=Usage(True, "Lower-case and strip accents (uncased model)."),
    encoding_errors=Usage("strict", "Lines that are not UTF-8: fail, replace bad bytes, or "
                          "skip the line (text files; --columns tables must be UTF-8)."),
    skip_bad_rows=Usage(False, "With --columns: skip rows lacking a column instead of failing."),
    vocab_size=Flag("integer", 30522, "Most tokens in the vocabulary (specials included)."),
    min_token_count=Flag(
        "integer", 10,
        "Lowest count the learner's threshold search tries (tensorflow-text's lower_thresh); "
        "lower it for a small corpus that gives too few tokens."),
    columns=Flag(
        "list", None,
        "Read --input as TSV/CSV/JSONL tables (.txt as TSV) and learn from these one or two "
        "columns: header names, 0-based indices (no header row) or JSONL keys; e.g. both sides "
        "of a translation pair file for one joint vocabulary."))


FLAGS = flags.FLAGS


def main(argv):
    del argv
    from bert_trainer.data.vocab import learn_vocab  # noqa: PLC0415 (imports TensorFlow)

    for name in ("input", "output"):
        if not FLAGS[name].value:
            raise UserError(f"--{name} is required (see 'bert-train vocab --help')")
    # progress: the stream of now (learn_vocab's default is bound when it is imported).
    learn_vocab(FLAGS.input, FLAGS.vocab_size, FLAGS.output, lower_case=FLAGS.lower_case,
                encoding_errors=FLAGS.encoding_errors, overwrite=FLAGS.overwrite,
                columns=FLAGS.columns, skip_bad_rows=FLAGS.skip_bad_rows,
                lower_thresh=FLAGS.min_token_count, progress=sys.stderr)
    return 0
