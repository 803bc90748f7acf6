"""What a run was trained with, and whether a resume honours it (`trained_with` in bert_train.json).

A resumed run continues the run its model directory holds, so it must train with the same
settings: the sequence length, the masking, the learning rate and its schedule (the vocabulary,
casing, task and architecture are checked by `model_dir.check_resume`). The first run records
them; a resume that asks for another value of one is refused in one line naming the setting,
before anything is written. Settings a command derives from the run length (a warmup of 10 %
of `train_steps`) are left out: a longer run may be resumed.

The batch size may change: the input position is counted in examples, so the resumed run
starts at the first example the run has not trained on (the examples of the earlier steps at
their own batch size, not `steps x new batch`). Each change is recorded with the step where it
took effect:

    "trained_with": {
      "settings": {"OptimizerConfig.learning_rate": 2e-05, "FinetuneConfig.seq_length": 32, ...},
      "batches": [{"step": 0, "consumed_steps": 0, "examples": 0, "batch_size": 8},
                  {"step": 5, "consumed_steps": 5, "examples": 40, "batch_size": 32}]}

`batch_size` counts examples per optimizer step (the task's global batch times the
accumulation steps); `consumed_steps` counts the steps' worth of input read (a NaN rollback
drops a step's input: `training/rollback.py`). A directory trained before this record existed
is recorded from the step it resumes at, with its input counted as the old trainer did.
"""

import json
import os
import pathlib

from absl import logging

from bert_trainer.checkpoints import model_dir as model_dir_lib
from bert_trainer.checkpoints import storage
from bert_trainer.errors import UserError

RECORD_KEY = "trained_with"
# The task settings a resume must keep (those its config has): sequence length and masking.
TASK_FIELDS = ("seq_length", "block_size", "max_predictions_per_seq", "masking",
               "masked_lm_prob", "whole_word_masking", "warmup_fraction")
# The optimizer's learning rate and schedule.
OPTIMIZER_FIELDS = ("name", "learning_rate", "schedule", "warmup_steps", "warmup_fraction",
                    "decay_steps", "end_learning_rate", "power")


def settings(optimizer, task_config, derived=()) -> dict:
    """The settings a resume must honour, as {"Config.field": value}.

    Args:
        optimizer: the run's `OptimizerConfig`.
        task_config: the task's config (its fields in `TASK_FIELDS` are taken; None: none).
        derived: gin binding lines of settings the command derived ("OptimizerConfig.
            warmup_steps = 12"): left out, they follow the run length.
    """
    left_out = {line.partition("=")[0].strip() for line in derived}
    values = {}
    for config, fields in ((optimizer, OPTIMIZER_FIELDS), (task_config, TASK_FIELDS)):
        for field in fields:
            name = f"{type(config).__name__}.{field}"
            if hasattr(config, field) and name not in left_out:
                values[name] = getattr(config, field)
    return values


def resume(model_dir: str, new: dict, *, task_batch: int, accumulation_steps: int,
           restored_step: int | None, consumed_steps: int = 0) -> dict:
    """Checks a run against its model directory's record; returns the record to keep.

    Args:
        model_dir: the run's directory.
        new: this run's `settings(...)`.
        task_batch: this run's global task batch (what its input yields per batch).
        accumulation_steps: task batches per optimizer step.
        restored_step: the step of the checkpoint restored (None: a fresh run).
        consumed_steps: steps' worth of input read before `restored_step`.

    Returns:
        The record: the stored one (a batch size change appended), or a new one.

    Raises:
        UserError: a recorded setting differs, or the new batch cannot start at the first
            example not trained on; nothing has been written.
    """
    batch_size = task_batch * accumulation_steps
    stored = read(model_dir) if restored_step is not None else None
    if stored is None:
        return {"settings": new, "batches": [{"step": restored_step or 0, "consumed_steps": 0,
                                              "examples": 0, "batch_size": batch_size}]}
    for name, value in stored["settings"].items():
        if name in new and new[name] != value:
            raise UserError(f"--model_dir={model_dir} was trained with {name}={value!r}; this "
                            f"run asks for {name}={new[name]!r}; resume with {value!r} (the "
                            "same flags and gin files), or train in a new --model_dir")
    record = {"settings": stored["settings"], "batches": list(stored["batches"])}
    last = record["batches"][-1]
    if last["batch_size"] == batch_size:
        return record
    examples = examples_before(record, consumed_steps)
    if examples % task_batch:
        raise UserError(f"--model_dir={model_dir} has trained on {examples} examples (batch "
                        f"size {last['batch_size']}); a batch of {task_batch} cannot start at "
                        f"example {examples + 1}: resume with batch size {last['batch_size']} "
                        f"(or one that divides {examples}), or train in a new --model_dir")
    logging.warning("Batch size %d (was %d): resuming at step %d from example %d, the first "
                    "this run has not trained on (not from %d steps x %d)", batch_size,
                    last["batch_size"], restored_step, examples + 1, consumed_steps,
                    batch_size)
    record["batches"].append({"step": restored_step, "consumed_steps": consumed_steps,
                              "examples": examples, "batch_size": batch_size})
    return record


def batches_before(record: dict, consumed_steps: int, task_batch: int) -> int:
    """Task batches of `task_batch` examples the input skips to continue after
    `consumed_steps` steps' worth of input (`resume` checked that they divide)."""
    return examples_before(record, consumed_steps) // task_batch


def examples_before(record: dict, consumed_steps: int) -> int:
    """Examples read before `consumed_steps` steps' worth of input (the last batch size's
    count continues from where it took effect)."""
    last = [b for b in record["batches"] if b["consumed_steps"] <= consumed_steps][-1]
    return last["examples"] + (consumed_steps - last["consumed_steps"]) * last["batch_size"]


def read(model_dir: str) -> dict | None:
    """The record in model_dir/bert_train.json (None: absent, a run before records)."""
    path = os.path.join(model_dir, model_dir_lib.MODEL_INFO_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f).get(RECORD_KEY)
    except (OSError, ValueError, AttributeError):
        return None  # model_dir.check_resume has refused an unreadable file already
    if not (isinstance(record, dict) and isinstance(record.get("settings"), dict)
            and isinstance(record.get("batches"), list) and record["batches"]):
        return None
    return record


def write(model_dir: str, record: dict) -> None:
    """Adds the record to model_dir/bert_train.json (written aside, then renamed); a task
    that writes no bert_train.json keeps no record."""
    path = os.path.join(model_dir, model_dir_lib.MODEL_INFO_FILE)
    if not os.path.isfile(path):
        return
    info = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    info[RECORD_KEY] = record
    storage.write_text_atomically(path, json.dumps(info, indent=2) + "\n")
