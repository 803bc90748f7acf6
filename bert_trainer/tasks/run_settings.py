"""The settings a fine-tuning run derives from its task instead of gin, computed in one place.

`derive_settings` turns the task's epochs into optimizer steps and its warmup fraction into
warmup steps, and takes the task's best metric and the warm-start checkpoint, each only where
gin (or a flag) left it open. The command builds `TrainerConfig` and `OptimizerConfig` with
these values as arguments (gin's bindings are never changed mid-command) and the run records
them: as bindings at the end of `operative_config.gin` (so the file repeats the run) and as
`run_settings` in `bert_train.json`.
"""

import dataclasses

from absl import logging

from bert_trainer.errors import UserError

_TRAINER, _OPTIMIZER = "TrainerConfig", "OptimizerConfig"


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What `derive_settings` decided.

    Attributes:
      train_steps: optimizer steps of the whole run.
      warmup_steps: warmup steps, or None to keep `OptimizerConfig.warmup_steps`.
      best_metric: the eval metric whose best checkpoint is kept (None: gin's).
      best_metric_mode: "max" or "min" (with `best_metric`).
      init_checkpoint: the warm-start checkpoint (None: none).
      derived: the gin names ("TrainerConfig.train_steps", ...) of the values derived here
        rather than bound by the user; only these are passed to the configs and recorded.
    """

    train_steps: int
    warmup_steps: int | None = None
    best_metric: str | None = None
    best_metric_mode: str = "max"
    init_checkpoint: str | None = None
    derived: tuple[str, ...] = ()

    def values(self) -> dict[str, object]:
        """{gin name: value} of the derived settings, e.g. {"TrainerConfig.train_steps": 120}."""
        every = {f"{_TRAINER}.train_steps": self.train_steps,
                 f"{_OPTIMIZER}.warmup_steps": self.warmup_steps,
                 f"{_TRAINER}.best_metric": self.best_metric,
                 f"{_TRAINER}.best_metric_mode": self.best_metric_mode,
                 f"{_TRAINER}.init_checkpoint": self.init_checkpoint}
        return {name: every[name] for name in self.derived}

    def arguments(self, configurable: str) -> dict[str, object]:
        """Keyword arguments of `configurable` ("TrainerConfig" or "OptimizerConfig")."""
        return {name.partition(".")[2]: value for name, value in self.values().items()
                if name.partition(".")[0] == configurable}

    def gin_bindings(self) -> list[str]:
        """The derived settings as gin binding lines, e.g. "TrainerConfig.train_steps = 120"."""
        return [f"{name} = {value!r}" for name, value in self.values().items()]

    def to_json(self) -> dict[str, object]:
        return {name.partition(".")[2]: value for name, value in self.values().items()}


def derive_settings(task, *, train_steps: int | None = None, best_metric_bound: bool = False,
                    init_checkpoint: str | None = None) -> RunSettings:
    """Derives the run length, warmup, best metric and warm start of a fine-tuning run.

    Args:
      task: the `FinetuningTask` (its `config` says epochs, batch and warmup fraction).
      train_steps: the steps bound by gin or --train_steps; None derives them from the
        epochs over the task's training rows (which are read to count them).
      best_metric_bound: gin binds `TrainerConfig.best_metric`: keep it.
      init_checkpoint: the warm-start checkpoint (--init_checkpoint).

    Returns:
      The frozen `RunSettings`.
    """
    derived, rows = [], None
    if train_steps is None:
        rows = task.num_train_rows()
        train_steps = task.config.train_steps(rows)
        logging.info("%d training rows x %g epochs / batch %d = %d steps", rows,
                     task.config.num_epochs, task.config.train_batch_size, train_steps)
        derived.append(f"{_TRAINER}.train_steps")
    check_batch(task, rows)
    warmup = task.config.warmup_steps(train_steps)
    if warmup is not None:
        derived.append(f"{_OPTIMIZER}.warmup_steps")
    best_metric, mode = None, "max"
    if not best_metric_bound:
        best_metric, mode = task.best_metric, task.best_metric_mode
        derived += [f"{_TRAINER}.best_metric", f"{_TRAINER}.best_metric_mode"]
    if init_checkpoint:
        derived.append(f"{_TRAINER}.init_checkpoint")
    return RunSettings(train_steps=train_steps, warmup_steps=warmup, best_metric=best_metric,
                       best_metric_mode=mode, init_checkpoint=init_checkpoint or None,
                       derived=tuple(derived))


MAX_BATCH_REPEATS = 100  # A batch over 100x the training rows is refused (see `check_batch`).


def check_batch(task, rows: int | None = None) -> None:
    """Refuses a training batch over `MAX_BATCH_REPEATS` times the training rows: every batch
    would hold each row that many times (--batch_size=10^7 on 2,556 rows trained 640 micro-
    batches a step with no word). A batch merely above the rows (a toy file at the recipe's
    batch) is logged.

    Args:
      task: the `FinetuningTask` (its config's `train_batch_size`).
      rows: the training rows one epoch trains on (`num_train_rows`), if already counted;
        else the examples are counted only when the batch could exceed the bound.
    """
    batch = task.config.train_batch_size
    if rows is None:
        if batch <= MAX_BATCH_REPEATS:  # At least one row: never over the bound.
            return
        rows = task.num_examples(task.train_split)  # A windowed task's rows are >= these.
        if batch > MAX_BATCH_REPEATS * rows and task.windowed:
            rows = task.num_train_rows()
    if batch <= rows:
        return
    source = task.data.train_file or f"the {task.name} training split"
    if batch > MAX_BATCH_REPEATS * rows:
        raise UserError(f"FinetuneConfig.train_batch_size={batch} (--batch_size) is over "
                        f"{MAX_BATCH_REPEATS}x the {rows} training rows of {source}: every batch "
                        f"would hold each row about {batch // max(rows, 1)} times; use "
                        f"--batch_size <= {rows}")
    logging.warning("batch %d is larger than the %d training rows of %s: every batch "
                    "repeats rows", batch, rows, source)
