"""Evaluating one checkpoint of a run: the run's Trainer, restored to that checkpoint.

The Trainer runs the evaluation, so it is distributed like training and its results also go to
model_dir/eval for TensorBoard. `bert-train evaluate` calls this with the checkpoint that
`checkpoints.select.select_checkpoint` chose, or with None for the latest.

Beside a run that is still training, the latest checkpoint moves and old ones are deleted: the
checkpoint evaluated, and returned, is the one whose weights were restored (the latest is the
one the Trainer restored when it was built, not one chosen a moment earlier), and a checkpoint
deleted before it could be read is named in one line.
"""

import contextlib
import tempfile

import tensorflow as tf

from bert_trainer.checkpoints import layout as checkpoint_layout
from bert_trainer.checkpoints import resume, select
from bert_trainer.errors import UserError
from bert_trainer.training.trainer import Trainer, TrainerConfig


def evaluate_checkpoint(task, model_dir: str, prefix: str | None, *, strategy=None,
                        write_summaries: bool = True) -> tuple[dict, int, str]:
    """Evaluates the weights of checkpoint `prefix` on the task's eval split.

    Args:
      task: the task (its model is built here).
      model_dir: the fine-tuning run's directory.
      prefix: a checkpoint of that run; None: the latest.
      strategy: the `tf.distribute` strategy; default: the current one.
      write_summaries: False for a model_dir that cannot be written: nothing is written there
        (the Trainer, which refuses a directory it cannot write, gets a scratch one).

    Returns:
      ({metric: value}, the checkpoint's step, the checkpoint evaluated).

    Raises:
      UserError: a checkpoint in the object-graph layout of an older bert-train, or one that
        was deleted (by the run writing `model_dir`) before it could be read.
    """
    latest = next(select.usable_checkpoints(model_dir), None)  # what the Trainer restores
    for path in dict.fromkeys(p for p in (latest, prefix) if p):
        graph, _ = checkpoint_layout.read_object_graph(path)
        if checkpoint_layout.layout(graph) == checkpoint_layout.OBJECT_GRAPH:
            # The Trainer restores whole runs (optimizer included), which needs stable names.
            raise UserError(f"{path} was written by an older bert-train (object-graph variable "
                            "names), which evaluate cannot read; export and predict --model_dir "
                            "still can, or evaluate with the bert-train version that wrote it")
    with contextlib.ExitStack() as stack:
        run_dir = model_dir
        if not write_summaries:
            run_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="bert-train-eval-"))
        # The trainer restores the latest checkpoint of its directory when it is built; any
        # other one is read over it.
        trainer = Trainer(task, run_dir, config=TrainerConfig(train_steps=1), strategy=strategy)
        if prefix is None and run_dir == model_dir:
            prefix = trainer.restored
        prefix = _restore(trainer, prefix, model_dir)
        results, step = trainer.evaluate(), int(trainer.global_step.numpy())
    return results, step, prefix


def _restore(trainer: Trainer, prefix: str | None, model_dir: str) -> str:
    """Restores `prefix` (None: the latest) unless the trainer restored it; returns it."""
    for _ in range(3):  # the latest may be replaced as it is read: take the new one
        which, prefix = prefix, prefix or select.select_checkpoint(model_dir, select.LATEST)
        if prefix == trainer.restored and trainer.restored is not None:
            return prefix
        try:
            resume.restore(trainer.checkpoint, prefix, model_dir)
            return prefix
        except (tf.errors.OpError, IndexError, ValueError):
            if tf.io.gfile.exists(f"{prefix}.index"):
                raise
            if which is not None:
                raise UserError(f"{prefix} was deleted before evaluate could read it (the run "
                                f"writing {model_dir} keeps only its newest checkpoints); "
                                "evaluate --checkpoint=latest, or a checkpoint it keeps") from None
            prefix = None
    raise UserError(f"the latest checkpoint of {model_dir} was replaced three times while "
                    "evaluate read it; evaluate once the run has stopped")
