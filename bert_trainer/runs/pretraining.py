"""A pretraining run (masked LM or causal LM), built in one place from its settings: what
`bert-train pretrain` trains, and what tests build to drive its steps.

    settings = PretrainSettings(gin_files=("configs/mini.gin",), train_data="data/train-*",
                                vocab_file="vocab.txt", time_budget=1200.0)
    parse_config(settings)  # the gin files, then --gin_param, then the settings' own values
    run = build_pretraining_run(settings, "runs/mini")
    with named_data_faults(run):
        run.trainer.train_and_evaluate()

The objective (gin's `pretraining_objective`) names its data config and model builder; an
init checkpoint is resolved once and fixes the architecture (and, unless bound, the
vocabulary) when it is a Hugging Face, Google BERT or GPT-2 directory.
"""

import contextlib
import dataclasses
import functools

from absl import logging

from bert_trainer.errors import UserError
from bert_trainer.runs import gin_config
from bert_trainer.runs.run import Run, Settings


@dataclasses.dataclass(frozen=True)
class PretrainSettings(Settings):
    """What a pretraining run is asked to do: `bert-train pretrain`'s flags (see its `--help`),
    or a caller's own values.

    Attributes (and `Settings`'):
      train_data, eval_data, vocab_file, init_checkpoint: override the gin config's (None: not
        given).
      time_budget: seconds of training (None: the config's `TrainerConfig.time_budget`).
    """

    train_data: str | None = None
    eval_data: str | None = None
    vocab_file: str | None = None
    init_checkpoint: str | None = None
    time_budget: float | None = None

    def gin_bindings(self) -> list[str]:
        """The settings given as gin bindings, applied last so that operative_config.gin
        records them. The data settings are bound for every objective's config (the objective
        is read from gin only after parsing); the operative config lists the one the run
        builds."""
        from bert_trainer.tasks import plugins  # noqa: PLC0415 (imports TensorFlow)

        data = [("train_data", self.train_data), ("eval_data", self.eval_data),
                ("vocab_file", self.vocab_file)]
        pairs = [(f"{objective.config_name}.{name}", value)
                 for objective in plugins.objectives().values() for name, value in data]
        pairs += [("TrainerConfig.init_checkpoint", self.init_checkpoint),
                  ("TrainerConfig.time_budget", self.time_budget)]
        return [gin_config.gin_binding(name, value) for name, value in pairs
                if value is not None]


def parse_config(settings: PretrainSettings) -> None:
    """Parses gin as a pretraining run reads it: `settings.gin_files`, `settings.gin_params`,
    then the settings' own values as bindings."""
    if not settings.gin_files:
        raise UserError("--gin_file is required, e.g. --gin_file=configs/smoke.gin")
    gin_config.parse_gin(settings.gin_files, settings.gin_params, settings.gin_bindings())


def build_pretraining_run(settings: PretrainSettings, model_dir: str, strategy=None) -> Run:
    """The task and the `Trainer` (warm-started, or resumed from `model_dir`) of a pretraining
    run with `settings`, after `parse_config`.

    Args:
      settings: what the run is asked to do.
      model_dir: the run's directory (its lock is the caller's).
      strategy: a `tf.distribute` strategy; default: the one `settings.strategy` names.

    Raises:
      UserError: a bad input, named in one line, before anything is written.
    """
    trainer = _build_trainer(settings, model_dir, strategy)
    return Run(trainer.task, trainer)


@contextlib.contextmanager
def named_data_faults(run: Run):
    """Turns a damaged or deleted shard met while `run` trains into one line naming the file
    (the steps done are checkpointed by then)."""
    import tensorflow as tf  # noqa: PLC0415

    from bert_trainer.data import record_faults  # noqa: PLC0415

    try:
        yield
    except (tf.errors.DataLossError, tf.errors.NotFoundError) as e:
        config = run.task.config
        inputs = {"--train_data": config.train_data, "--eval_data": config.eval_data}
        if isinstance(e, tf.errors.NotFoundError):
            latest = tf.train.latest_checkpoint(run.trainer.model_dir)
            raise record_faults.vanished(e, inputs, latest) from None
        raise record_faults.locate(e, inputs) from None


