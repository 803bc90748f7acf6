"""The best checkpoint kept apart: `<model_dir>/best/ckpt-<step>` and `best_metric.json`.

    best/ckpt-<step>.*      the checkpoint with the best eval metric so far
    best/best_metric.json   {"metric", "mode", "value", "step", "checkpoint", "metrics"}

`best_metric.json` is written to a temporary sibling and renamed into place after its
checkpoint, so a crash or a full disk leaves the previous best (checkpoint and record) whole.
"""

import json
import math
import os

import tensorflow as tf
from absl import logging

from bert_trainer import outputs
from bert_trainer.checkpoints import storage
from bert_trainer.errors import UserError

BEST_DIR = "best"
BEST_METRIC_FILE = "best_metric.json"


class BestCheckpointKeeper:
    """Keeps the checkpoint with the best eval metric in `<model_dir>/best/`.

    Args:
        checkpoint: the run's checkpoint object.
        directory: where this worker writes (`model_dir/best` for the chief).
        metric: the eval metric name, e.g. "accuracy".
        mode: "max" or "min".
        previous_dir: where the best so far is read from on a restart (default: `directory`).
    """

    def __init__(self, checkpoint, directory: str, metric: str, mode: str = "max",
                 previous_dir: str | None = None):
        if mode not in ("max", "min"):
            raise UserError(f"best_metric_mode={mode!r} must be 'max' or 'min'")
        self.metric = metric
        self.mode = mode
        self.directory = directory
        self.best = self._read_previous(previous_dir or directory)
        self._manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=1,
                                                   checkpoint_name="ckpt")

    def _read_previous(self, directory: str) -> float | None:
        path = os.path.join(directory, BEST_METRIC_FILE)
        if not tf.io.gfile.exists(path):
            return None
        with tf.io.gfile.GFile(path) as f:
            try:
                record = json.load(f)
            except json.JSONDecodeError as e:
                raise UserError(f"{path} is not valid JSON ({e}); delete it to reset") from None
        if record.get("metric") != self.metric or record.get("mode") != self.mode:
            logging.warning("%s tracks %s (%s); now tracking %s (%s): the next eval replaces it",
                            path, record.get("metric"), record.get("mode"), self.metric, self.mode)
            return None
        return float(record["value"])

    def is_better(self, value: float) -> bool:
        """True when `value` beats the best so far (NaN never does)."""
        if math.isnan(value):
            return False
        if self.best is None:
            return True
        return value > self.best if self.mode == "max" else value < self.best

    def update(self, metrics: dict[str, float], step: int, resume_from: str | None = None
               ) -> bool:
        """Saves a checkpoint to `directory` when `metrics[metric]` improves.

        `best_metric.json` is written to a temporary file first and renamed into place after
        the checkpoint: a full disk leaves the previous best (checkpoint and record) as it was.

        Args:
            metrics: eval metrics of the current weights.
            step: the global step they were computed at.
            resume_from: the run's last good checkpoint, named when a write fails.

        Returns:
            True when a new best checkpoint was written.

        Raises:
            UserError: `metric` is not an eval metric, or the disk is full / the write refused.
        """
        if self.metric not in metrics:
            raise UserError(f"best_metric={self.metric!r} is not an eval metric; choose one "
                            f"of: {', '.join(sorted(metrics))}")
        value = float(metrics[self.metric])
        if not self.is_better(value):
            return False
        record = {"metric": self.metric, "mode": self.mode, "value": value, "step": int(step),
                  "checkpoint": f"ckpt-{step}",
                  "metrics": {k: float(v) for k, v in metrics.items()}}
        path = os.path.join(self.directory, BEST_METRIC_FILE)
        temp = outputs.temporary_sibling(path)
        with storage.guard(f"the best checkpoint's record {BEST_METRIC_FILE}", path,
                           hint=storage.resume_hint(resume_from), partial=(temp,)):
            tf.io.gfile.makedirs(self.directory)
            with tf.io.gfile.GFile(temp, "w") as f:
                f.write(json.dumps(record, indent=2, sort_keys=True) + "\n")
        try:
            saved = storage.save_checkpoint(self._manager, step, what="best checkpoint",
                                            resume_from=resume_from)
        except BaseException:
            tf.io.gfile.remove(temp)
            raise
        tf.io.gfile.rename(temp, path, overwrite=True)
        logging.info("New best %s=%.6g at step %d: %s", self.metric, value, step, saved)
        self.best = value
        return True
