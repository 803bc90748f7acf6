"""What `bert-train finetune` was asked to do: its flags, read once into one typed object.

`finetune.main` reads the flags with `FinetuneSettings.from_flags()` and passes the object
down; nothing below `main` reads `FLAGS`. The object also says what the flags mean for gin
(`gin_bindings`, recorded in operative_config.gin) and for the task's files
(`column_arguments`); the data flags are read into the task's own `finetuning.DataConfig`.
"""

import dataclasses

from absl import flags

from bert_trainer.commands import common
from bert_trainer.errors import UserError

COLUMN_FLAGS = ("text_column", "text_b_column", "label_column", "source_column", "target_column")
# Flags whose value is taken as it is.
_PLAIN = ("task", "model_dir", "family_module", "num_seeds", "init_checkpoint", "vocab_file",
          "lower_case", "header", "seq_length", "batch_size", "num_epochs", "learning_rate",
          "train_steps", "fit_batch", "micro_batch_size", "long_texts", "doc_stride",
          "window_pooling", "strategy", "tpu")
# The data flags, read into `finetuning.DataConfig`.
_DATA = ("train_file", "eval_file", "data_dir", "max_train_examples", "max_eval_examples")


@dataclasses.dataclass(frozen=True)
class FinetuneSettings:
    """The finetune command's flags (see `bert-train finetune --help` for each).

    Attributes:
      data: --train_file, --eval_file, --data_dir, --max_train_examples,
        --max_eval_examples and --skip_bad_rows, as the task reads them.
      columns: the column flags given ({"text_column": "review", ...}), none of the others.
      gin_files, gin_params: --gin_file and --gin_param, in order.
      strategy, tpu: --strategy and --tpu (`common.get_strategy` makes the strategy of them).
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
    gin_files: tuple[str, ...] = ()
    gin_params: tuple[str, ...] = ()
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
    strategy: str = "default"
    tpu: str | None = None

    @classmethod
    def from_flags(cls, values: flags.FlagValues = flags.FLAGS) -> "FinetuneSettings":
        """The settings of the parsed command line `values`.

        Raises:
          UserError: a data flag out of range (`finetuning.DataConfig` checks them).
        """
        from bert_trainer.tasks import finetuning  # noqa: PLC0415 (imports TensorFlow)

        def listed(name):
            value = getattr(values, name)
            return None if value is None else tuple(value)

        data = finetuning.DataConfig(**{name: getattr(values, name) for name in _DATA},
                                     skip_bad_rows=bool(values.skip_bad_rows))
        return cls(**{name: getattr(values, name) for name in _PLAIN},
                   seeds=listed("seeds"), label_names=listed("label_names"), data=data,
                   columns={name: getattr(values, name) for name in COLUMN_FLAGS
                            if getattr(values, name) is not None},
                   gin_files=tuple(values.gin_file), gin_params=tuple(values.gin_param))

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
        return [common.gin_binding(name, value) for name, value in pairs if value is not None]

    def _window_pairs(self, family) -> list[tuple[str, object]]:
        """--long_texts, --doc_stride and --window_pooling as (binding, value) of the family."""
        from bert_trainer.tasks import registry  # noqa: PLC0415

        if not family.truncates and self.long_texts == "truncate":
            raise UserError(f"--long_texts=truncate does not apply to {family.name} tasks: their "
                            "texts are always windowed (set the stride with --doc_stride)")
        if self.long_texts == "head_tail" and not family.head_tail:
            keeps = [f.name for f in registry.families() if f.head_tail]
            raise UserError(f"--long_texts=head_tail applies to {' and '.join(keeps)} tasks, not "
                            f"to {family.name}; use windows or truncate")
        if self.window_pooling is not None and not family.window_pooling:
            pooling = [f.name for f in registry.families() if f.window_pooling]
            raise UserError(f"--window_pooling applies to {' and '.join(pooling)}, not to "
                            f"{family.name} tasks; drop it")
        return [("FinetuneConfig.long_texts", self.long_texts),
                (family.doc_stride_binding, self.doc_stride),
                ("FinetuneConfig.window_pooling", self.window_pooling)]

    def column_arguments(self, family) -> dict:
        """The column flags given, as the `resolve_task_data` arguments the family maps them to
        (`Family.column_flags`); a column flag of another family is refused, naming the
        family's."""
        if not self.columns:
            return {}
        if not family.reads_columns:  # resolve_task_data names the families that read columns
            return {"text_column": next(iter(self.columns.values()))}
        foreign = [name for name in self.columns if name not in family.column_flags]
        if foreign:
            own = ", ".join(f"--{name}" for name in family.column_flags)
            raise UserError(f"--{foreign[0]} does not apply to {family.name} tasks; their "
                            f"columns are {own}")
        return {family.column_flags[name]: value for name, value in self.columns.items()}
