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
import os
import re

from absl import flags, logging

from bert_trainer import outputs
from bert_trainer.commands import common, finetune_seeds, shared_flags
from bert_trainer.commands.finetune_settings import FinetuneSettings
from bert_trainer.commands.shared_flags import Usage

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
    max_eval_examples=Usage(None, "Evaluate on the first N examples only."))}
flags.DEFINE_string("train_file", None, "Local training file (TSV/CSV/JSONL, SQuAD JSON, "
                    "CoNLL); default: the task's TFDS dataset.")
flags.DEFINE_string("text_column", None, "TSV/CSV header name (or 0-based index) or JSONL key "
                    "of the text; default: the task's preset, else 'text'.")
flags.DEFINE_string("text_b_column", None, "Column of the second text of a pair.")
flags.DEFINE_string("label_column", None, "Column of the label; default: the task's preset, "
                    "else 'label'.")
flags.DEFINE_string("source_column", None, "translate: TSV/CSV header name (or 0-based index) "
                    "or JSONL key of the source text; default: the first column ('source').")
flags.DEFINE_string("target_column", None, "translate: column of the target text; default: "
                    "the second column ('target').")
flags.DEFINE_boolean("header", None, "Whether TSV/CSV files start with a header row "
                     "(default: the task's preset, else yes).")
flags.DEFINE_list("label_names", None, "Class names (tags) in id order; default: the task's, "
                  "else the sorted labels of --train_file.")
shared_flags.define_float(__name__, "learning_rate", None,
                          "Peak learning rate (OptimizerConfig.learning_rate).")
shared_flags.define_float(__name__, "num_epochs", None, "Epochs (FinetuneConfig.num_epochs).")
flags.DEFINE_integer("train_steps", None, "Optimizer steps, instead of epochs "
                     "(TrainerConfig.train_steps).")
flags.DEFINE_integer("max_train_examples", None, "Train on the first N examples only.")
flags.mark_flags_as_mutual_exclusive(["num_epochs", "train_steps"])
flags.DEFINE_list("seeds", None, "Run the fine-tune once per seed (integers >= 0) into "
                  "model_dir/seed-N/ and report each metric's mean and spread.")
flags.DEFINE_integer("num_seeds", None, "Like --seeds=1,...,N.")
flags.DEFINE_boolean("fit_batch", None, "Compute --batch_size in the largest micro-batches that "
                     "fit memory, accumulating gradients (TrainerConfig.fit_batch; default: on).")
flags.DEFINE_integer("micro_batch_size", None, "Force this per-replica micro-batch (it must "
                     "divide the per-replica batch; TrainerConfig.micro_batch_size).")
flags.DEFINE_enum("long_texts", None, ["windows", "truncate", "head_tail"],
                  "Texts longer than --seq_length (classification, tagging): windows (the "
                  "default: overlapping windows, each trained as a row, combined to predict), "
                  "truncate (the first pieces) or head_tail (single-text classification: the "
                  "first quarter and the last three quarters) (FinetuneConfig.long_texts).")
flags.DEFINE_integer("doc_stride", None, "Word pieces between the starts of a long text's "
                     "windows (FinetuneConfig.doc_stride, default half a window; SQuAD: "
                     "SquadConfig.doc_stride).", lower_bound=1)
flags.DEFINE_enum("window_pooling", None, ["mean", "max"], "How a text's window logits combine "
                  "(classification, regression; FinetuneConfig.window_pooling, default mean).")


def main(argv):
    del argv
    from bert_trainer.errors import UserError  # noqa: PLC0415
    from bert_trainer.tasks import multi_seed, registry  # noqa: PLC0415 (imports TensorFlow)

    common.setup_logging(flags.FLAGS["verbosity"].present)
    settings = FinetuneSettings.from_flags()
    seeds = multi_seed.parse_seeds(settings.seeds, settings.num_seeds)
    registry.import_family_modules(settings.family_module)
    if not settings.task:
        raise UserError(f"--task is required; choose one of: {', '.join(registry.task_names())}")
    family = registry.family_of(settings.task)
    model_dir = common.check_model_dir(settings.model_dir)
    shared_flags.check_input_files(train_file=settings.data.train_file,
                                   eval_file=settings.data.eval_file,
                                   vocab_file=settings.vocab_file)
    if not settings.init_checkpoint and not settings.vocab_file:
        raise UserError("--init_checkpoint is required: a pretrained bert-train, Hugging Face "
                        "or Google BERT directory (or, to train from scratch, --vocab_file and "
                        "a --gin_file binding build_encoder.*)")
    gin_files = [*([family.recipe] if family.recipe else []), *settings.gin_files]
    flag_bindings = functools.partial(settings.gin_bindings, family)
    parse_config(settings)
    if seeds is not None:
        single = finetune_seeds.SingleRun(
            flag_bindings=flag_bindings, plan=functools.partial(_plan, settings),
            run_one=functools.partial(_run_one, settings))
        return finetune_seeds.run_seeds(model_dir, seeds, gin_files, single, settings)
    multi_seed.check_single_run_dir(model_dir)
    with common.one_line_errors(), common.model_dir_lock(model_dir, "finetune",
                                                           settings.strategy):
        return _run_one(settings, model_dir)


