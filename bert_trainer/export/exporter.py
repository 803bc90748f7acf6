"""A bert-train model directory -> a serving module -> a text-in SavedModel.

The model directory's `bert_train.json` says what to rebuild: the encoder config, the
vocabulary and the task (`FinetuningTask.task_info()`: family, label_names, seq_length,
text_keys, windows (how long texts are read), and the family's own options). The task's
family (`bert_trainer/tasks/family.py`) rebuilds the task model (`head_model`), which is
restored from a checkpoint with every variable required and wrapped in the family's serving
module (`serving_module`); the export records the family in `FAMILY_FILE`. A pretrained
encoder (a family that `exports_encoder`: masked-LM pretraining, or no task at all) exports
the encoder's `encode` signature only: there is no task to answer.

The encoder is rebuilt in float32 whatever policy it trained under: a SavedModel must run on
any device (mixed float16 is slow or unsupported on CPUs), and the variables are float32 anyway.
"""

import dataclasses
import json
import os

import tensorflow as tf
from absl import logging

from bert_trainer import ops, outputs
from bert_trainer.checkpoints import layout as checkpoint_layout
from bert_trainer.checkpoints import model_dir as model_dir_lib
from bert_trainer.checkpoints import select
from bert_trainer.errors import UserError
from bert_trainer.serving import EncoderServing, ServingModule
from bert_trainer.tasks import plugins

# Written into an export (TF Serving's place for files the graph does not use): the family
# and its module, so that `predict --saved_model` formats answers with a plugin family too.
FAMILY_FILE = os.path.join("assets.extra", "bert_train_family.json")


def _restore_task_model(model, prefix: str) -> None:
    """Restores every variable of `model` from `prefix`; UserError if any is missing."""
    try:
        # The optimizer's slots and the step are not exported (restore_model skips them).
        checkpoint_layout.restore_model(model, prefix)
    except UserError as e:
        raise UserError(f"checkpoint {prefix} does not fit the task model described in "
                        f"{model_dir_lib.MODEL_INFO_FILE} ({e})") from None
    except (IndexError, ValueError, tf.errors.OpError) as e:  # IndexError: a truncated file
        first = str(e).strip().splitlines()[0][:300]
        raise UserError(f"checkpoint {prefix} could not be read ({first})") from None


def build_serving_module(model_dir: str, *, checkpoint: str | None = None,
                         seq_length: int | None = None) -> ServingModule:
    """Rebuilds a model directory's model, restores it and wraps it for serving.

    The task's family (`tasks.plugins.family_from_info`) builds the head model and wraps
    it in its serving module.

    Args:
      model_dir: a bert-train model directory (fine-tuned or pretrained).
      checkpoint: "best", "latest", a step or a checkpoint prefix in `model_dir`; None:
        best when recorded, else latest (see `checkpoints.select`).
      seq_length: packed length of the text signatures; default: the task's `seq_length`,
        else the encoder's `max_sequence_length`.

    Returns:
      The family's `TaskServing`, or (a pretrained encoder) an `EncoderServing`.
    """
    info = model_dir_lib.read_model_info(model_dir)
    where = os.path.join(model_dir, model_dir_lib.MODEL_INFO_FILE)
    task = info.task or {}
    family = None
    if task.get("family") is not None:
        try:
            family = plugins.family_from_info(task, where)
        except UserError as e:
            raise UserError(f"{where}: task family {task.get('family')!r} cannot be exported "
                            f"({e})") from None
        if family.exports_encoder:
            family = None  # a pretrained encoder: the encode signature
    if info.vocab_file is None:
        from bert_trainer.interop import gpt2  # noqa: PLC0415 (only for this message)

        gpt2.check_text_support(task, model_dir)  # converted from GPT-2: no tokenizer at all
        raise UserError(f"{where} names no vocab_file; an export needs the vocabulary "
                        "(re-run convert/finetune with --vocab_file)")
    prefix = select.select_checkpoint(model_dir, checkpoint)
    float32_info = dataclasses.replace(info, encoder_config={**info.encoder_config,
                                                             "dtype": "float32"})
    encoder = model_dir_lib.build_encoder(float32_info)
    seq_length = int(seq_length or task.get("seq_length") or encoder.max_sequence_length)
    common = dict(vocab_file=info.vocab_file, lower_case=info.lower_case, seq_length=seq_length)
    logging.info("Exporting %s (%s) from %s", task.get("name", "encoder"),
                 task.get("family"), prefix)
    if family is None:
        model_dir_lib.restore_pretrained(prefix, encoder=encoder)
        return EncoderServing(encoder, **common)
    model = family.head_model(encoder, task, where)
    _restore_task_model(model, prefix)
    module = family.serving_module(model, task, **common)
    module.family = family.name  # What predict and the export's family record go by.
    # What an export records so that bert-train can rebuild this module (`rebuild_module`).
    module.model_record = {"encoder_class": info.encoder_class,
                           "encoder_config": info.encoder_config,
                           "registered_name": info.registered_name,
                           "lower_case": info.lower_case, "task": task, "seq_length": seq_length}
    return module


