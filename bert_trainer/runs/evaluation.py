"""An evaluation of a fine-tuned model directory: the task it was trained on, rebuilt from its
`bert_train.json`, and the files the evaluation writes beside the run's own.

`bert-train evaluate` reads its flags, calls `evaluation_task` and
`training.checkpoint_eval.evaluate_checkpoint`, prints the metrics and `write_results`. An
evaluation writes its own files (`eval_results-ckpt-N.json`), never the run's
`eval_results.json`, so it can run beside a live fine-tune.
"""

import json
import os

from bert_trainer.errors import UserError

RESULTS_STEM, PREDICTIONS_STEM = "eval_results", "eval_predictions"


def evaluation_task(model_dir: str, info, name: str | None, data, *, batch_size: int):
    """The task stored in the model directory (or --task `name`), reading `data`.

    Args:
      model_dir: a fine-tuned model directory.
      info: its `bert_train.json` (`checkpoints.model_dir.read_model_info`).
      name: a task name, for a directory whose record names none (else it must match).
      data: a `tasks.finetuning.DataConfig` (the evaluation file or TFDS split).
      batch_size: the global evaluation batch.
    """
    from bert_trainer.tasks import finetuning, rebuild, registry  # noqa: PLC0415

    where = os.path.join(model_dir, "bert_train.json")
    stored = info.task
    if stored is None:
        if not name:
            raise UserError(f"{where} names no task (it was not written by finetune); pass "
                            "--task")
        stored = {"name": name, "family": registry.family_of(name).name,
                  "label_names": registry.resolve_task_data(name).label_names}
    elif name and name != stored.get("name"):
        raise UserError(f"{model_dir} was fine-tuned on task '{stored.get('name')}', not "
                        f"'{name}'; drop --task or pass another --model_dir")
    spec = finetuning.spec_from_checkpoint(model_dir, flag="--model_dir")
    config = finetuning.FinetuneConfig(eval_batch_size=batch_size,
                                       **finetuning.stored_config_options(stored))
    return rebuild.task_from_info(stored, spec, config=config, data=data, where=where)


def own_file(stem: str, model_dir: str, prefix: str) -> str:
    """evaluate's file for checkpoint `prefix`: STEM-ckpt-N.json (best/: STEM-best-ckpt-N.json).

    Args:
      stem: "eval_results" or "eval_predictions".
      model_dir: the run's directory (the file goes there).
      prefix: the checkpoint evaluated, inside `model_dir`.
    """
    name = os.path.relpath(prefix, model_dir).replace(os.sep, "-")
    return os.path.join(model_dir, f"{stem}-{name}.json")


def write_results(task, model_dir: str, results: dict, step: int, prefix: str) -> str:
    """Writes the metrics of checkpoint `prefix` (and SQuAD's answers) to the evaluation's own
    files in `model_dir`; returns the results file's path.

    Raises:
      UserError: a write failed (a full disk, a refused write), naming the file.
    """
    from bert_trainer.checkpoints import storage  # noqa: PLC0415
    from bert_trainer.errors import storage_fault  # noqa: PLC0415
    from bert_trainer.tasks import finetuning  # noqa: PLC0415

    results_path = path = own_file(RESULTS_STEM, model_dir, prefix)
    predictions = getattr(task, "last_predictions", None)
    try:
        finetuning.write_eval_results(model_dir, task, results, step=step, checkpoint=prefix,
                                      path=results_path)
        if predictions:
            path = own_file(PREDICTIONS_STEM, model_dir, prefix)
            storage.write_text_atomically(
                path, json.dumps(predictions, indent=1, ensure_ascii=False))
    except Exception as e:  # noqa: BLE001 (only storage faults are translated)
        fault = storage_fault(e, writing="evaluation results", path=path)
        if fault is None:
            raise
        raise fault from None
    return results_path
