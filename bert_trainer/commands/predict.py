"""`bert-train predict`: answers for every line of a file, one JSON object per input.

  bert-train predict --saved_model=exports/sst2 --input=reviews.txt --output=-
  bert-train predict --model_dir=runs/squad --input=questions.jsonl --output=answers.jsonl

--input is read as text (one input a line), TSV (columns in the model's input order, or any
order under a header naming them) or JSONL (objects keyed by the input names), from the
extension unless --format says. A progress line goes to stderr. A line that cannot be read is
reported with its number and skipped (--on_error=skip), or stops the run with exit code 2
(--on_error=stop). With --model_dir the model is wrapped in-process as an export, but runs
the fused kernels and token packing where this process has them. Inputs are read in windows
of --window_batches batches, sorted by length, and answered in input order; the final line
gives the inputs/s and the share of the model's token slots that was padding.
"""

import sys

from absl import flags

from bert_trainer.commands import require_flags, shared_flags
from bert_trainer.commands.shared_flags import Flag, Usage
from bert_trainer.errors import UserError
from bert_trainer.export import predict
from bert_trainer.tasks import plugins

SHARED_FLAGS = shared_flags.declare(
    __name__,
    model_dir=Usage(None, "Model directory written by finetune."),
    input=Usage(None, "Input file, or - for stdin."),
    output=Usage("-", "Output JSON lines file, or - for stdout."),
    overwrite=Usage(False, "Replace an existing --output file that holds predictions "
                    "(nothing else); it is replaced only once every input is answered."),
    batch_size=Usage(32, "Inputs per model call."),
    checkpoint=Usage(None, "With --model_dir: best, latest, a step or a prefix in it."),
    seq_length=Usage(None, "With --model_dir: packed sequence length."),
    family_module=Usage(None, "Comma-separated modules that register task families of your "
                        "own (plugins); a model_dir and an export record "
                        "their family's module, so this is needed only where it moved."),
    saved_model=Usage(None, "Directory written by 'bert-train export'."),
    trust_saved_model=Usage(False, "Load the --saved_model even if its graph holds ops "
                            "bert-train's exports never use (files, Python, network): "
                            "only one whose source you trust."),
    format=Flag(
        "enum", None,
        "Input format; default: from the extension (.tsv, .jsonl/.json, else text).",
        enum_values=list(predict.FORMATS)),
    window_batches=Flag(
        "integer", 32,
        "Batches per length window: this many batches of inputs are read, sorted by length and "
        "batched (less padding); answers keep the input order. 1: batches in input order "
        "(answers sooner).",
        lower_bound=1),
    on_error=Flag(
        "enum", "skip",
        "What an unreadable line does: skip (report, count, go on) or stop (exit 2).",
        enum_values=list(predict.ON_ERROR)))
FLAGS = flags.FLAGS


def main(argv):
    del argv
    require_flags("input")
    if (FLAGS.model_dir is None) == (FLAGS.saved_model is None):
        raise UserError("pass exactly one of --model_dir (a trained run) and --saved_model "
                        "(an export)")
    predict.check_output(FLAGS.output, FLAGS.overwrite)  # before the slow part
    plugins.import_family_modules(FLAGS.family_module)
    predictor = predict.load_predictor(model_dir=FLAGS.model_dir, saved_model=FLAGS.saved_model,
                                       checkpoint=FLAGS.checkpoint, seq_length=FLAGS.seq_length,
                                       trust_saved_model=FLAGS.trust_saved_model)
    summary = predict.run_predict(predictor, FLAGS.input, FLAGS.output, fmt=FLAGS.format,
                                  batch_size=FLAGS.batch_size,
                                  window_batches=FLAGS.window_batches,
                                  on_error=FLAGS.on_error, overwrite=FLAGS.overwrite)
    skipped = f", skipped {summary.skipped} unreadable lines" if summary.skipped else ""
    print(f"predict: {summary.report()}{skipped}", file=sys.stderr)
    return 0