def _register_family_configs(family) -> None:
    """Makes the family's option classes gin-configurable before the .gin files are parsed."""
    from bert_trainer import configurables  # noqa: PLC0415

    for config_class in family.gin_configs.values():
        configurables.configurable(config_class)


def parse_config(settings: FinetuneSettings) -> None:
    """Parses gin as the command does: the family's recipe, then `settings.gin_files`, then
    `settings.gin_params`, then the hyperparameter settings as bindings (the family's option
    classes registered first)."""
    from bert_trainer.tasks import registry  # noqa: PLC0415

    family = registry.family_of(settings.task)
    _register_family_configs(family)
    common.parse_gin([*([family.recipe] if family.recipe else []), *settings.gin_files],
                     settings.gin_params, settings.gin_bindings(family))


def build_run(settings: FinetuneSettings, model_dir: str, strategy):
    """The task and the `Trainer` (warm-started, or resumed from `model_dir`) that a run of
    the command with `settings` trains, after `parse_config`: for a caller that drives the
    steps itself (the fine-tuning benchmark, `scripts/bench/finetune_step.py`).

    Args:
      settings: the command's settings.
      model_dir: the run's directory.
      strategy: the `tf.distribute` strategy (the command's: --strategy/--tpu).
    """
    task, run_settings = _plan(settings)
    return task, _build_trainer(settings, task, model_dir, run_settings, strategy)


def _run_one(settings: FinetuneSettings, model_dir: str, label: str = "") -> int:
    """One fine-tune into `model_dir` (locked by the caller) from the parsed gin config.

    Args:
      settings: the command's flags.
      model_dir: the run's directory.
      label: put before the summary line, e.g. "seed 2: ".

    Returns:
      The exit code.
    """
    task, run_settings = _plan(settings)
    trainer = _build_trainer(settings, task, model_dir, run_settings)
    _print_warm_start(settings, task, label)
    return common.train_and_report(trainer, "finetune", label=label,
                                   write_results=_write_eval_results)


def _plan(settings: FinetuneSettings):
    """The task, built with its inputs read, and the run's derived settings: what a run checks
    before it writes anything."""
    task = _build_task(settings)
    _check_inputs(settings, task)
    return task, _derive_settings(settings, task)


def _encoder_spec(settings: FinetuneSettings):
    """The encoder of --init_checkpoint, or the gin-configured one when training from scratch."""
    from bert_trainer import configurables  # noqa: PLC0415
    from bert_trainer.data import tokenizer  # noqa: PLC0415
    from bert_trainer.tasks import finetuning  # noqa: PLC0415

    if settings.init_checkpoint:
        return finetuning.spec_from_checkpoint(settings.init_checkpoint,
                                               vocab_file=settings.vocab_file,
                                               lower_case=settings.lower_case)
    logging.warning("No --init_checkpoint: the encoder is built from gin and trained from "
                    "scratch")
    vocab = tokenizer.load_vocab(settings.vocab_file)
    derived = {}
    # The vocabulary sizes the embeddings: an encoder size file's BERT vocab_size (30522)
    # describes BERT's vocabulary, not this one; only a --gin_param binding overrides it.
    if not any(re.match(r"\s*build_encoder\.vocab_size\s*=", p) for p in settings.gin_params):
        derived["vocab_size"] = len(vocab)
    lower_case = settings.lower_case
    if lower_case is None:  # a vocabulary with capitals was learned from cased text
        lower_case = not tokenizer.vocab_is_cased(vocab)
    logging.info("From scratch: %slower_case=%s, from --vocab_file=%s",
                 "".join(f"{k}={v}, " for k, v in derived.items()), lower_case,
                 settings.vocab_file)
    encoder = common.build_configured(
        functools.partial(configurables.build_encoder, **derived), "build_encoder")
    return finetuning.spec_from_encoder(encoder, vocab_file=settings.vocab_file,
                                        lower_case=lower_case)


