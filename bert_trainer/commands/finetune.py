"""`bert-train finetune`: fine-tune a pretrained encoder on a task (classification, QA, tagging).

  bert-train finetune --task=sst2 --train_file=SST-2/train.tsv --eval_file=SST-2/dev.tsv \\
      --init_checkpoint=models/bert_base --model_dir=runs/sst2
  bert-train finetune --task=imdb --data_dir=~/tensorflow_datasets \\
      --init_checkpoint=models/bert_base --model_dir=runs/imdb
  bert-train finetune --task=classification --train_file=reviews.csv --eval_file=dev.csv \\
      --text_column=review --label_column=stars --init_checkpoint=... --model_dir=...

Tasks: imdb, the GLUE tasks, squad, squad_v2, conll2003, ted_hrlr_translate/pt_to_en,
wmt14_translate/de-en (TFDS, or their files with --train_file/--eval_file; GLUE TSVs are read
with GLUE's column layout), and classification, regression, tagging, translate for files of
your own (translate: sentence pairs, --source_column/--target_column). --init_checkpoint is a
bert-train model directory, a Hugging Face or a Google BERT directory; it fixes the encoder and
the vocabulary. Only the encoder is warm-started; the head starts fresh (translate: BERT2BERT,
the decoder from the same weights but its cross-attention).

Configuration, each layer overriding the previous: the task family's recipe
(configs/tasks/<family>.gin: AdamW, 10 % warmup, batch 32, sequence 128, 3 epochs), --gin_file,
--gin_param, then the flags below. A task family of your own (a plugin, see
bert_trainer/tasks/family.py) is imported with --family_module=my.module, the
BERT_TRAIN_FAMILIES environment variable or the `bert_train.families` entry points. The
number of steps is --train_steps, else epochs x training examples / batch. A run in a
model_dir holding checkpoints resumes, as the same task (labels, sequence length, encoder,
vocabulary): another is refused. A model_dir belongs to one run at a time (a lock file). The
final evaluation goes to model_dir/eval_results.json.

Seeds: --seeds=1,2,3 (or --num_seeds=N: the seeds 1..N) runs the whole fine-tune once per seed
into model_dir/seed-N/ and writes each seed's metrics with their mean, sample standard deviation
(n - 1), min and max to model_dir/eval_results.json, printed as `accuracy 0.835 ± 0.004 (3
seeds)`. Each seed gives two separate streams: the head's initialization and dropout
(TrainerConfig.seed) and the data order (FinetuneConfig.seed), derived as
bert_trainer/tasks/multi_seed.py says; a rerun skips finished seeds and resumes a half-done one.
Texts longer than --seq_length (classification, tagging) are cut into windows --doc_stride
pieces apart: every window trains as a row (so the step count counts windows), and the
evaluation, `predict` and the export combine a text's windows (classification: the mean of
their logits, or --window_pooling=max; tagging: each word from the window where it has the
most context). --long_texts=truncate keeps the first pieces instead, --long_texts=head_tail
(single-text classification) the first quarter of the row and the text's last pieces.
"""

import functools

from absl import flags

from bert_trainer.commands import common, finetune_seeds, shared_flags
from bert_trainer.commands.shared_flags import Flag, Usage
from bert_trainer.errors import UserError

# Flags read into `runs.finetuning.FinetuneSettings` as they are.
_PLAIN = ("task", "model_dir", "family_module", "num_seeds", "init_checkpoint", "vocab_file",
          "lower_case", "header", "seq_length", "batch_size", "num_epochs", "learning_rate",
          "train_steps", "fit_batch", "micro_batch_size", "long_texts", "doc_stride",
          "window_pooling", "strategy", "tpu")
# The data flags, read into `tasks.finetuning.DataConfig`.
_DATA = ("train_file", "eval_file", "data_dir", "max_train_examples", "max_eval_examples")

