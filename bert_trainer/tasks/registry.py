"""Task families and task names -> the family that trains them, and the tasks they build.

Families register themselves (`register_family`) when their module is imported. The
built-in ones (`BUILT_IN`: one line per family) are imported on first use; others are
plugins, imported from
- `import_family_modules("my.module")`: the commands' `--family_module` flag;
- the `BERT_TRAIN_FAMILIES` environment variable (comma-separated modules);
- the `bert_train.families` entry-point group of installed packages (each entry point names
  a module, or an object to call, that registers its family);
- never from what a model directory records: its bert_train.json's "family_module" is named
  in the message of `family_from_info` (pass it with --family_module if you trust it).

Every dataset a family declares (imdb, the GLUE tasks, squad, squad_v2, conll2003, the
translation sets) is a task; the families' `local_tasks` (classification, regression, tagging,
translate) train on your own files. `resolve_task_data` + `build_task` make a task for a run;
`task_from_info` rebuilds the one a model directory was trained on (`evaluate`).
"""

import dataclasses
import importlib
import os
from importlib import metadata

from bert_trainer.data import task_data as task_data_lib
from bert_trainer.data.sources import TextColumns
from bert_trainer.data.task_data import TaskData
from bert_trainer.errors import UserError
from bert_trainer.tasks.family import Family
from bert_trainer.tasks.finetuning import (
    DataConfig,
    EncoderSpec,
    FinetuneConfig,
    FinetuningTask,
    stored_config_options,
)

BUILT_IN = {
    "classification": "bert_trainer.tasks.classification",
    "regression": "bert_trainer.tasks.regression",
    "squad": "bert_trainer.tasks.squad",
    "tagging": "bert_trainer.tasks.tagging",
    "translate": "bert_trainer.tasks.translate",
    "causal_lm": "bert_trainer.tasks.causal_lm",
    "masked_lm": "bert_trainer.tasks.masked_lm",
}
# What a family's model directories record as "family", where it is not the family's name:
# masked-LM pretraining has always written "pretraining".
RECORDED_NAMES = {"pretraining": "masked_lm"}
ENV_VAR = "BERT_TRAIN_FAMILIES"
ENTRY_POINT_GROUP = "bert_train.families"

_families: dict[str, Family] = {}
_plugins_loaded = False


def register_family(family: Family) -> Family:
    """Makes `family` known by its name (and its datasets by theirs); returns it.

    Registering the same family class again replaces the earlier object (a module imported
    twice); another family under a taken name, or a dataset name another family declares, is
    refused.
    """
    if not isinstance(family, Family) or not family.name:
        raise UserError(f"register_family: {family!r} is not a named tasks.family.Family")
    old = _families.get(family.name)
    built_in = BUILT_IN.get(family.name)
    if built_in and not family.module_name().startswith(built_in):
        raise UserError(f"task family '{family.name}' is already registered by {built_in}; "
                        "give the family another name")
    if old is not None and type(old).__qualname__ != type(family).__qualname__:
        raise UserError(f"task family '{family.name}' is already registered by "
                        f"{old.module_name()}; give the family another name")
    names = {t.name for t in family.presets()} | set(family.local_tasks)
    for other in _families.values():
        if other.name != family.name:
            clash = names & ({t.name for t in other.presets()} | set(other.local_tasks))
            if clash:
                raise UserError(f"task family '{family.name}' declares the task "
                                f"'{sorted(clash)[0]}' of family '{other.name}'; rename it")
    _families[family.name] = family
    return family


def _import(module: str, source: str) -> None:
    """Imports a family module the user named; any failure is one line naming the module."""
    if "/" in module or "\\" in module or module.endswith(".py"):
        name = os.path.splitext(os.path.basename(module))[0]
        raise UserError(f"{source}: '{module}' is a file path, not a module name; put its "
                        f"folder on PYTHONPATH and pass --family_module={name}")
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise UserError(f"{source}: cannot import the task family module '{module}' ({e}); "
                        "install it or fix PYTHONPATH") from None
    except Exception as e:  # noqa: BLE001 (the plugin's own code failed: one line, named)
        first = (str(e).strip().splitlines() or [""])[0]
        error = UserError(f"{source}: importing the task family module '{module}' failed: "
                          f"{type(e).__name__}: {first}; fix the module")
        raise error from None