def _build_task(settings: FinetuneSettings):
    """The task of --task with the data flags, the gin configs and the encoder spec."""
    from bert_trainer import configurables  # noqa: PLC0415
    from bert_trainer.tasks import registry  # noqa: PLC0415

    task_data = registry.resolve_task_data(
        settings.task, **settings.column_arguments(registry.family_of(settings.task)),
        has_header=settings.header,
        label_names=list(settings.label_names) if settings.label_names else None,
        train_file=settings.data.train_file, skip_bad_rows=settings.data.skip_bad_rows)
    config = common.build_configured(configurables.FinetuneConfig, "FinetuneConfig")
    options = {key: common.build_configured(configurables.configurable(config_class),
                                            config_class.__name__)
               for key, config_class in task_data.reader.gin_configs.items()}
    return registry.build_task(task_data, _encoder_spec(settings), config=config,
                               data=settings.data, **options)


def _check_inputs(settings: FinetuneSettings, task) -> None:
    """Reads the examples now, before the model is built: the trainer reads the evaluation
    examples only after training, so a missing or malformed source would fail once the run had
    trained and written its model_dir."""
    import gin  # noqa: PLC0415

    from bert_trainer.errors import UserError  # noqa: PLC0415

    if common.gin_is_bound("TrainerConfig.train_steps"):  # Else num_train_rows reads them next.
        task.raw_examples(task.train_split)
    if (common.gin_is_bound("TrainerConfig.eval_steps")
            and gin.query_parameter("TrainerConfig.eval_steps") == 0):
        return  # The run does not evaluate.
    if settings.data.eval_file is None and task.task_data.tfds_name is None:
        raise UserError(f"--task={task.name} has no TFDS dataset to evaluate on; pass "
                        "--eval_file")
    task.raw_examples(task.eval_split)


def _derive_settings(settings: FinetuneSettings, task):
    """The run length, warmup, best metric and warm start the flags and gin left to the task."""
    import gin  # noqa: PLC0415

    from bert_trainer.tasks import run_settings  # noqa: PLC0415

    bound = common.gin_is_bound("TrainerConfig.train_steps")
    derived = run_settings.derive_settings(
        task, train_steps=gin.query_parameter("TrainerConfig.train_steps") if bound else None,
        best_metric_bound=common.gin_is_bound("TrainerConfig.best_metric"),
        init_checkpoint=settings.init_checkpoint)
    task.run_settings = derived
    return derived


def _build_trainer(settings: FinetuneSettings, task, model_dir: str, run_settings,
                   strategy=None):
    """The Trainer, with the derived settings passed to its configs (gin is left as parsed).

    Every format of --init_checkpoint warm-starts the same way: on a fresh run the trainer
    calls `task.initialize`, which loads the checkpoint the task's encoder spec resolved.
    The strategy is `strategy`, else the one of `settings` (--strategy, --tpu).
    """
    from bert_trainer import configurables  # noqa: PLC0415
    from bert_trainer.training.trainer import Trainer  # noqa: PLC0415

    def configured(configurable, what: str):
        return common.build_configured(
            functools.partial(configurable, **run_settings.arguments(what)), what)

    return Trainer(task, model_dir,
                   config=configured(configurables.TrainerConfig, "TrainerConfig"),
                   optimizer=configured(configurables.OptimizerConfig, "OptimizerConfig"),
                   strategy=strategy or common.get_strategy(settings.strategy, settings.tpu),
                   derived_bindings=run_settings.gin_bindings())


def _print_warm_start(settings: FinetuneSettings, task, label: str = "") -> None:
    report = task.warm_start_report
    if report is None:
        return
    print(f"bert-train finetune: {label}warm start from {settings.init_checkpoint}: loaded "
          f"{len(report['loaded'])} encoder variables; left initialized: "
          f"{', '.join(report['initialized']) or 'none'}", flush=True)


def _write_eval_results(trainer, result) -> str:
    """Writes model_dir/eval_results.json of the final evaluation; returns its path."""
    import tensorflow as tf  # noqa: PLC0415

    from bert_trainer.checkpoints import storage  # noqa: PLC0415
    from bert_trainer.tasks import finetuning  # noqa: PLC0415

    latest = tf.train.latest_checkpoint(trainer.model_dir)
    path = os.path.join(trainer.model_dir, finetuning.EVAL_RESULTS_FILE)
    with storage.guard("the eval results", path, hint=storage.resume_hint(latest),
                       partial=(outputs.temporary_sibling(path),)):
        finetuning.write_eval_results(trainer.model_dir, trainer.task, result.eval,
                                      step=result.step, checkpoint=latest)
    return path