flags.adopt_module_key_flags(common)
SHARED_FLAGS = {**common.SHARED_FLAGS, **shared_flags.declare(
    __name__,
    task=Usage(None, "Task name (unknown names list the known ones)."),
    eval_file=Usage(None, "Local evaluation file; default: the task's TFDS validation split."),
    data_dir=Usage(None, "TFDS data directory holding the prepared dataset."),
    skip_bad_rows=Usage(False, "Skip and count malformed rows instead of failing."),
    family_module=Usage(None, "Comma-separated modules that register task families of your "
                        "own (plugins), imported before --task is looked up."),
    init_checkpoint=Usage(None, "Pretrained model: a bert-train model directory or checkpoint "
                          "prefix, or a Hugging Face / Google BERT directory."),
    vocab_file=Usage(None, "WordPiece vocab.txt; default: --init_checkpoint's (from scratch, "
                     "it also sets build_encoder.vocab_size)."),
    lower_case=Usage(None, "Lower-case text; default: --init_checkpoint's (from scratch: "
                     "cased when --vocab_file has capitals)."),
    seq_length=Usage(None, "Sequence length (FinetuneConfig.seq_length)."),
    batch_size=Usage(None, "Global training batch (FinetuneConfig.train_batch_size)."),
    max_eval_examples=Usage(None, "Evaluate on the first N examples only."),
    train_file=Flag(
        "string", None,
        "Local training file (TSV/CSV/JSONL, SQuAD JSON, CoNLL); default: the task's TFDS "
        "dataset."),
    text_column=Flag(
        "string", None,
        "TSV/CSV header name (or 0-based index) or JSONL key of the text; default: the task's "
        "preset, else 'text'."),
    text_b_column=Flag("string", None, "Column of the second text of a pair."),
    label_column=Flag(
        "string", None,
        "Column of the label; default: the task's preset, else 'label'."),
    source_column=Flag(
        "string", None,
        "translate: TSV/CSV header name (or 0-based index) or JSONL key of the source text; "
        "default: the first column ('source')."),
    target_column=Flag(
        "string", None,
        "translate: column of the target text; default: the second column ('target')."),
    header=Flag(
        "boolean", None,
        "Whether TSV/CSV files start with a header row (default: the task's preset, else yes)."),
    label_names=Flag(
        "list", None,
        "Class names (tags) in id order; default: the task's, else the sorted labels of "
        "--train_file."),
    learning_rate=Flag("float", None, "Peak learning rate (OptimizerConfig.learning_rate)."),
    num_epochs=Flag("float", None, "Epochs (FinetuneConfig.num_epochs)."),
    train_steps=Flag(
        "integer", None,
        "Optimizer steps, instead of epochs (TrainerConfig.train_steps)."),
    max_train_examples=Flag("integer", None, "Train on the first N examples only."),
    seeds=Flag(
        "list", None,
        "Run the fine-tune once per seed (integers >= 0) into model_dir/seed-N/ and report each "
        "metric's mean and spread."),
    num_seeds=Flag("integer", None, "Like --seeds=1,...,N."),
    fit_batch=Flag(
        "boolean", None,
        "Compute --batch_size in the largest micro-batches that fit memory, accumulating "
        "gradients (TrainerConfig.fit_batch; default: on)."),
    micro_batch_size=Flag(
        "integer", None,
        "Force this per-replica micro-batch (it must divide the per-replica batch; "
        "TrainerConfig.micro_batch_size)."),
    long_texts=Flag(
        "enum", None,
        "Texts longer than --seq_length (classification, tagging): windows (the default: "
        "overlapping windows, each trained as a row, combined to predict), truncate (the first "
        "pieces) or head_tail (single-text classification: the first quarter and the last three "
        "quarters) (FinetuneConfig.long_texts).",
        enum_values=["windows", "truncate", "head_tail"]),
    doc_stride=Flag(
        "integer", None,
        "Word pieces between the starts of a long text's windows (FinetuneConfig.doc_stride, "
        "default half a window; SQuAD: SquadConfig.doc_stride).",
        lower_bound=1),
    window_pooling=Flag(
        "enum", None,
        "How a text's window logits combine (classification, regression; "
        "FinetuneConfig.window_pooling, default mean).",
        enum_values=["mean", "max"]))}
flags.mark_flags_as_mutual_exclusive(["num_epochs", "train_steps"])


def main(argv):
    del argv
    from bert_trainer.runs import finetuning  # noqa: PLC0415 (imports TensorFlow)
    from bert_trainer.tasks import multi_seed, plugins, registry  # noqa: PLC0415

    common.setup_logging(flags.FLAGS["verbosity"].present)
    settings = settings_from_flags(flags.FLAGS)
    seeds = multi_seed.parse_seeds(settings.seeds, settings.num_seeds)
    plugins.import_family_modules(settings.family_module)
    if not settings.task:
        raise UserError(f"--task is required; choose one of: {', '.join(registry.task_names())}")
    registry.family_of(settings.task)  # an unknown task is refused first, listing the known
    model_dir = common.check_model_dir(settings.model_dir)
    shared_flags.check_input_files(train_file=settings.data.train_file,
                                   eval_file=settings.data.eval_file,
                                   vocab_file=settings.vocab_file)
    if not settings.init_checkpoint and not settings.vocab_file:
        raise UserError("--init_checkpoint is required: a pretrained bert-train, Hugging Face "
                        "or Google BERT directory (or, to train from scratch, --vocab_file and "
                        "a --gin_file binding build_encoder.*)")
    finetuning.parse_config(settings)
    if seeds is not None:
        return finetune_seeds.run_seeds(model_dir, seeds, settings,
                                        functools.partial(_run_one, settings))
    multi_seed.check_single_run_dir(model_dir)
    with common.one_line_errors(), common.model_dir_lock(model_dir, "finetune",
                                                           settings.strategy):
        return _run_one(settings, model_dir)


def settings_from_flags(values: flags.FlagValues):
    """The command line `values` read into the run's settings (`runs.finetuning`).

    Raises:
      UserError: a data flag out of range (`finetuning.DataConfig` checks them).
    """
    from bert_trainer.runs.finetuning import COLUMN_FLAGS, FinetuneSettings  # noqa: PLC0415
    from bert_trainer.tasks import finetuning  # noqa: PLC0415

    def listed(name):
        value = getattr(values, name)
        return None if value is None else tuple(value)

    data = finetuning.DataConfig(**{name: getattr(values, name) for name in _DATA},
                                 skip_bad_rows=bool(values.skip_bad_rows))
    return FinetuneSettings(**{name: getattr(values, name) for name in _PLAIN},
                            seeds=listed("seeds"), label_names=listed("label_names"), data=data,
                            columns={name: getattr(values, name) for name in COLUMN_FLAGS
                                     if getattr(values, name) is not None},
                            gin_files=tuple(values.gin_file), gin_params=tuple(values.gin_param))


def _run_one(settings, model_dir: str, label: str = "") -> int:
    """One fine-tune into `model_dir` (locked by the caller) from the parsed gin config;
    `label` goes before the summary line, e.g. "seed 2: ". Returns the exit code."""
    from bert_trainer.runs import finetuning  # noqa: PLC0415

    run = finetuning.build_finetuning_run(settings, model_dir)
    report = run.task.warm_start_report
    if report is not None:
        print(f"bert-train finetune: {label}warm start from {settings.init_checkpoint}: loaded "
              f"{len(report['loaded'])} encoder variables; left initialized: "
              f"{', '.join(report['initialized']) or 'none'}", flush=True)
    return common.train_and_report(run.trainer, "finetune", label=label,
                                   write_results=finetuning.write_eval_results)
