"""Checkpoints a user can trust: resume, architecture checks, and the best checkpoint kept apart.

Layout of a `model_dir`:
    checkpoint              text proto naming the latest `ckpt-<step>` (TensorFlow's)
    ckpt-<step>.index/.data-*   the last `max_checkpoints` checkpoints (model, optimizer, step)
    best/ckpt-<step>.*      the checkpoint with the best eval metric so far
    best/best_metric.json   {"metric", "mode", "value", "step", "checkpoint", "metrics"}

A checkpoint is never half-published. `tf.train.CheckpointManager.save` first writes the
tensor files (TensorFlow's V2 saver writes shards to a temporary prefix and merges them into
`ckpt-N.index` last), and only then, from a write callback, rewrites the `checkpoint` file with
`file_io.atomic_write_string_to_file` (write a temp file, rename). A crash mid-save therefore
leaves `checkpoint` naming the previous, complete checkpoint. `best_metric.json` is written the
same way (temp file, rename) after its checkpoint.
"""

import json
import math
import os

import keras
import tensorflow as tf
from absl import logging

from bert_trainer.errors import UserError

_IGNORED_KEYS = ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter/.ATTRIBUTES/VARIABLE_VALUE")
BEST_DIR = "best"
BEST_METRIC_FILE = "best_metric.json"


def resolve_checkpoint(path: str, what: str = "--init_checkpoint") -> str:
    """Turns a checkpoint prefix or a directory into a checkpoint prefix.

    Args:
        path: "dir/ckpt-1000" (a prefix with a `.index` file) or a directory holding a
            `checkpoint` file (its latest checkpoint is used).
        what: the flag or argument named in the error message.

    Returns:
        The checkpoint prefix.

    Raises:
        UserError: nothing readable at `path`.
    """
    if tf.io.gfile.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest is None:
            raise UserError(f"{what}={path} is a directory without a checkpoint; give a "
                            "directory written by bert-train or a prefix like dir/ckpt-1000")
        return latest
    if not tf.io.gfile.exists(path + ".index"):
        raise UserError(f"{what}={path}: no checkpoint there ({path}.index is missing); give a "
                        "prefix like dir/ckpt-1000 or its directory")
    return path


def latest_checkpoint(model_dir: str) -> str | None:
    """The latest checkpoint of `model_dir`, or None for a fresh directory.

    Raises:
        UserError: the `checkpoint` file names a checkpoint whose files are gone (starting
            afresh would silently overwrite the run).
    """
    latest = tf.train.latest_checkpoint(model_dir)
    state_file = os.path.join(model_dir, "checkpoint")
    if latest is None and tf.io.gfile.exists(state_file):
        raise UserError(f"{state_file} names a checkpoint whose files are missing; restore them "
                        "or delete that file to start the run afresh")
    return latest


def expected_variables(checkpoint: tf.train.Checkpoint) -> dict[str, tuple[str, tuple]]:
    """The checkpoint keys `checkpoint` would save its variables under.

    TensorFlow has no public API for this; `graph_view` is what `Checkpoint.save` itself uses
    to name variables, so the keys match `tf.train.list_variables` exactly.

    Returns:
        {key: (readable variable name, shape)}.
    """
    from tensorflow.python.checkpoint import graph_view  # noqa: PLC0415 (internal, see above)
    from tensorflow.python.trackable import trackable_utils  # noqa: PLC0415

    objects, paths = graph_view.ObjectGraphView(checkpoint).breadth_first_traversal()
    keys = {}
    for obj in objects:
        if isinstance(obj, keras.Variable | tf.Variable):
            key = "/".join(trackable_utils.escape_local_name(ref.name) for ref in paths[obj])
            name = getattr(obj, "path", None) or obj.name
            keys[key + "/.ATTRIBUTES/VARIABLE_VALUE"] = (name, tuple(obj.shape))
    return keys


def check_compatible(checkpoint: tf.train.Checkpoint, path: str, model_dir: str) -> None:
    """Raises a UserError when the checkpoint at `path` was written by another architecture.

    Compares every variable's shape with `tf.train.list_variables` before anything is restored,
    so a mismatch leaves the model and `model_dir` untouched.

    Args:
        checkpoint: the run's checkpoint object (model, optimizer, step).
        path: the checkpoint prefix to compare with.
        model_dir: named in the message.
    """
    stored = {k: tuple(s) for k, s in tf.train.list_variables(path) if k not in _IGNORED_KEYS}
    expected = {k: v for k, v in expected_variables(checkpoint).items() if k not in _IGNORED_KEYS}
    fix = "use a new --model_dir, or the config that wrote it"
    # Name a model weight rather than an optimizer slot when both mismatch.
    model = getattr(checkpoint, "model", None)
    model_paths = {v.path for v in model.variables} if isinstance(model, keras.Model) else set()
    ordered = sorted(expected.items(), key=lambda item: item[1][0] not in model_paths)
    for key, (name, shape) in ordered:
        if key not in stored:
            raise UserError(f"model_dir {model_dir} holds a checkpoint of another architecture: "
                            f"{path} has no value for {name} {list(shape)}; {fix}")
        if stored[key] != shape:
            raise UserError(f"model_dir {model_dir} holds a checkpoint of another architecture: "
                            f"{name} is {list(stored[key])} in {path} but {list(shape)} in "
                            f"this model; {fix}")
    extra = sorted(set(stored) - set(expected))
    if extra:
        raise UserError(f"model_dir {model_dir} holds a checkpoint of another architecture: "
                        f"{path} has {len(extra)} variable(s) this model lacks, e.g. {extra[0]} "
                        f"{list(stored[extra[0]])}; {fix}")


def restore(checkpoint: tf.train.Checkpoint, path: str, model_dir: str) -> None:
    """Checks `path` against `checkpoint` and restores every variable from it."""
    check_compatible(checkpoint, path, model_dir)
    checkpoint.restore(path).assert_existing_objects_matched()
    logging.info("Restored %s", path)


def write_text_atomically(path: str, text: str) -> None:
    """Writes `text` to a temporary file next to `path`, then renames it over `path`."""
    temp = f"{path}.tmp"
    with tf.io.gfile.GFile(temp, "w") as f:
        f.write(text)
    tf.io.gfile.rename(temp, path, overwrite=True)


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

    def update(self, metrics: dict[str, float], step: int) -> bool:
        """Saves a checkpoint to `directory` when `metrics[metric]` improves.

        Args:
            metrics: eval metrics of the current weights.
            step: the global step they were computed at.

        Returns:
            True when a new best checkpoint was written.
        """
        if self.metric not in metrics:
            raise UserError(f"best_metric={self.metric!r} is not an eval metric; choose one "
                            f"of: {', '.join(sorted(metrics))}")
        value = float(metrics[self.metric])
        if not self.is_better(value):
            return False
        path = self._manager.save(checkpoint_number=step)
        record = {"metric": self.metric, "mode": self.mode, "value": value, "step": int(step),
                  "checkpoint": os.path.basename(path),
                  "metrics": {k: float(v) for k, v in metrics.items()}}
        write_text_atomically(os.path.join(self.directory, BEST_METRIC_FILE),
                              json.dumps(record, indent=2, sort_keys=True) + "\n")
        logging.info("New best %s=%.6g at step %d: %s", self.metric, value, step, path)
        self.best = value
        return True