def _build_trainer(settings: PretrainSettings, model_dir: str, strategy):
    """Builds the task, the configs and the Trainer from the parsed gin config.

    The objective (gin's `pretraining_objective`, asked of the family that owns it:
    `plugins.objective`) names its data config and model builder, checks the init
    checkpoint and builds its task. The init checkpoint is resolved once: a bert-train,
    Hugging Face, Google BERT or GPT-2 directory fixes the model's architecture and (unless
    bound) the vocabulary and its casing, and the same resolved checkpoint warm-starts the
    model. Settings the run derives (that vocabulary; no evaluation without eval data) are
    passed to the configs as arguments, leaving gin as parsed, and are recorded in the
    operative config. The strategy is `strategy`, else the one `settings` names, made last
    (once the configs are checked).
    """
    from bert_trainer import configurables  # noqa: PLC0415
    from bert_trainer.interop import resolve  # noqa: PLC0415
    from bert_trainer.tasks import plugins  # noqa: PLC0415
    from bert_trainer.training import strategies  # noqa: PLC0415
    from bert_trainer.training.trainer import Trainer  # noqa: PLC0415

    def configured(configurable, what: str, **derived):
        return gin_config.build_configured(functools.partial(configurable, **derived), what)

    config = gin_config.build_configured(configurables.TrainerConfig, "TrainerConfig")
    checkpoint = (resolve.as_resolved(config.init_checkpoint) if config.init_checkpoint
                  else None)
    objective = plugins.objective(configurables.pretraining_objective())
    config_name = objective.config_name
    derived = {}
    model_fn = getattr(configurables, objective.builder_name)
    if checkpoint is not None:
        objective.check_init_checkpoint(checkpoint)
    # A bert-train, Hugging Face, Google BERT or GPT-2 directory fixes the architecture, and
    # its vocabulary (and casing) the data's unless bound: continued pretraining.
    if checkpoint is not None and checkpoint.fixes_architecture:
        logging.info("Model architecture from %s (build_encoder / build_causal_lm bindings "
                     "are ignored)", checkpoint.directory)
        model_fn = checkpoint.build_encoder
        if checkpoint.vocab_file and not gin_config.gin_is_bound(f"{config_name}.vocab_file"):
            derived[config_name] = {"vocab_file": checkpoint.vocab_file}
            if not checkpoint.lower_case and not gin_config.gin_is_bound(
                    f"{config_name}.lower_case"):
                derived[config_name]["lower_case"] = False
    task_config = configured(getattr(configurables, config_name), config_name,
                             **derived.get(config_name, {}))
    if task_config.eval_data is None and config.eval_steps != 0:
        if config.best_metric:
            raise UserError(f"TrainerConfig.best_metric={config.best_metric!r} needs eval data; "
                            "pass --eval_data=GLOB")
        derived["TrainerConfig"] = {"eval_steps": 0, "eval_interval": None}
        config = configured(configurables.TrainerConfig, "TrainerConfig",
                            **derived["TrainerConfig"])
        logging.warning("No eval data (--eval_data or %s.eval_data): training without "
                        "evaluation", config_name)
    optimizer = gin_config.build_configured(configurables.OptimizerConfig, "OptimizerConfig")
    bindings = tuple(gin_config.gin_binding(f"{what}.{name}", value)
                     for what, values in derived.items() for name, value in values.items())
    return Trainer(objective.task(task_config, model_fn, checkpoint), model_dir,
                   config=config, optimizer=optimizer,
                   strategy=strategy or strategies.get_strategy(settings.strategy,
                                                                tpu_address=settings.tpu),
                   derived_bindings=bindings)
