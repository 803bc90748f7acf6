"""Resuming a run: restoring the newest checkpoint that reads back whole, refusing a wrong one.

Layout of a `model_dir`:
    checkpoint              text proto naming the latest `ckpt-<step>` (TensorFlow's)
    ckpt-<step>.index/.data-*   the last `max_checkpoints` checkpoints (model, optimizer, step)
    best/                   the best checkpoint by an eval metric (`best.py`)

A checkpoint is never half-published. `tf.train.CheckpointManager.save` first writes the
tensor files (TensorFlow's V2 saver writes shards to a temporary prefix and merges them into
`ckpt-N.index` last), and only then, from a write callback, rewrites the `checkpoint` file with
`file_io.atomic_write_string_to_file` (write a temp file, rename). A crash mid-save therefore
leaves `checkpoint` naming the previous, complete checkpoint.

Integrity: a restart takes the newest checkpoint that passes `select.checkpoint_problem` (its
.index parses, its .data shards exist and are long enough) and that restores without a read
error (the restore checks every tensor's CRC); each one skipped is reported in one log line,
and so is the one used instead (`restore_latest`). Which checkpoint a reader (evaluate,
export, a warm start) takes is `select.select_checkpoint`.

Names: the root holds `model=model_trackable(model)`, which saves every model weight under a
stable name derived from its Keras path (`model/encoder/transformer_layer_0/...`, see
`layout.py`), so a change to the encoder's code that reorders its internal operations neither
breaks nor silently misassigns a restore. Checkpoints in the older object-graph layout cannot
be resumed (their run must finish with the bert-train that started it) but still warm-start a
new run (`--init_checkpoint`).
"""

import os

import keras
import tensorflow as tf
from absl import logging

from bert_trainer.checkpoints import layout, select
from bert_trainer.checkpoints.layout import model_trackable  # noqa: F401 (the trainer's root)
from bert_trainer.errors import UserError, first_line

# A time-budget run's elapsed seconds (`training.time_budget`): an evaluation's trainer, which
# has no budget, restores such a run; whether a training run may resume it is checked there.
TIME_BUDGET_KEY = "time_budget_elapsed/.ATTRIBUTES/VARIABLE_VALUE"
_IGNORED_KEYS = ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter/.ATTRIBUTES/VARIABLE_VALUE",
                 TIME_BUDGET_KEY)


def check_model_dir(model_dir: str) -> None:
    """Refuses a model_dir that cannot be written, before anything is built.

    Creates nothing: the first write does (`Trainer` writes nothing until its input is built),
    so a run refused for a bad input leaves no new directory behind.

    Raises:
        UserError: `model_dir` is a file, lies under a file, or is not writable.
    """
    if tf.io.gfile.exists(model_dir) and not tf.io.gfile.isdir(model_dir):
        raise UserError(f"--model_dir={model_dir} is a file; give a directory")
    if "://" in model_dir:
        return  # Remote file systems are checked by the first write.
    existing = os.path.abspath(model_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UserError(f"--model_dir={model_dir} cannot be created: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"--model_dir={model_dir}: {existing} is not writable; choose another "
                        "directory")


def restore_latest(checkpoint: tf.train.Checkpoint, model_dir: str) -> str | None:
    """Restores the newest checkpoint of `model_dir` that reads back whole.

    A checkpoint whose values fail to read (a CRC mismatch, a short read) is reported in one
    log line and the previous one is restored instead (it overwrites every variable).

    Args:
        checkpoint: the run's checkpoint object.
        model_dir: the run's directory.

    Returns:
        The restored checkpoint prefix, or None for a fresh `model_dir`.

    Raises:
        UserError: a checkpoint of another architecture, or no readable checkpoint at all.
    """
    problems = []
    for path in select.usable_checkpoints(model_dir):
        try:
            restore(checkpoint, path, model_dir)
        except (tf.errors.OpError, IndexError) as e:  # IndexError: TF's "Read less bytes"
            problems.append(path)
            logging.warning("Checkpoint %s failed to restore (%s); falling back to the previous "
                            "one", path, first_line(e))
            continue
        if problems:
            logging.warning("Restored %s instead of %s", path, problems[0])
        return path
    if problems:
        raise UserError(f"no checkpoint of {model_dir} reads back whole (the newest, "
                        f"{problems[0]}, does not); restore them or delete "
                        f"{os.path.join(model_dir, 'checkpoint')} to start the run afresh")
    return None


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
            # A stable name ("encoder/word_embeddings/embeddings") says more than the path.
            last = paths[obj][-1].name
            name = last if "/" in last else getattr(obj, "path", None) or obj.name
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
    layout.refuse_resume_across_layouts(checkpoint, path, model_dir)
    stored = {k: tuple(s) for k, s in tf.train.list_variables(path) if k not in _IGNORED_KEYS}
    expected = {k: v for k, v in expected_variables(checkpoint).items() if k not in _IGNORED_KEYS}
    fix = "use a new --model_dir, or the config that wrote it"
    # Name a model weight rather than a dropout seed state or an optimizer slot.
    model = getattr(checkpoint, "model", None)
    if isinstance(model, layout.NamedVariables):
        model = model.keras_model
    weights, others = set(), set()
    if isinstance(model, keras.Model):
        names = {id(v): n for n, v in layout.variable_names(model).items()}
        weights = {names.get(id(v), v.path) for v in model.trainable_variables}
        others = {names.get(id(v), v.path) for v in model.variables} - weights
    ordered = sorted(expected.items(), key=lambda item: (item[1][0] not in weights,
                                                         item[1][0] not in others))
    # A shape that differs says most about what changed (e.g. the hidden size): report it first.
    for key, (name, shape) in ordered:
        if key in stored and stored[key] != shape:
            raise UserError(f"model_dir {model_dir} holds a checkpoint of another architecture: "
                            f"{name} is {list(stored[key])} in {path} but {list(shape)} in "
                            f"this model; {fix}")
    for key, (name, shape) in ordered:
        if key not in stored:
            raise UserError(f"model_dir {model_dir} holds a checkpoint of another architecture: "
                            f"{path} has no value for {name} {list(shape)}; {fix}")
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