def rebuild_module(saved_model: str, record: dict) -> ServingModule | None:
    """The serving module an export was written from, rebuilt in this process.

    The export's family record holds the model's description (`model_record`: the encoder's
    config, the task entry, seq_length); the module is built from it as from a model
    directory, with the export's vocabulary asset, and its variables are read from the
    export's checkpoint (`variables/`), every one required. The graph is not loaded: the
    module traces its own functions, so it can run the fused kernels and token packing.

    Args:
      saved_model: the export directory.
      record: its `read_family` record.

    Returns:
      The family's serving module (portable, untraced); None for an export that records no
      model (written before it did).

    Raises:
      UserError: the record or the variables do not describe a model this bert-train builds.
    """
    model = record.get("model")
    if not isinstance(model, dict):
        return None
    where = os.path.join(saved_model, FAMILY_FILE)
    try:
        info = model_dir_lib.ModelInfo(
            encoder_class=str(model["encoder_class"]),
            encoder_config={**model["encoder_config"], "dtype": "float32"},
            vocab_file=os.path.join(saved_model, "assets", "vocab.txt"),
            lower_case=bool(model["lower_case"]), task=dict(model["task"]),
            registered_name=model.get("registered_name"))
        seq_length = int(model["seq_length"])
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{where}: its model entry is incomplete ({e!r}); re-export the "
                        "model") from None
    family = plugins.family_from_info(info.task, where)
    task_model = family.head_model(model_dir_lib.build_encoder(info), info.task, where)
    module = family.serving_module(task_model, info.task, vocab_file=info.vocab_file,
                                   lower_case=info.lower_case, seq_length=seq_length)
    module.family = family.name
    variables = os.path.join(saved_model, "variables", "variables")
    try:
        status = tf.train.Checkpoint(root=module).read(variables)
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as e:
        first = str(e).strip().splitlines()[0][:300]
        raise UserError(f"{variables} does not fit the model {where} describes ({first}); "
                        "re-export the model") from None
    try:
        # Every value of the export must have found its variable. A model whose layers are
        # built on their first call (a decoder) has no variable yet for some of them: they
        # would keep their random initial values, so the export's own graph serves instead.
        status.assert_consumed()
    except AssertionError as e:
        logging.info("Serving %s from its graph: %d of its values have no variable in the "
                     "rebuilt model before its first call (%s)", saved_model,
                     str(e).count("checkpoint_key"), str(e).strip().splitlines()[0][:120])
        return None
    return module


def _is_saved_model(path: str) -> bool:
    """Whether `path` holds a SavedModel and nothing else (an export made before markers)."""
    entries = set(os.listdir(path))
    return "saved_model.pb" in entries and entries <= _SAVED_MODEL_ENTRIES


