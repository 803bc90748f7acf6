"""Task names -> fine-tuning `Task`s.

Every dataset of `bert_trainer.data.task_data` (imdb, the GLUE tasks, squad, squad_v2,
conll2003) is a task; its family picks the class. Three more names train on your own files
with `--train_file/--eval_file`: `classification` and `regression` (TSV/CSV/JSONL with a
column mapping) and `tagging` (CoNLL column files). `build_task` makes a task for a run;
`task_from_info` rebuilds the one a model directory was trained on (for `evaluate`).
"""

import dataclasses

from bert_trainer.data import task_data as task_data_lib
from bert_trainer.data import windows
from bert_trainer.data.sources import TextColumns
from bert_trainer.data.task_data import TaskData
from bert_trainer.errors import UserError
from bert_trainer.tasks.classification.task import SentenceClassificationTask
from bert_trainer.tasks.finetuning import DataConfig, EncoderSpec, FinetuneConfig, FinetuningTask
from bert_trainer.tasks.squad.task import QuestionAnsweringTask, SquadConfig
from bert_trainer.tasks.tagging.task import TaggingTask

# Tasks of your own: name -> family (their data only comes from local files).
LOCAL_TASKS = {"classification": "classification", "regression": "regression",
               "tagging": "tagging"}
TASK_CLASSES = {"classification": SentenceClassificationTask,
                "regression": SentenceClassificationTask,
                "squad": QuestionAnsweringTask, "tagging": TaggingTask}


def task_names() -> list[str]:
    """Every name `build_task` accepts."""
    return sorted(set(task_data_lib.task_names()) | set(LOCAL_TASKS))


def _base_task_data(name: str) -> TaskData:
    if name in LOCAL_TASKS:
        family = LOCAL_TASKS[name]
        fmt = "conll" if family == "tagging" else None
        return task_data_lib.local_task_data(name, family, file_format=fmt)
    if name not in task_data_lib.task_names():
        raise UserError(f"unknown task '{name}'; choose one of: {', '.join(task_names())} "
                        "(classification, regression and tagging read your own --train_file)")
    return task_data_lib.get_task_data(name)


def family_of(name: str) -> str:
    """The family ("classification", "regression", "squad", "tagging") of a task name."""
    return _base_task_data(name).family


def _column(value: str | int | None) -> str | int | None:
    """A column flag: an integer selects by position (0-based), anything else by header name."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return value


def resolve_task_data(name: str, *, text_column=None, text_b_column=None, label_column=None,
                      has_header: bool | None = None, label_names=None,
                      train_file: str | None = None, skip_bad_rows: bool = False) -> TaskData:
    """The `TaskData` of a task name, with column and label overrides applied.

    Args:
      name: a name of `task_names()`.
      text_column, text_b_column, label_column: override the task's column mapping for
        TSV/CSV/JSONL files (header names, or 0-based indices as digits); None keeps the
        task's preset (GLUE's TSV layout for GLUE tasks; "text"/"label" for your own).
      has_header: override whether TSV/CSV files start with a header row.
      label_names: class names (tags) in id order; None keeps the task's, or reads them from
        `train_file` when the task has none.
      train_file: the training file, to read label names from.
      skip_bad_rows: skip malformed rows while reading label names.

    Returns:
      The `TaskData`.

    Raises:
      UserError: unknown name; column flags for a task that reads no columns; label names
        needed but no training file to read them from.
    """
    td = _base_task_data(name)
    overrides = {"text": _column(text_column), "text_b": _column(text_b_column),
                 "label": _column(label_column)}
    if any(v is not None for v in overrides.values()) or has_header is not None:
        if td.family not in ("classification", "regression"):
            raise UserError(f"column flags (--text_column, --text_b_column, --label_column, "
                            f"--no_header) apply to classification and regression files, not "
                            f"to task '{name}' ({td.family})")
        preset = td.columns or TextColumns()
        columns = dataclasses.replace(preset, **{k: v for k, v in overrides.items()
                                                 if v is not None})
        td = dataclasses.replace(
            td, columns=columns, text_keys=("text", "text_b") if columns.text_b is not None
            else ("text",), has_header=td.has_header if has_header is None else has_header)
    if label_names:
        if td.family in ("regression", "squad"):
            raise UserError(f"--label_names does not apply to task '{name}' ({td.family})")
        task_data_lib.check_label_names(label_names, "--label_names")
        td = dataclasses.replace(td, label_names=tuple(label_names))
    if td.label_names is None and td.family in ("classification", "tagging"):
        if train_file is None:
            raise UserError(f"task '{name}' reads its label names from --train_file; pass it "
                            "or give --label_names")
        td = td.with_labels_from(train_file, skip_bad_rows=skip_bad_rows)
    return td


def build_task(task_data: TaskData, encoder: EncoderSpec, *,
               config: FinetuneConfig | None = None, data: DataConfig | None = None,
               squad: SquadConfig | None = None,
               metrics: tuple[str, ...] | None = None) -> FinetuningTask:
    """The fine-tuning task of `task_data`'s family.

    Args:
      task_data: from `resolve_task_data`.
      encoder: the encoder to build and its vocabulary.
      config: shared hyperparameters (None: the defaults).
      data: where the examples come from (None: the task's TFDS dataset).
      squad: SQuAD options (question answering only; None: the defaults).
      metrics: classification/regression eval metrics (None: the task's defaults).

    Returns:
      A `SentenceClassificationTask`, `QuestionAnsweringTask` or `TaggingTask`.
    """
    cls = TASK_CLASSES[task_data.family]
    if cls is QuestionAnsweringTask:
        return cls(task_data, encoder, config=config, data=data, squad=squad)
    if cls is SentenceClassificationTask:
        return cls(task_data, encoder, config=config, data=data, metrics=metrics)
    return cls(task_data, encoder, config=config, data=data)


def task_from_info(info: dict, encoder: EncoderSpec, *, config: FinetuneConfig | None = None,
                   data: DataConfig | None = None, where: str = "model info") -> FinetuningTask:
    """Rebuilds the task a model directory was trained on, from its stored `task_info()`.

    Args:
      info: the "task" entry of bert_train.json.
      encoder: the model directory's encoder.
      config: hyperparameters; None uses the stored seq_length and the default batch sizes.
      data: where the (evaluation) examples come from.
      where: named in error messages (e.g. the bert_train.json path).

    Returns:
      The task, with the stored labels, column mapping and options.
    """
    name, family = info.get("name"), info.get("family")
    if not name or family not in TASK_CLASSES:
        raise UserError(f"{where}: the task entry lacks a name or a known family; pass --task")
    try:
        td = _base_task_data(name)
    except UserError:  # A task name this version does not know: rebuild it as local files.
        td = task_data_lib.local_task_data(name, family)
    columns = info.get("columns")
    td = dataclasses.replace(
        td, family=family,
        label_names=tuple(info["label_names"]) if info.get("label_names") else None,
        text_keys=tuple(info.get("text_keys") or td.text_keys),
        columns=TextColumns(**columns) if columns else td.columns,
        has_header=info.get("has_header", td.has_header),
        file_format=info.get("file_format", td.file_format))
    if config is None:
        config = FinetuneConfig(seq_length=int(info.get("seq_length", 128)),
                                **windows.stored_options(info))
    squad = SquadConfig(**info["squad"]) if info.get("squad") else None
    metrics = tuple(info["metrics"]) if info.get("metrics") else None
    return build_task(td, encoder, config=config, data=data, squad=squad, metrics=metrics)
