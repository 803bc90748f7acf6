"""`bert-train vocab`: learn a WordPiece vocabulary (vocab.txt) from text files.

Uses tensorflow-text's BERT vocabulary learner; [PAD] [UNK] [CLS] [SEP] [MASK] come first
([PAD] is id 0). Example:

  bert-train vocab --input='corpus/*.txt' --vocab_size=30522 --output=vocab.txt
"""

import sys

from absl import flags

from bert_trainer.commands import shared_flags
from bert_trainer.commands.shared_flags import Usage
from bert_trainer.errors import UserError

SHARED_FLAGS = shared_flags.declare(
    __name__,
    input=Usage(None, "Text files: comma-separated list and/or globs."),
    output=Usage(None, "Path of the vocab.txt to write (must be new, see --overwrite)."),
    overwrite=Usage(False, "Replace an existing --output that is a vocabulary (nothing else)."),
    lower_case=Usage(True, "Lower-case and strip accents (uncased model)."),
    encoding_errors=Usage("strict", "Lines that are not UTF-8: fail, replace bad bytes, or "
                          "skip the line."))
flags.DEFINE_integer("vocab_size", 30522, "Most tokens in the vocabulary (specials included).")
flags.DEFINE_integer("min_token_count", 10,
                     "Lowest count the learner's threshold search tries (tensorflow-text's "
                     "lower_thresh); lower it for a small corpus that gives too few tokens.")

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
                lower_thresh=FLAGS.min_token_count,
                progress=sys.stderr)
    return 0