def import_family_modules(modules, source: str = "--family_module") -> None:
    """Imports plugin family modules (each registers its family when imported).

    Args:
      modules: a comma-separated string or a list of module names; None or empty: none.
      source: named in error messages.
    """
    if isinstance(modules, str):
        modules = modules.split(",")
    for module in modules or ():
        if module.strip():
            _import(module.strip(), source)


def load_plugins() -> None:
    """Imports the families of `BERT_TRAIN_FAMILIES` and of the entry points, once."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    import_family_modules(os.environ.get(ENV_VAR), ENV_VAR)
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = entry.load()
        except ImportError as e:
            raise UserError(f"entry point {entry.name} ({ENTRY_POINT_GROUP}) of an installed "
                            f"package cannot be imported ({e})") from None
        if isinstance(loaded, Family):
            register_family(loaded)
        elif callable(loaded) and not isinstance(loaded, type):
            loaded()


def _built_in(name: str) -> None:
    """Imports a built-in family's package; registers its `FAMILY` if the import did not
    (a package imported before the registry was reset)."""
    if name not in _families:
        register_family(importlib.import_module(BUILT_IN[name]).FAMILY)


def families() -> list[Family]:
    """Every family: the built-in ones and the plugins."""
    for name in BUILT_IN:
        _built_in(name)
    load_plugins()
    return list(_families.values())


def get_family(name: str) -> Family:
    """The family named `name` (the built-in one is imported on first use).

    Raises:
      UserError: no such family (the message lists the known ones).
    """
    if name in BUILT_IN:
        _built_in(name)
    if name not in _families:
        load_plugins()
    if name not in _families:
        known = sorted({f.name for f in families()})
        raise UserError(f"unknown task family '{name}'; known: {', '.join(known)} (a plugin "
                        f"family needs --family_module or {ENV_VAR})")
    return _families[name]


def registered(name: str | None) -> Family | None:
    """The family registered as `name` now (nothing is imported), or None."""
    return _families.get(name) if name else None


def objectives() -> dict:
    """{name: pretraining objective (`tasks.objective.Objective`)} of the built-in families
    (and of any family registered so far: no plugin is imported for it)."""
    for name in BUILT_IN:
        _built_in(name)
    return {f.objective.name: f.objective for f in _families.values()
            if f.objective is not None}


def objective(name: str):
    """The pretraining objective of `pretraining_objective.name` `name`, from the family that
    owns it.

    Raises:
      UserError: no family has it (the message lists the known ones).
    """
    owned = objectives()
    if name not in owned:
        raise UserError(f"pretraining_objective.name={name!r} is unknown; use one of "
                        f"{', '.join(sorted(owned))}")
    return owned[name]


def family_from_info(task: dict, where: str = "model info") -> Family:
    """The family of a stored task entry.

    A model directory (or export) from elsewhere never chooses what is imported: a plugin
    family is found only if the user named its module (`--family_module`, `BERT_TRAIN_FAMILIES`
    or an installed entry point); the recorded "family_module" is only named in the message.
    """
    name = task.get("family")
    if not name:
        raise UserError(f"{where}: the task entry names no family; pass --task")
    name = RECORDED_NAMES.get(name, name)
    if name not in _families and name not in BUILT_IN:
        load_plugins()
    module = task.get("family_module")
    if name not in _families and name not in BUILT_IN and module:
        raise UserError(f"{where}: the task family '{name}' is in the module '{module}', which "
                        "is imported only when you name it (a model directory does not choose "
                        f"what runs); if you trust it, pass --family_module={module}")
    return get_family(name)


def _tasks() -> dict[str, tuple[Family, TaskData | None]]:
    """Task name → (family, its dataset or None for a local-files task)."""
    tasks = {}
    for family in families():
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
    family = get_family(family) if isinstance(family, str) else family
    columns = columns or TextColumns()
    fields = dict(text_keys=("text", "text_b") if columns.text_b is not None else ("text",),
                  columns=columns, label_names=tuple(label_names) if label_names else None,
                  has_header=has_header, version_2=version_2)
    if file_format is not None:
        fields["file_format"] = file_format
    return family.local_task_data(name, **fields)


def _base_task_data(name: str) -> TaskData:
    tasks = _tasks()
    if name not in tasks:
        local = sorted(n for f in _families.values() for n in f.local_tasks)
        raise UserError(f"unknown task '{name}'; choose one of: {', '.join(sorted(tasks))} "
                        f"({_and(local)} read your own --train_file)")
    family, preset = tasks[name]
    return preset if preset is not None else local_task_data(name, family)


def family_of(name: str) -> Family:
    """The family of a task name."""
    return _base_task_data(name).family


def _and(names) -> str:
    """'a, b and c'."""
    names = list(names)
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


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
    family = td.family
    overrides = {"text": _column(text_column), "text_b": _column(text_b_column),
                 "label": _column(label_column)}
    if any(v is not None for v in overrides.values()) or has_header is not None:
        if not family.reads_columns:
            readers = sorted(f.name for f in _families.values() if f.reads_columns)
            raise UserError(f"column flags (--text_column, --text_b_column, --label_column, "
                            f"--no_header) apply to {_and(readers)} files, not "
                            f"to task '{name}' ({td.family_name})")
        preset = td.columns or TextColumns()
        columns = dataclasses.replace(preset, **{k: v for k, v in overrides.items()
                                                 if v is not None})
        td = dataclasses.replace(
            td, columns=columns, text_keys=("text", "text_b") if columns.text_b is not None
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


def _check_entry(info: dict, family: Family, where: str) -> None:
    """Refuses a stored task entry that records what its family never writes (its "family"
    edited by hand: an sst2 entry made squad would otherwise be told to raise --seq_length)."""
    if info.get("label_names") and not family.has_label_names:
        what = f"the class names {list(info['label_names'])[:20]}"
    elif (info.get("columns") and not family.reads_columns
          and family.module_name().startswith("bert_trainer.")):
        # bert-train's own families record columns only when they read them; a plugin's
        # examples may come from columns its flags do not name.
        mapping = info["columns"] if isinstance(info["columns"], dict) else {}
        what = "the columns " + ", ".join(f"{k}={v!r}" for k, v in mapping.items() if v is not None)
    else:
        return
    raise UserError(f"{where}: the task entry names family '{family.name}' (task "
                    f"{info.get('name')!r}) but records {what}, which a {family.name} task does "
                    "not have: the entry does not describe the model trained here; restore the "
                    "family it was trained as")


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
    name = info.get("name")
    if not name or not info.get("family"):
        raise UserError(f"{where}: the task entry lacks a name or a known family; pass --task")
    family = family_from_info(info, where)
    _check_entry(info, family, where)
    if not (family.presets() or family.local_tasks):
        raise UserError(f"{where}: a {family.name} model directory has no fine-tuning task to "
                        "evaluate; fine-tune it first (bert-train finetune --init_checkpoint="
                        "this directory), or pass a fine-tuned --model_dir")
    try:
        td = _base_task_data(name)
    except UserError:  # A task name this version does not know: rebuild it as local files.
        td = local_task_data(name, family)
    if td.family is not family:
        td = local_task_data(name, family)
    columns = info.get("columns")
    td = dataclasses.replace(
        td, label_names=tuple(info["label_names"]) if info.get("label_names") else None,
        text_keys=tuple(info.get("text_keys") or td.text_keys),
        columns=TextColumns(**columns) if columns else td.columns,
        has_header=info.get("has_header", td.has_header),
        file_format=info.get("file_format", td.file_format))
    if config is None:
        config = FinetuneConfig(**stored_config_options(info))
    return build_task(td, encoder, config=config, data=data, **family.options_from_info(info))
