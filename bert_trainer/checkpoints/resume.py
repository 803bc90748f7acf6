"""Resuming a run: which checkpoint of a model_dir to restore, and refusing a wrong one.

Layout of a `model_dir`:
    checkpoint              text proto naming the latest `ckpt-<step>` (TensorFlow's)
    ckpt-<step>.index/.data-*   the last `max_checkpoints` checkpoints (model, optimizer, step)
    best/                   the best checkpoint by an eval metric (`best.py`)

A checkpoint is never half-published. `tf.train.CheckpointManager.save` first writes the
tensor files (TensorFlow's V2 saver writes shards to a temporary prefix and merges them into
`ckpt-N.index` last), and only then, from a write callback, rewrites the `checkpoint` file with
`file_io.atomic_write_string_to_file` (write a temp file, rename). A crash mid-save therefore
leaves `checkpoint` naming the previous, complete checkpoint.

Integrity: a restart takes the newest checkpoint the `checkpoint` file lists that passes
`checkpoint_problem` (its .index parses, its .data shards exist and are long enough) and that
restores without a read error (the restore checks every tensor's CRC); each one skipped is
reported in one log line, and so is the one used instead (`restore_latest`).

Names: the root holds `model=model_trackable(model)`, which saves every model weight under a
stable name derived from its Keras path (`model/encoder/transformer_layer_0/...`, see
`layout.py`), so a change to the encoder's code that reorders its internal operations neither
breaks nor silently misassigns a restore. Checkpoints in the older object-graph layout cannot
be resumed (their run must finish with the bert-train that started it) but still warm-start a
new run (`--init_checkpoint`).
"""

import math
import os

import keras
import tensorflow as tf
from absl import logging

from bert_trainer.checkpoints import layout
from bert_trainer.checkpoints.layout import model_trackable  # noqa: F401 (the trainer's root)
from bert_trainer.errors import UserError, first_line

_OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"
_IGNORED_KEYS = (_OBJECT_GRAPH, "save_counter/.ATTRIBUTES/VARIABLE_VALUE")


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


def checkpoint_prefix(path: str, what: str = "--init_checkpoint") -> str:
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


def checkpoint_problem(path: str) -> str | None:
    """Why the checkpoint at `path` cannot be restored, or None when it looks whole.

    A cheap structural check (no tensor values are read): the `.index` file exists and parses,
    every `.data` shard it needs exists, the shards hold at least the bytes its numeric
    tensors need, and the object graph (what `tf.train.Checkpoint.restore` reads first) is
    readable. This catches a deleted or corrupted index and a missing or truncated data file.
    Flipped bytes inside a tensor are caught by the CRC check of the restore itself, which
    `restore_latest` also falls back from.

    Args:
        path: a checkpoint prefix, e.g. "model_dir/ckpt-1000".

    Returns:
        A short reason ("ckpt-20.index is missing", ...) or None.
    """
    name = os.path.basename(path)
    if not tf.io.gfile.exists(path + ".index"):
        return f"{name}.index is missing"
    try:
        reader = tf.train.load_checkpoint(path)
        dtypes = reader.get_variable_to_dtype_map()
        shapes = reader.get_variable_to_shape_map()
    except (tf.errors.OpError, ValueError, RuntimeError) as e:
        return f"{name}.index is unreadable ({first_line(e)})"
    shards = tf.io.gfile.glob(f"{path}.data-*-of-*")
    if not shards:
        return f"{name} has no .data file"
    wanted = int(shards[0].rsplit("-of-", 1)[1])
    if len(shards) != wanted:
        return f"{name} has {len(shards)} of its {wanted} .data shards"
    stored = sum(tf.io.gfile.stat(shard).length for shard in shards)
    needed = sum(math.prod(shapes[k]) * dtype.size for k, dtype in dtypes.items()
                 if dtype != tf.string)
    if stored < needed:
        return f"{name}.data holds {stored} bytes but its tensors need {needed} (truncated)"
    try:
        if _OBJECT_GRAPH in dtypes:
            reader.get_tensor(_OBJECT_GRAPH)
    except (tf.errors.OpError, ValueError, RuntimeError, IndexError) as e:
        return f"{name}.data is unreadable ({first_line(e)})"
    return None


def checkpoint_candidates(model_dir: str) -> list[str]:
    """The checkpoints the `checkpoint` state file of `model_dir` lists, newest first.

    Raises:
        UserError: the state file exists but cannot be parsed.
    """
    state_file = os.path.join(model_dir, "checkpoint")
    if not tf.io.gfile.exists(state_file):
        return []
    state = tf.train.get_checkpoint_state(model_dir)
    if state is None or not state.model_checkpoint_path:
        raise UserError(f"{state_file} is not a readable checkpoint state file; restore it, or "
                        "delete it to start the run afresh")
    older = [p for p in state.all_model_checkpoint_paths if p != state.model_checkpoint_path]
    return [state.model_checkpoint_path, *reversed(older)]


def latest_checkpoint(model_dir: str) -> str | None:
    """The newest usable checkpoint of `model_dir`, or None for a fresh directory.

    Checkpoints that fail `checkpoint_problem` are skipped with one log line each, and the one
    chosen instead is logged.

    Raises:
        UserError: the `checkpoint` file lists checkpoints but none is usable (starting afresh
            would silently overwrite the run).
    """
    return next(iter(usable_checkpoints(model_dir)), None)


def usable_checkpoints(model_dir: str):
    """Yields the checkpoints of `model_dir` that pass `checkpoint_problem`, newest first.

    Raises:
        UserError: after the last one, when the `checkpoint` file lists checkpoints but none
            was usable.
    """
    candidates = checkpoint_candidates(model_dir)
    problems = []
    for path in candidates:
        problem = checkpoint_problem(path)
        if problem is None:
            if problems:
                logging.warning("Using checkpoint %s instead (the newest usable one)", path)
            yield path
            continue
        logging.warning("Checkpoint %s is unusable: %s; falling back to the previous one",
                        path, problem)
        problems.append(problem)
    if candidates and len(problems) == len(candidates):
        state_file = os.path.join(model_dir, "checkpoint")
        missing = all(p.endswith(".index is missing") for p in problems)
        what = ("names a checkpoint whose files are missing" if missing else
                f"lists {len(candidates)} checkpoint(s) and none is usable ({problems[0]})")
        raise UserError(f"{state_file} {what}; restore them or delete that file to start the "
                        "run afresh")


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
    for path in usable_checkpoints(model_dir):
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
