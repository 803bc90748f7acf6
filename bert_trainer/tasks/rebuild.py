"""Rebuilding the task a model directory (or export) was trained on, from its bert_train.json.

A model directory from elsewhere never chooses what is imported: its family is looked up with
`plugins.family_from_info`, which names a plugin's module instead of importing it.
"""

import dataclasses

from bert_trainer.data.sources import TextColumns
from bert_trainer.errors import UserError
from bert_trainer.tasks import plugins, registry
from bert_trainer.tasks.family import Family
from bert_trainer.tasks.finetuning import (
    DataConfig,
    EncoderSpec,
    FinetuneConfig,
    FinetuningTask,
    stored_config_options,
)


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
    family = plugins.family_from_info(info, where)
    _check_entry(info, family, where)
    if not (family.presets() or family.local_tasks):
        raise UserError(f"{where}: a {family.name} model directory has no fine-tuning task to "
                        "evaluate; fine-tune it first (bert-train finetune --init_checkpoint="
                        "this directory), or pass a fine-tuned --model_dir")
    try:
        td = registry.base_task_data(name)
    except UserError:  # A task name this version does not know: rebuild it as local files.
        td = registry.local_task_data(name, family)
    if td.family is not family:
        td = registry.local_task_data(name, family)
    columns = info.get("columns")
    td = dataclasses.replace(
        td, label_names=tuple(info["label_names"]) if info.get("label_names") else None,
        text_keys=tuple(info.get("text_keys") or td.text_keys),
        columns=TextColumns(**columns) if columns else td.columns,
        has_header=info.get("has_header", td.has_header),
        file_format=info.get("file_format", td.file_format))
    if config is None:
        config = FinetuneConfig(**stored_config_options(info))
    return registry.build_task(td, encoder, config=config, data=data,
                               **family.options_from_info(info))
