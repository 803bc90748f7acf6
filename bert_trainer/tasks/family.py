"""What a task family provides: one object that the registries, the commands and the exporter ask.

A family (classification, regression, squad, tagging, translate, or one of your own) lives
in one place, `bert_trainer/tasks/<family>/` for the built-in ones, and declares:

- its datasets (`presets`: `TaskData` entries such as GLUE's) and the task names that train on
  your own files only (`local_tasks`), and how it reads raw examples (the `ExampleReader`
  methods: `read_local`, `from_tfds`, `labels_from_file`, `num_labels`);
- its `FinetuningTask` class (head model, losses, metrics) and the options that class takes
  from gin (`gin_configs`) or from a model directory's stored task (`options_from_info`);
- its default gin recipe (`recipe`, a path on gin's search path);
- its serving module (`head_model` + `serving_module`: text in, answers out) and how
  `predict` writes one answer (`format_answer`).

A family registers itself with `bert_trainer.tasks.plugins.register_family(family)` when its
module is imported. Nothing outside the family's package branches on its name.
"""

import math

from bert_trainer.data.task_data import ExampleReader, TaskData
from bert_trainer.errors import UserError

# A signature output, bool [b]: input i was cut to fit (predict marks it "truncated": true).
TRUNCATED = "truncated"


class Family(ExampleReader):
    """Base class of task families; subclasses fill in the attributes and methods below.

    Attributes:
      name: the family's name, stored in bert_train.json ("task": {"family": ...}).
      module: the module whose import registers the family (recorded in bert_train.json, so
        that `evaluate`, `export` and `predict` re-import a plugin family); None: the module
        that defines the family's class.
      recipe: the default gin file of `finetune` (e.g. "configs/tasks/classification.gin",
        found as `--gin_file` finds files), or None for none.
      task_class: the `FinetuningTask` subclass that trains the family's tasks.
      local_tasks: task names that read your own files only (`--train_file/--eval_file`).
      local_file_format: the file format those tasks read; None: by the file's extension.
      reads_columns: `--text_column`, `--text_b_column`, `--label_column`, `--header` apply.
      column_flags: the `finetune` flags that map the columns of the family's files, each to
        the `registry.resolve_task_data` argument it sets (families that read columns).
      truncates: `--long_texts=truncate` applies (else the family always windows).
      head_tail: `--long_texts=head_tail` applies (single texts: classification, regression).
      window_pooling: `--window_pooling` applies.
      doc_stride_binding: the gin parameter that `--doc_stride` binds.
      gin_configs: task constructor keyword → config dataclass, built from gin by class name
        (e.g. {"squad": SquadConfig}: `SquadConfig.n_best = 10` in a .gin file).
      input_orders: the text inputs of the serving signature in column order, one tuple per
        variant (e.g. (("text", "text_b"), ("text",))); a TSV without header follows it.
      answer_outputs: output names of `serving_default` that only this family returns; they
        identify an export that does not record its family.
      objective: the family's pretraining objective (`tasks.objective.Objective`), or None:
        what `bert-train pretrain` trains for its `pretraining_objective.name`.
      exports_encoder: an export of its model directories is the bare encoder's (`encode`
        signature only): a pretrained encoder, not a task model.
    """

    module: str | None = None
    recipe: str | None = None
    task_class = None
    local_tasks: tuple[str, ...] = ()
    local_file_format: str | None = None
    reads_columns: bool = False
    column_flags: dict = {"text_column": "text_column", "text_b_column": "text_b_column",
                          "label_column": "label_column"}
    truncates: bool = True
    head_tail: bool = False
    window_pooling: bool = False
    doc_stride_binding: str = "FinetuneConfig.doc_stride"
    gin_configs: dict = {}
    input_orders: tuple[tuple[str, ...], ...] = ()
    answer_outputs: tuple[str, ...] = ()
    objective = None
    exports_encoder: bool = False

    def module_name(self) -> str:
        """`module`, or the module defining the family's class."""
        return self.module or type(self).__module__

    # -- data ------------------------------------------------------------------------------

    def presets(self) -> tuple[TaskData, ...]:
        """The family's named datasets (`--task=NAME` without a local file reads their TFDS
        source)."""
        return ()

    def local_task_data(self, name: str, **fields) -> TaskData:
        """A task of this family read from local files only (see `registry.local_task_data`)."""
        fields.setdefault("file_format", self.local_file_format)
        return TaskData(name=name, family=self, **fields)

    # -- training --------------------------------------------------------------------------

    def build_task(self, task_data: TaskData, encoder, *, config=None, data=None, **options):
        """The fine-tuning task of `task_data`.

        Args:
          task_data: a `TaskData` of this family.
          encoder: the `EncoderSpec`.
          config, data: `FinetuneConfig`, `DataConfig` (None: the defaults).
          **options: the family's own options (keys of `gin_configs`, `options_from_info`).

        Returns:
          A `task_class` instance.
        """
        return self.task_class(task_data, encoder, config=config, data=data, **options)

    def options_from_info(self, info: dict) -> dict:
        """The `build_task` options stored in a model directory's task entry (`task_info`)."""
        return {}

    # -- serving and predict ---------------------------------------------------------------

    def head_model(self, encoder, task: dict, where: str):
        """The (unrestored) task model around `encoder` for the stored task entry `task`:
        `task_class.head_model` (the task's own builder) with `head_options`.

        Args:
          encoder: a freshly built encoder.
          task: the "task" entry of bert_train.json.
          where: the bert_train.json path, named in error messages.
        """
        return self.task_class.head_model(encoder, **self.head_options(task, where))

    def head_options(self, task: dict, where: str) -> dict:
        """The `task_class.head_model` options a stored task entry records (bad or missing
        values: one line naming `where`)."""
        return {}

    def serving_module(self, model, task: dict, **common):
        """The text-in serving module (an `bert_trainer.serving.TaskServing`) of a restored model.

        Args:
          model: from `head_model`, restored.
          task: the "task" entry of bert_train.json.
          **common: vocab_file, lower_case, seq_length.
        """
        raise NotImplementedError

    def format_answer(self, outputs: dict, i: int) -> dict:
        """The JSON answer of row `i` of a batch of `serving_default` outputs (numpy)."""
        raise NotImplementedError


def num_classes(task: dict, where: str) -> int:
    """The class (tag) count of a stored task entry: "num_classes", else its label names."""
    if task.get("num_classes"):
        return int(task["num_classes"])
    if task.get("label_names"):
        return len(task["label_names"])
    raise UserError(f"{where}: task.label_names is missing; a {task['family']} export needs "
                    "the class names (re-run finetune, or add them to bert_train.json)")


def decode(value) -> str:
    """A string output of a signature (bytes) as text."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def mark_truncated(answer: dict, outputs: dict, i: int) -> dict:
    """`answer` plus "truncated": true when the signature's `truncated` output (bool [b]) says
    input i was cut to fit (no silent truncation); exports without that output mark nothing."""
    cut = outputs.get(TRUNCATED)
    if cut is not None and bool(cut[i]):
        answer["truncated"] = True
    return answer


def finite(value) -> float | None:
    """A JSON-safe score: rounded to 6 decimals (float32 has ~7 digits); None if not finite."""
    value = float(value)
    return round(value, 6) if math.isfinite(value) else None
