"""`bert-train export`: a text-in TensorFlow SavedModel from a model directory.

  bert-train export --model_dir=runs/sst2 --output=exports/sst2
  bert-train export --model_dir=runs/squad --output=exports/squad --checkpoint=latest

The SavedModel holds the tokenizer (vocab.txt as an asset) and the post-processing, so it
answers raw strings and needs only tensorflow + tensorflow-text to run. Signatures:
serving_default (text in: classification/regression `text[, text_b]`, QA `question, context`,
tagging `text`, a causal LM `prompt`), serving_ids and encode (token ids in). A pretraining
model directory exports `encode` only; a causal LM's export generates (see `bert-train
generate --saved_model`). See bert_trainer/export/__init__.py for every input and output.
"""

from absl import flags

from bert_trainer.commands import require_flags, shared_flags
from bert_trainer.commands.shared_flags import Usage
from bert_trainer.export import export_saved_model
from bert_trainer.tasks import plugins

SHARED_FLAGS = shared_flags.declare(
    __name__,
    model_dir=Usage(None, "Model directory written by finetune (or pretrain)."),
    output=Usage(None, "Export directory to write (must be new or empty, see --overwrite); "
                 "not in or above --model_dir."),
    checkpoint=Usage(None, "best, latest, a step or a checkpoint prefix in --model_dir; "
                     "default: best when model_dir/best/ holds one, else latest."),
    seq_length=Usage(None, "Packed sequence length of the text signatures; default: the "
                     "task's seq_length."),
    overwrite=Usage(False, "Replace an --output that bert-train export wrote (a SavedModel and "
                    "nothing else)."),
    family_module=Usage(None, "Comma-separated modules that register task families of your "
                        "own (plugins); a model_dir records its family's module, so this is "
                        "needed only where that module moved."))
FLAGS = flags.FLAGS


def main(argv):
    del argv
    require_flags("model_dir", "output")
    plugins.import_family_modules(FLAGS.family_module)
    result = export_saved_model(FLAGS.model_dir, FLAGS.output, checkpoint=FLAGS.checkpoint,
                                seq_length=FLAGS.seq_length, overwrite=FLAGS.overwrite)
    print(f"exported {result['family']} model (seq_length {result['seq_length']}) to "
          f"{result['output']}")
    for name, sig in result["signatures"].items():
        print(f"  {name}({', '.join(sig['inputs'])}) -> {', '.join(sig['outputs'])}")
    return 0
