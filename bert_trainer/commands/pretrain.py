"""`bert-train pretrain`: pretrain a BERT encoder (masked LM + next sentence) or a causal
language model (next token, GPT-style) from gin configs.

The gin files choose the objective (`pretraining_objective.name`: "masked_lm", the default,
or "causal_lm"), the model (`build_encoder.*` / `build_causal_lm.*`), the data
(`PretrainingConfig.*` / `CausalLMConfig.*`), the optimizer (`OptimizerConfig.*`) and the loop
(`TrainerConfig.*`); the data flags below override the files. A run in a model_dir that holds
checkpoints resumes from the latest one. Examples:

  bert-train pretrain --gin_file=configs/mini.gin --model_dir=runs/mini \\
      --train_data='data/train-*.tfrecord' --eval_data='data/eval-*.tfrecord' \\
      --vocab_file=vocab.txt
  bert-train pretrain --gin_file=configs/causal_lm/mini.gin --model_dir=runs/gpt-mini \\
      --train_data='data/causal-*.tfrecord' --vocab_file=vocab.txt
  bert-train pretrain --gin_file=configs/cram.gin --model_dir=runs/cram-20m --time_budget=20m \\
      --train_data='data/train-*.tfrecord' --vocab_file=vocab.txt
  bert-train pretrain --gin_file=configs/mini.gin --model_dir=runs/minilm-reviews \\
      --init_checkpoint=all-MiniLM-L6-v2 --train_data='data/reviews-*.tfrecord' \\
      --time_budget=20m --gin_param='OptimizerConfig.learning_rate = 1e-4'

With --time_budget the learning-rate schedule runs on the fraction of the budget spent
(`training/time_budget.py`). --init_checkpoint on a Hugging Face or Google BERT directory
continues its masked-LM pretraining: the encoder and vocabulary are the directory's.
"""

from absl import flags

from bert_trainer import durations
from bert_trainer.commands import common, shared_flags
from bert_trainer.commands.shared_flags import Flag, Usage

flags.adopt_module_key_flags(common)
SHARED_FLAGS = {**common.SHARED_FLAGS, **shared_flags.declare(
    __name__,
    vocab_file=Usage(None, "The WordPiece vocab.txt (default: the one of --init_checkpoint's "
                     "model directory); overrides PretrainingConfig.vocab_file."),
    init_checkpoint=Usage(None, "Warm start from a bert-train model directory or checkpoint "
                          "prefix, or continue pretraining a Hugging Face / Google BERT "
                          "directory (fresh runs only); its config fixes the encoder and its "
                          "vocabulary the data's."),
    train_data=Flag(
        "string", None,
        "Training TFRecords (glob, comma list allowed); overrides PretrainingConfig.train_data."),
    eval_data=Flag(
        "string", None,
        "Held-out TFRecords; overrides PretrainingConfig.eval_data. Without any, training runs "
        "with no evaluation."),
    time_budget=Flag(
        "string", None,
        "Train for this wall-clock time, e.g. 90s, 20m, 1.5h: the learning-rate schedule runs "
        "on the fraction of the budget spent, the run stops and checkpoints when it is spent "
        "(train_steps only shapes the schedule); overrides TrainerConfig.time_budget."))}

FLAGS = flags.FLAGS


def main(argv):
    del argv
    from bert_trainer.runs import pretraining  # noqa: PLC0415 (imports TensorFlow)

    common.setup_logging(FLAGS["verbosity"].present)
    model_dir = common.check_model_dir(FLAGS.model_dir)
    budget = (durations.parse_duration(FLAGS.time_budget, "--time_budget")
              if FLAGS.time_budget is not None else None)
    settings = pretraining.PretrainSettings(
        gin_files=tuple(FLAGS.gin_file), gin_params=tuple(FLAGS.gin_param),
        train_data=FLAGS.train_data, eval_data=FLAGS.eval_data, vocab_file=FLAGS.vocab_file,
        init_checkpoint=FLAGS.init_checkpoint, time_budget=budget, strategy=FLAGS.strategy,
        tpu=FLAGS.tpu)
    pretraining.parse_config(settings)
    with common.one_line_errors(), common.model_dir_lock(model_dir, "pretrain", FLAGS.strategy):
        run = pretraining.build_pretraining_run(settings, model_dir)
        with pretraining.named_data_faults(run):
            return common.train_and_report(run.trainer, "pretrain")