_SAVED_MODEL_ENTRIES = {"saved_model.pb", "fingerprint.pb", "variables", "assets",
                        "assets.extra"}
SAVED_MODEL = outputs.Kind("export", "a SavedModel written by bert-train export",
                           directory=True, recognizes=_is_saved_model)


def check_output_dir(output: str, overwrite: bool = False, *,
                     model_dir: str | None = None) -> str:
    """The absolute export path, once it is known that writing it loses nothing.

    Args:
      output: the export directory.
      overwrite: replace an existing export (a SavedModel bert-train export wrote, nothing else).
      model_dir: the model directory exported; `output` may not be it, hold it or lie in it.

    Returns:
      The absolute path.

    Raises:
      UserError: see `outputs.check_output`, and an `output` that is, contains or lies in
        `model_dir`.
    """
    if model_dir is not None:
        outputs.check_apart(output, model_dir, "--model_dir")
    return outputs.check_output(output, SAVED_MODEL, overwrite=overwrite)


def save(module: ServingModule, output: str, *, overwrite: bool = False) -> str:
    """Writes `module` as a SavedModel at `output`, all at once (temp dir, then rename).

    Args:
      module: a serving module.
      output: the export directory; must not exist or be empty unless `overwrite`.
      overwrite: replace an existing export directory (only a SavedModel that bert-train
        export wrote; see `check_output_dir`).

    Returns:
      `output`, absolute.

    Raises:
      UserError: a refused `output`, or a full disk / refused write while saving (the
        temporary directory is removed and an existing export is left as it was).
    """
    if not module.portable:  # its functions may hold bert-train's kernels: no SavedModel
        raise ValueError("a module traced for in-process serving (portable=False) cannot be "
                         "saved; build another with build_serving_module")
    output = check_output_dir(output, overwrite)
    size = sum(v.shape.num_elements() * v.dtype.size for v in module.variables)
    with outputs.new_directory(output, SAVED_MODEL, writing="SavedModel",
                               needed_bytes=size) as staging:
        with ops.portable():  # a retrace during saving is portable too
            tf.saved_model.save(module, staging, signatures=module.signatures())
        _write_family(module, staging)
    return output


def _write_family(module: ServingModule, directory: str) -> None:
    """Records the module's task family (and the module registering it) in `FAMILY_FILE`."""
    family = plugins.registered(getattr(module, "family", None))
    if family is None:  # An encoder export: no task, no answers to format.
        return
    path = os.path.join(directory, FAMILY_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    record = {"family": family.name, "family_module": family.module_name()}
    if getattr(module, "model_record", None) is not None:
        record["model"] = module.model_record  # `rebuild_module` reads it
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f)


def read_family(saved_model: str) -> dict | None:
    """The {"family", "family_module"[, "model"]} an export recorded; None for an older
    export."""
    path = os.path.join(saved_model, FAMILY_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"{path} cannot be read ({e}); re-export the model") from None
    return record if isinstance(record, dict) else None


def export_saved_model(model_dir: str, output: str, *, checkpoint: str | None = None,
                       seq_length: int | None = None, overwrite: bool = False) -> dict:
    """`bert-train export`: a model directory to a text-in SavedModel.

    Args:
      model_dir, checkpoint, seq_length: see `build_serving_module`.
      output, overwrite: see `save`.

    Returns:
      {"output", "family", "signatures": {name: {"inputs": [...], "outputs": [...]}}}.
    """
    check_output_dir(output, overwrite, model_dir=model_dir)  # Before the slow part.
    module = build_serving_module(model_dir, checkpoint=checkpoint, seq_length=seq_length)
    signatures = module.signatures()
    path = save(module, output, overwrite=overwrite)
    described = {name: {"inputs": [spec.name for spec in fn.structured_input_signature[0]],
                        "outputs": sorted(fn.structured_outputs)}
                 for name, fn in signatures.items()}
    return {"output": path, "family": module.family, "seq_length": module.seq_length,
            "signatures": described}
