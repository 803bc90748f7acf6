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

from absl import flags, logging

from bert_trainer import durations
from bert_trainer.commands import common, shared_flags
from bert_trainer.commands.shared_flags import Usage
from bert_trainer.errors import UserError

flags.adopt_module_key_flags(common)
SHARED_FLAGS = {**common.SHARED_FLAGS, **shared_flags.declare(
    __name__,
    vocab_file=Usage(None, "The WordPiece vocab.txt (default: the one of --init_checkpoint's "
                     "model directory); overrides PretrainingConfig.vocab_file."),
    init_checkpoint=Usage(None, "Warm start from a bert-train model directory or checkpoint "
                          "prefix, or continue pretraining a Hugging Face / Google BERT "
                          "directory (fresh runs only); its config fixes the encoder and its "
                          "vocabulary the data's."))}
flags.DEFINE_string("train_data", None, "Training TFRecords (glob, comma list allowed); "
                    "overrides PretrainingConfig.train_data.")
flags.DEFINE_string("eval_data", None, "Held-out TFRecords; overrides "
                    "PretrainingConfig.eval_data. Without any, training runs with no evaluation.")
flags.DEFINE_string("time_budget", None, "Train for this wall-clock time, e.g. 90s, 20m, 1.5h: "
                    "the learning-rate schedule runs on the fraction of the budget spent, the "
                    "run stops and checkpoints when it is spent (train_steps only shapes the "
                    "schedule); overrides TrainerConfig.time_budget.")

FLAGS = flags.FLAGS


def _flag_bindings(*, train_data: str | None, eval_data: str | None, vocab_file: str | None,
                   init_checkpoint: str | None, time_budget: float | None = None) -> list[str]:
    """The data flags as gin bindings, so that operative_config.gin records them.

    They are bound for every objective's config (the objective is read from gin only after
    parsing); the operative config lists only the one the run builds.

    Args:
        train_data, eval_data, vocab_file, init_checkpoint: the flags of those names (None:
            not given, so not bound).
        time_budget: --time_budget in seconds (None: not given).
    """
    from bert_trainer.tasks import registry  # noqa: PLC0415 (imports TensorFlow)

    data = [("train_data", train_data), ("eval_data", eval_data), ("vocab_file", vocab_file)]
    pairs = [(f"{objective.config_name}.{name}", value)
             for objective in registry.objectives().values() for name, value in data]
    pairs.append(("TrainerConfig.init_checkpoint", init_checkpoint))
    pairs.append(("TrainerConfig.time_budget", time_budget))
    return [common.gin_binding(name, value) for name, value in pairs if value is not None]


def main(argv):
    del argv
    common.setup_logging(FLAGS["verbosity"].present)
    model_dir = common.check_model_dir(FLAGS.model_dir)
    if not FLAGS.gin_file:
        raise UserError("--gin_file is required, e.g. --gin_file=configs/smoke.gin")
    budget = (durations.parse_duration(FLAGS.time_budget, "--time_budget")
              if FLAGS.time_budget is not None else None)
    common.parse_gin(FLAGS.gin_file, FLAGS.gin_param, _flag_bindings(
        train_data=FLAGS.train_data, eval_data=FLAGS.eval_data, vocab_file=FLAGS.vocab_file,
        init_checkpoint=FLAGS.init_checkpoint, time_budget=budget))
    with common.one_line_errors(), common.model_dir_lock(model_dir, "pretrain", FLAGS.strategy):
        trainer = _build_trainer(model_dir, strategy_name=FLAGS.strategy, tpu=FLAGS.tpu)
        import tensorflow as tf  # noqa: PLC0415 (loaded by now; --help stays free of it)

        try:
            return common.train_and_report(trainer, "pretrain")
        except (tf.errors.DataLossError, tf.errors.NotFoundError) as e:
            # A damaged or deleted shard: name it (the steps done are checkpointed).
            from bert_trainer.data import record_faults  # noqa: PLC0415

            config = trainer.task.config
            inputs = {"--train_data": config.train_data, "--eval_data": config.eval_data}
            if isinstance(e, tf.errors.NotFoundError):
                raise record_faults.vanished(e, inputs, tf.train.latest_checkpoint(model_dir)
                                             ) from None
            raise record_faults.locate(e, inputs) from None


def _build_trainer(model_dir: str, *, strategy_name: str, tpu: str | None):
    """Builds the task, the configs and the Trainer from the parsed gin config.

    The objective (gin's `pretraining_objective`, asked of the family that owns it:
    `registry.objective`) names its data config and model builder, checks the init
    checkpoint and builds its task. The init checkpoint is resolved once: a bert-train,
    Hugging Face, Google BERT or GPT-2 directory fixes the model's architecture and (unless
    bound) the vocabulary and its casing, and the same resolved checkpoint warm-starts the
    model. Settings the command derives (that vocabulary;
    no evaluation without eval data) are passed to the configs as arguments, leaving gin as
    parsed, and are recorded in the operative config. The strategy is made last, from
    --strategy `strategy_name` and --tpu `tpu` (`common.get_strategy`).
    """
    import functools  # noqa: PLC0415

    from bert_trainer import configurables  # noqa: PLC0415
    from bert_trainer.interop import resolve  # noqa: PLC0415
    from bert_trainer.tasks import registry  # noqa: PLC0415
    from bert_trainer.training.trainer import Trainer  # noqa: PLC0415

    def configured(configurable, what: str, **derived):
        return common.build_configured(functools.partial(configurable, **derived), what)

    config = common.build_configured(configurables.TrainerConfig, "TrainerConfig")
    checkpoint = (resolve.as_resolved(config.init_checkpoint) if config.init_checkpoint
                  else None)
    objective = registry.objective(configurables.pretraining_objective())
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
        if checkpoint.vocab_file and not common.gin_is_bound(f"{config_name}.vocab_file"):
            derived[config_name] = {"vocab_file": checkpoint.vocab_file}
            if not checkpoint.lower_case and not common.gin_is_bound(
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
    optimizer = common.build_configured(configurables.OptimizerConfig, "OptimizerConfig")
    bindings = tuple(common.gin_binding(f"{what}.{name}", value)
                     for what, values in derived.items() for name, value in values.items())
    return Trainer(objective.task(task_config, model_fn, checkpoint), model_dir,
                   config=config, optimizer=optimizer,
                   strategy=common.get_strategy(strategy_name, tpu), derived_bindings=bindings)
