"""Which checkpoint to read: latest, best, a step or a prefix, chosen by one function.

`select_checkpoint(model_dir, which, flag=...)` turns what a user named into one checkpoint
prefix; `evaluate`, `export`, `predict`, `generate`, a warm start (`--init_checkpoint`) and
the weights of a converted directory all go through it:

    "latest"     the newest usable checkpoint of model_dir
    "best"       the newest usable checkpoint of model_dir/best/ (kept by the best-metric
                 tracking, `best.py`)
    "1200"       the checkpoint of step 1200 (model_dir/ckpt-1200, else best/ckpt-1200)
    a path       a checkpoint prefix inside model_dir, or a directory there (its latest)
    None         "best" when model_dir/best/ holds a checkpoint, else "latest"

With `model_dir=None` (a warm start names a path alone) `which` is a path: a directory (its
latest) or a checkpoint prefix. Every refusal is one `UserError` naming `flag`, what it held
and the fix.

Newest first means the order of model_dir's `checkpoint` state file (TensorFlow's), or, in a
directory copied without that file, the ckpt-N files by step. A checkpoint is usable when it
passes `checkpoint_problem` (its .index parses, its .data shards exist and are long enough);
"latest" skips an unusable one with one log line and takes the one before it, the way a
resumed run does (`resume.restore_latest` walks `usable_checkpoints` itself, to also fall back
from a checkpoint whose values fail to read). A checkpoint named by step or prefix is refused
when unusable: the user asked for that one.
"""

import math
import os
import re
from collections.abc import Callable, Iterator

import tensorflow as tf
from absl import logging

from bert_trainer.checkpoints.best import BEST_DIR
from bert_trainer.errors import UserError, first_line

LATEST, BEST = "latest", "best"
WARM_START_HINT = "a prefix like dir/ckpt-1000 or its directory"
CHECKPOINT_NAME = "ckpt"
STATE_FILE = "checkpoint"
_OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"


def select_checkpoint(model_dir: str | None, which: str | None = LATEST, *,
                      flag: str = "--checkpoint") -> str:
    """The checkpoint prefix that `which` names (see the module docstring for the choices).

    Args:
      model_dir: the directory the checkpoint must come from, or None: `which` is a path
        (a directory or a prefix) and the checkpoint comes from its directory.
      which: "latest", "best", a step, a prefix or directory, or None ("best" if recorded,
        else "latest").
      flag: the flag that named `which`, in messages.

    Returns:
      A checkpoint prefix whose files pass `checkpoint_problem`.

    Raises:
      UserError: nothing there, a step or prefix that does not exist or is unusable, "best"
        when none was recorded, a prefix outside `model_dir`, or only unusable checkpoints.
    """
    if model_dir is None:
        if which is None:
            raise ValueError("select_checkpoint: a warm start names a path")
        directory = which if tf.io.gfile.isdir(which) else os.path.dirname(which) or "."
        return _path(directory, which, flag, WARM_START_HINT)
    if which is None:
        which = BEST if _candidates(os.path.join(model_dir, BEST_DIR)) else LATEST
    hint = f"latest, best, a step or a prefix like {model_dir}/ckpt-1000"
    if which == LATEST:
        return _newest(model_dir, f"{flag}={which}", flag, "train there first")
    if which == BEST:
        return _newest(os.path.join(model_dir, BEST_DIR), f"{flag}={which}", flag,
                       f"it is written when fine-tuning evaluates; use {flag}=latest")
    if which.isdigit():
        return _step(model_dir, int(which), flag)
    return _path(model_dir, which, flag, hint)


def usable_checkpoints(model_dir: str, *, none_usable: Callable[[str], str] | None = None
                       ) -> Iterator[str]:
    """Yields the checkpoints of `model_dir` that pass `checkpoint_problem`, newest first.

    Each one skipped is logged in one line, and so is the first one used after a skip.

    Args:
      model_dir: a directory of checkpoints.
      none_usable: the fix named when every checkpoint is unusable, given the newest one's
        prefix; default: a resumed run's (restore them, or start afresh).

    Raises:
      UserError: after the last one, when the directory holds checkpoints but none was
        usable; or a `checkpoint` state file that cannot be parsed.
    """
    candidates = _candidates(model_dir)
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
        state_file = os.path.join(model_dir, STATE_FILE)
        if not tf.io.gfile.exists(state_file):
            what = (f"{model_dir} holds {len(candidates)} checkpoint(s) and none is usable "
                    f"({problems[0]})")
        elif all(p.endswith(".index is missing") for p in problems):
            what = f"{state_file} names a checkpoint whose files are missing"
        else:
            what = (f"{state_file} lists {len(candidates)} checkpoint(s) and none is usable "
                    f"({problems[0]})")
        fix = (none_usable(candidates[0]) if none_usable else
               "restore them or delete that file to start the run afresh")
        raise UserError(f"{what}; {fix}")


