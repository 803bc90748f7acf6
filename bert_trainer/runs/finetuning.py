"""A fine-tuning run, built in one place from its settings: what `bert-train finetune` (each
seed of `--seeds` too) trains, and what the benchmarks and tests build to drive its steps.

    settings = FinetuneSettings(task="sst2", init_checkpoint="models/minilm",
                                data=finetuning.DataConfig(train_file="SST-2/train.tsv"),
                                seq_length=64, train_steps=400)
    parse_config(settings)  # the family's recipe, the gin files and params, the settings
    run = build_finetuning_run(settings, "runs/sst2")
    run.trainer.train_and_evaluate()

The order: gin is parsed once (`parse_config`); the task is built and its inputs read before
anything is written (`plan`); the settings the task derives (steps from epochs, warmup, the
best metric, the warm start) are passed to the configs as arguments and recorded in
operative_config.gin; the `Trainer` warm-starts the encoder or resumes the model_dir.
"""

import dataclasses
import functools
import os
import re

from absl import logging

from bert_trainer import outputs
from bert_trainer.errors import UserError
from bert_trainer.runs import gin_config
from bert_trainer.runs.run import Run, Settings

COLUMN_FLAGS = ("text_column", "text_b_column", "label_column", "source_column", "target_column")


@dataclasses.dataclass(frozen=True)
class FinetuneSettings(Settings):
    """What a fine-tuning run is asked to do: `bert-train finetune`'s flags (see its `--help`
    for each), or a caller's own values.

    Attributes (and `Settings`'):
      data: --train_file, --eval_file, --data_dir, --max_train_examples,
        --max_eval_examples and --skip_bad_rows, as the task reads them.
      columns: the column flags given ({"text_column": "review", ...}), none of the others.
    """

    task: str | None = None
    model_dir: str | None = None
    family_module: str | None = None
    seeds: tuple[str, ...] | None = None
    num_seeds: int | None = None
    init_checkpoint: str | None = None
    vocab_file: str | None = None
    lower_case: bool | None = None
    data: object = None  # a finetuning.DataConfig (that module imports TensorFlow)
    columns: dict = dataclasses.field(default_factory=dict)
    header: bool | None = None
    label_names: tuple[str, ...] | None = None
    seq_length: int | None = None
    batch_size: int | None = None
    num_epochs: float | None = None
    learning_rate: float | None = None
    train_steps: int | None = None
    fit_batch: bool | None = None
    micro_batch_size: int | None = None
    long_texts: str | None = None
    doc_stride: int | None = None
    window_pooling: str | None = None

    def gin_bindings(self, family) -> list[str]:
        """The hyperparameter flags as gin bindings, so that operative_config.gin records them.

        Args:
          family: the task's `tasks.family.Family` (it names the stride's binding).

        Raises:
          UserError: a window flag that does not apply to the family.
        """
        pairs = [("FinetuneConfig.seq_length", self.seq_length),
                 ("FinetuneConfig.train_batch_size", self.batch_size),
                 ("FinetuneConfig.num_epochs", self.num_epochs),
                 ("OptimizerConfig.learning_rate", self.learning_rate),
                 ("TrainerConfig.train_steps", self.train_steps),
                 ("TrainerConfig.fit_batch", self.fit_batch),
                 ("TrainerConfig.micro_batch_size", self.micro_batch_size),
                 *self._window_pairs(family)]
        return [gin_config.gin_binding(name, value) for name, value in pairs if value is not None]

    def _window_pairs(self, family) -> list[tuple[str, object]]:
        """--long_texts, --doc_stride and --window_pooling as (binding, value) of the family."""
        from bert_trainer.tasks import plugins  # noqa: PLC0415

        if not family.truncates and self.long_texts == "truncate":
            raise UserError(f"--long_texts=truncate does not apply to {family.name} tasks: their "
                            "texts are always windowed (set the stride with --doc_stride)")
        if self.long_texts == "head_tail" and not family.head_tail:
            keeps = [f.name for f in plugins.families() if f.head_tail]
            raise UserError(f"--long_texts=head_tail applies to {' and '.join(keeps)} tasks, not "
                            f"to {family.name}; use windows or truncate")
        if self.window_pooling is not None and not family.window_pooling:
            pooling = [f.name for f in plugins.families() if f.window_pooling]
            raise UserError(f"--window_pooling applies to {' and '.join(pooling)}, not to "
                            f"{family.name} tasks; drop it")
        return [("FinetuneConfig.long_texts", self.long_texts),
                (family.doc_stride_binding, self.doc_stride),
                ("FinetuneConfig.window_pooling", self.window_pooling)]


def parse_config(settings: FinetuneSettings) -> None:
    """Parses gin as a fine-tuning run reads it: the family's recipe, then `settings.gin_files`,
    then `settings.gin_params`, then the settings' own values as bindings (the family's option
    classes registered first)."""
    from bert_trainer.tasks import registry  # noqa: PLC0415 (imports TensorFlow)

    family = registry.family_of(settings.task)
    _register_family_configs(family)
    gin_config.parse_gin(recipe_files(settings), settings.gin_params, settings.gin_bindings(family))


