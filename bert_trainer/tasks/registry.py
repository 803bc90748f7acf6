"""Task names: the datasets and local-file tasks the families declare, and the tasks they build.

Every dataset a family declares (imdb, the GLUE tasks, squad, squad_v2, conll2003, the
translation sets) is a task; the families' `local_tasks` (classification, regression, tagging,
translate) train on your own files. `resolve_task_data` (with the column and label overrides
of the commands' flags, checked here alone) + `build_task` make a task for a run. Families
come from `bert_trainer.tasks.plugins`; `bert_trainer.tasks.rebuild` rebuilds the task a
model directory was trained on.
"""

import dataclasses

from bert_trainer.data import task_data as task_data_lib
from bert_trainer.data.sources import TextColumns
from bert_trainer.data.task_data import TaskData
from bert_trainer.errors import UserError
from bert_trainer.tasks import plugins
from bert_trainer.tasks.family import Family
from bert_trainer.tasks.finetuning import DataConfig, EncoderSpec, FinetuneConfig, FinetuningTask


def _tasks() -> dict[str, tuple[Family, TaskData | None]]:
    """Task name → (family, its dataset or None for a local-files task)."""
    tasks = {}
    for family in plugins.families():
        tasks.update({t.name: (family, t) for t in family.presets()})
        tasks.update({name: (family, None) for name in family.local_tasks})
    return tasks


def task_names() -> list[str]:
    """Every name `resolve_task_data` accepts."""
    return sorted(_tasks())


def dataset_names() -> list[str]:
    """The names of the families' datasets (`get_task_data`)."""
    return sorted(name for name, (_, preset) in _tasks().items() if preset is not None)


def get_task_data(name: str) -> TaskData:
    """The dataset (`TaskData` preset) a family declares under `name`.

    Raises:
      UserError: unknown name (the message lists the known ones).
    """
    family_and_preset = _tasks().get(name)
    if family_and_preset is None or family_and_preset[1] is None:
        raise UserError(f"unknown task '{name}'; choose one of {', '.join(dataset_names())}, "
                        "or use your own files with --train_file/--eval_file")
    return family_and_preset[1]


def local_task_data(name: str, family: str | Family, *, label_names=None,
                    columns: TextColumns | None = None, has_header: bool = True,
                    file_format: str | None = None, version_2: bool = False) -> TaskData:
    """A task read only from local files (`--train_file/--eval_file`).

    Args:
      name: task name used in messages.
      family: a family or its name.
      label_names: class names (tags) in id order; None to read them from the training file
        with `TaskData.with_labels_from`.
      columns: TSV/CSV/JSONL columns of text, text_b and label (default "text", "label").
      has_header: TSV/CSV files start with a header row.
      file_format: force a format; None: the family's, else the file extension's.
      version_2: a SQuAD v2.0 task (unanswerable questions).

    Returns:
      The `TaskData`.
    """
    family = plugins.get_family(family) if isinstance(family, str) else family
    columns = columns or TextColumns()
    fields = dict(text_keys=("text", "text_b") if columns.text_b is not None else ("text",),
                  columns=columns, label_names=tuple(label_names) if label_names else None,
                  has_header=has_header, version_2=version_2)
    if file_format is not None:
        fields["file_format"] = file_format
    return family.local_task_data(name, **fields)


def base_task_data(name: str) -> TaskData:
    tasks = _tasks()
    if name not in tasks:
        local = sorted(n for f in plugins.families() for n in f.local_tasks)
        raise UserError(f"unknown task '{name}'; choose one of: {', '.join(sorted(tasks))} "
                        f"({_and(local)} read your own --train_file)")
    family, preset = tasks[name]
    return preset if preset is not None else local_task_data(name, family)


def family_of(name: str) -> Family:
    """The family of a task name."""
    return base_task_data(name).family


def _and(names) -> str:
    """'a, b and c'."""
    names = list(names)
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def _column(value: str | int | None) -> str | int | None:
    """A column flag: an integer selects by position (0-based), anything else by header name."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return value


def resolve_task_data(name: str, *, columns: dict | None = None,
                      has_header: bool | None = None, label_names=None,
                      train_file: str | None = None, skip_bad_rows: bool = False) -> TaskData:
    """The `TaskData` of a task name, with column and label overrides applied.

    Every check of the column flags is here: a family that reads no columns refuses them
    all, and a family refuses another family's (`Family.column_flags`).

    Args:
      name: a name of `task_names()`.
      columns: the column flags given, by flag name ({"text_column": "review"}; translate's
        are "source_column" and "target_column"): header names, or 0-based indices as
        digits; a column not given keeps the task's preset (GLUE's TSV layout for GLUE tasks;
        "text"/"label" for your own).
      has_header: override whether TSV/CSV files start with a header row.
      label_names: class names (tags) in id order; None keeps the task's, or reads them from
        `train_file` when the task has none.
      train_file: the training file, to read label names from.
      skip_bad_rows: skip malformed rows while reading label names.

    Returns:
      The `TaskData`.

    Raises:
      UserError: unknown name; column flags for a task that reads no columns or of another
        family; label names needed but no training file to read them from.
    """
    td = base_task_data(name)
    family = td.family
    columns = {flag: value for flag, value in (columns or {}).items() if value is not None}
    if columns or has_header is not None:
        if not family.reads_columns:
            readers = sorted(f.name for f in plugins.families() if f.reads_columns)
            raise UserError(f"column flags (--{', --'.join(columns) or 'no_header'}) apply to "
                            f"{_and(readers)} files, not to task '{name}' ({td.family_name})")
        foreign = [flag for flag in columns if flag not in family.column_flags]
        if foreign:
            own = ", ".join(f"--{flag}" for flag in family.column_flags)
            raise UserError(f"--{foreign[0]} does not apply to {family.name} tasks; their "
                            f"columns are {own}")
        overrides = {family.column_flags[flag].removesuffix("_column"): _column(value)
                     for flag, value in columns.items()}
        preset = td.columns or TextColumns()
        mapping = dataclasses.replace(preset, **overrides)
        td = dataclasses.replace(
            td, columns=mapping, text_keys=("text", "text_b") if mapping.text_b is not None
            else ("text",), has_header=td.has_header if has_header is None else has_header)
    if label_names:
        if not family.has_label_names:
            raise UserError(f"--label_names does not apply to task '{name}' ({td.family_name})")
        task_data_lib.check_label_names(label_names, "--label_names")
        td = dataclasses.replace(td, label_names=tuple(label_names))
    if td.label_names is None and family.has_label_names:
        if train_file is None:
            raise UserError(f"task '{name}' reads its label names from --train_file; pass it "
                            "or give --label_names")
        td = td.with_labels_from(train_file, skip_bad_rows=skip_bad_rows)
    return td


def build_task(task_data: TaskData, encoder: EncoderSpec, *,
               config: FinetuneConfig | None = None, data: DataConfig | None = None,
               **options) -> FinetuningTask:
    """The fine-tuning task of `task_data`'s family.

    Args:
      task_data: from `resolve_task_data`.
      encoder: the encoder to build and its vocabulary.
      config: shared hyperparameters (None: the defaults).
      data: where the examples come from (None: the task's TFDS dataset).
      **options: the family's own options, e.g. squad=SquadConfig(...) or
        metrics=("accuracy", "f1") (classification); None values are dropped.

    Returns:
      The family's `FinetuningTask`.
    """
    options = {k: v for k, v in options.items() if v is not None}
    return task_data.family.build_task(task_data, encoder, config=config, data=data, **options)