def checkpoint_problem(path: str) -> str | None:
    """Why the checkpoint at `path` cannot be restored, or None when it looks whole.

    A cheap structural check (no tensor values are read): the `.index` file exists and parses,
    every `.data` shard it needs exists, the shards hold at least the bytes its numeric
    tensors need, and the object graph (what `tf.train.Checkpoint.restore` reads first) is
    readable. This catches a deleted or corrupted index and a missing or truncated data file.
    Flipped bytes inside a tensor are caught by the CRC check of the restore itself, which
    `resume.restore_latest` also falls back from.

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


def _candidates(directory: str) -> list[str]:
    """The checkpoints of `directory`, newest first: its state file's list, else ckpt-N by step.

    Raises:
      UserError: the state file exists but cannot be parsed.
    """
    state_file = os.path.join(directory, STATE_FILE)
    if tf.io.gfile.exists(state_file):
        state = tf.train.get_checkpoint_state(directory)
        if state is None or not state.model_checkpoint_path:
            raise UserError(f"{state_file} is not a readable checkpoint state file; restore it, "
                            "or delete it to start the run afresh")
        older = [p for p in state.all_model_checkpoint_paths if p != state.model_checkpoint_path]
        return [state.model_checkpoint_path, *reversed(older)]
    return [os.path.join(directory, f"{CHECKPOINT_NAME}-{step}")
            for step in sorted(_steps(directory), reverse=True)]


def _steps(directory: str) -> set[int]:
    """The N of every ckpt-N.index in `directory`."""
    pattern = os.path.join(directory, f"{CHECKPOINT_NAME}-*.index")
    return {int(m.group(1)) for f in tf.io.gfile.glob(pattern)
            if (m := re.search(r"-(\d+)\.index$", f))}


def _newest(directory: str, named: str, flag: str, fix: str) -> str:
    """The newest usable checkpoint of `directory`, which `named` (flag=value) pointed at.

    Args:
      fix: what to do when the directory holds no checkpoint at all.
    """
    prefix = next(usable_checkpoints(
        directory, none_usable=lambda newest: f"restore {newest} or pass another {flag}"), None)
    if prefix is None:
        where = named if named == f"{flag}={directory}" else f"{named}: {directory}"
        raise UserError(f"{where} holds no checkpoint (no '{CHECKPOINT_NAME}-N.index'); {fix}")
    return prefix


def _step(model_dir: str, step: int, flag: str) -> str:
    """model_dir/ckpt-<step>, else best/ckpt-<step>."""
    best_dir = os.path.join(model_dir, BEST_DIR)
    for directory in (model_dir, best_dir):
        prefix = os.path.join(directory, f"{CHECKPOINT_NAME}-{step}")
        if tf.io.gfile.exists(prefix + ".index"):
            problem = checkpoint_problem(prefix)
            if problem:
                raise UserError(f"{flag}={step}: {prefix} is unusable ({problem}); pass another "
                                "step, latest or best")
            return prefix
    kept = sorted(_steps(model_dir) | _steps(best_dir))
    if not kept:
        raise UserError(f"{flag}={step}: {model_dir} holds no checkpoint (no "
                        f"'{CHECKPOINT_NAME}-N.index'); train there first")
    raise UserError(f"{flag}={step}: {model_dir} has no checkpoint of step {step} (it holds "
                    f"steps {', '.join(map(str, kept))}); pass one of those, latest or best")


def _path(model_dir: str, which: str, flag: str, hint: str) -> str:
    """A prefix, or a directory's newest checkpoint, that lies inside `model_dir`."""
    if not _inside(which, model_dir):
        raise UserError(f"{flag}={which} lies outside {model_dir}; pass a checkpoint of that "
                        "directory (latest, best, a step, or a prefix in it)")
    if tf.io.gfile.isdir(which):
        return _newest(which, f"{flag}={which}", flag, f"give {hint}")
    if not tf.io.gfile.exists(which + ".index"):
        raise UserError(f"{flag}={which}: no checkpoint there ({which}.index is missing); give "
                        f"{hint}")
    problem = checkpoint_problem(which)
    if problem:
        raise UserError(f"{flag}={which} is unusable: {problem}; give another checkpoint")
    return which


def _inside(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or lies under it (remote paths compared as text)."""
    if "://" in path or "://" in directory:
        path, directory = path.rstrip("/"), directory.rstrip("/")
        return path == directory or path.startswith(directory + "/")
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return os.path.commonpath([path, directory]) == directory