def recipe_files(settings: FinetuneSettings) -> list[str]:
    """The gin files of the run, in order: the task family's recipe, then `settings.gin_files`."""
    from bert_trainer.tasks import registry  # noqa: PLC0415

    family = registry.family_of(settings.task)
    return [*([family.recipe] if family.recipe else []), *settings.gin_files]


def build_finetuning_run(settings: FinetuneSettings, model_dir: str, strategy=None) -> Run:
    """The task and the `Trainer` (warm-started, or resumed from `model_dir`) of a fine-tune
    with `settings`, after `parse_config`.

    Args:
      settings: what the run is asked to do.
      model_dir: the run's directory (its lock is the caller's).
      strategy: a `tf.distribute` strategy; default: the one `settings.strategy` names.

    Raises:
      UserError: a bad input, named in one line, before anything is written.
    """
    task, run_settings = plan(settings)
    return Run(task, _build_trainer(settings, task, model_dir, run_settings, strategy))


def _register_family_configs(family) -> None:
    """Makes the family's option classes gin-configurable before the .gin files are parsed."""
    from bert_trainer import configurables  # noqa: PLC0415

    for config_class in family.gin_configs.values():
        configurables.configurable(config_class)


def plan(settings: FinetuneSettings):
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
    encoder = gin_config.build_configured(
        functools.partial(configurables.build_encoder, **derived), "build_encoder")
    return finetuning.spec_from_encoder(encoder, vocab_file=settings.vocab_file,
                                        lower_case=lower_case)


def _build_task(settings: FinetuneSettings):
    """The task of --task with the data flags, the gin configs and the encoder spec."""
    from bert_trainer import configurables  # noqa: PLC0415
    from bert_trainer.tasks import registry  # noqa: PLC0415

    task_data = registry.resolve_task_data(
        settings.task, columns=settings.columns, has_header=settings.header,
        label_names=list(settings.label_names) if settings.label_names else None,
        train_file=settings.data.train_file, skip_bad_rows=settings.data.skip_bad_rows)
    config = gin_config.build_configured(configurables.FinetuneConfig, "FinetuneConfig")
    options = {key: gin_config.build_configured(configurables.configurable(config_class),
                                                config_class.__name__)
               for key, config_class in task_data.family.gin_configs.items()}
    return registry.build_task(task_data, _encoder_spec(settings), config=config,
                               data=settings.data, **options)


def _check_inputs(settings: FinetuneSettings, task) -> None:
    """Reads the examples now, before the model is built: the trainer reads the evaluation
    examples only after training, so a missing or malformed source would fail once the run had
    trained and written its model_dir."""
    import gin  # noqa: PLC0415

    if gin_config.gin_is_bound("TrainerConfig.train_steps"):  # Else num_train_rows reads them.
        task.raw_examples(task.train_split)
    if (gin_config.gin_is_bound("TrainerConfig.eval_steps")
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

    bound = gin_config.gin_is_bound("TrainerConfig.train_steps")
    derived = run_settings.derive_settings(
        task, train_steps=gin.query_parameter("TrainerConfig.train_steps") if bound else None,
        best_metric_bound=gin_config.gin_is_bound("TrainerConfig.best_metric"),
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
    from bert_trainer.training import strategies  # noqa: PLC0415
    from bert_trainer.training.trainer import Trainer  # noqa: PLC0415

    def configured(configurable, what: str):
        return gin_config.build_configured(
            functools.partial(configurable, **run_settings.arguments(what)), what)

    return Trainer(task, model_dir,
                   config=configured(configurables.TrainerConfig, "TrainerConfig"),
                   optimizer=configured(configurables.OptimizerConfig, "OptimizerConfig"),
                   strategy=strategy or strategies.get_strategy(settings.strategy,
                                                               tpu_address=settings.tpu),
                   derived_bindings=run_settings.gin_bindings())


def check_seed_bindings() -> None:
    """Refuses gin bindings that a multi-seed run (--seeds) would override or that leave it
    nothing to report (call after `parse_config`)."""
    import gin  # noqa: PLC0415

    for name in ("TrainerConfig.seed", "FinetuneConfig.seed"):
        if gin_config.gin_is_bound(name):
            raise UserError(f"{name} is bound, but --seeds/--num_seeds set it for each seed's "
                            "run; drop the binding")
    if (gin_config.gin_is_bound("TrainerConfig.eval_steps")
            and gin.query_parameter("TrainerConfig.eval_steps") == 0):
        raise UserError("--seeds/--num_seeds report evaluation metrics, but "
                        "TrainerConfig.eval_steps = 0 turns evaluation off; drop that binding")


def write_eval_results(trainer, result) -> str:
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
