"""Writes of a run that fail cleanly: a full disk or a refused write leaves no partial files.

TensorFlow's checkpoint saver writes the tensors of `ckpt-N` to `ckpt-N_temp/`, then merges
them into `ckpt-N.index` / `ckpt-N.data-*`, and only then rewrites the `checkpoint` state file.
A save that fails on a full disk (ENOSPC) or a refused write (EACCES, EROFS) therefore leaves
the previous checkpoint published, but also a `ckpt-N_temp/` directory or partial `ckpt-N.*`
files that keep the disk full. `save_checkpoint` removes those and raises one `UserError`
(`errors.storage_fault`) that names the path, what was written and the last good checkpoint;
`guard` does the same for the run's other files (model info, operative config, summaries).
"""

import contextlib
import glob
import os
import shutil

import tensorflow as tf

from bert_trainer import outputs
from bert_trainer.errors import UserError, storage_fault

# What a write of a file can raise: Python's OSError, or TensorFlow's file system errors
# (ResourceExhaustedError for ENOSPC, PermissionDeniedError, ...).
WRITE_ERRORS = (OSError, tf.errors.OpError)


def resume_hint(latest: str | None) -> str:
    """The hint of a failed write: which checkpoint a rerun resumes from."""
    if latest:
        return (f"the last good checkpoint {os.path.basename(latest)} is intact; run the same "
                "command again to resume from it")
    return "no checkpoint was written yet; run the same command again to start afresh"


def save_checkpoint(manager: tf.train.CheckpointManager, step: int, *,
                    what: str = "checkpoint", name: str = "ckpt",
                    resume_from: str | None = None) -> str:
    """`manager.save(checkpoint_number=step)` that cleans up after a storage fault.

    Args:
        manager: the run's (or the best checkpoint's) manager.
        step: the checkpoint number.
        what: named in the error, e.g. "checkpoint" or "best checkpoint".
        name: the manager's `checkpoint_name`.
        resume_from: the checkpoint a rerun resumes from, named in the error (default: the
            manager's latest).

    Returns:
        The saved checkpoint's prefix.

    Raises:
        UserError: the disk is full or the write was refused; the partial files of this save
            are removed and the `checkpoint` state file still names the previous checkpoint.
    """
    directory = manager.directory
    prefix = os.path.join(directory, f"{name}-{step}")
    before = set(glob.glob(glob.escape(prefix) + "*"))
    latest = manager.latest_checkpoint
    resume_from = resume_from or latest
    try:
        return manager.save(checkpoint_number=step)
    except WRITE_ERRORS as e:
        remove_partial_checkpoint(prefix, keep=before)
        fault = storage_fault(e, writing=f"{what} {os.path.basename(prefix)}", path=directory,
                              needed_bytes=checkpoint_bytes(latest), hint=resume_hint(resume_from))
        if fault is None:
            raise
        raise fault from None


def remove_partial_checkpoint(prefix: str, keep=()) -> list[str]:
    """Deletes what an unfinished save of `prefix` left: `prefix_temp*` and new `prefix.*` files.

    Args:
        prefix: the checkpoint prefix being written, e.g. "model_dir/ckpt-12".
        keep: paths that existed before the save (a checkpoint at the same number is kept).

    Returns:
        The paths removed.
    """
    removed = []
    for path in glob.glob(glob.escape(prefix) + "*"):
        name = os.path.basename(path)[len(os.path.basename(prefix)):]
        if path in keep or not (name.startswith("_temp") or name.startswith(".")):
            continue
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(path)
        removed.append(path)
    return removed


def checkpoint_bytes(prefix: str | None) -> int | None:
    """The size of the checkpoint at `prefix` (index and data), the size the next one needs."""
    if not prefix:
        return None
    paths = glob.glob(glob.escape(prefix) + ".index") + glob.glob(glob.escape(prefix) + ".data-*")
    return sum(os.path.getsize(p) for p in paths) or None


@contextlib.contextmanager
def guard(writing: str, path: str, *, hint: str = "", partial: tuple[str, ...] = ()):
    """Turns a storage fault raised inside into one UserError, after removing `partial` files.

    Args:
        writing: what is written, e.g. "the operative config".
        path: where (a file or a directory).
        hint: appended to the message (see `resume_hint`).
        partial: files the block may leave half-written (removed on any storage fault).

    Raises:
        UserError: for a full disk or a refused write; other errors pass unchanged.
    """
    try:
        yield
    except UserError:
        raise
    except WRITE_ERRORS as e:
        fault = storage_fault(e, writing=writing, path=path, hint=hint)
        if fault is None:
            raise
        for name in partial:
            with contextlib.suppress(OSError):
                os.remove(name)
        raise fault from None


def write_text_atomically(path: str, text: str) -> None:
    """Writes `text` to a temporary sibling of `path`, then renames it over `path`.

    A failed write (a full disk) removes the temporary file and leaves `path` as it was.
    """
    temp = outputs.temporary_sibling(path)
    try:
        with tf.io.gfile.GFile(temp, "w") as f:
            f.write(text)
        tf.io.gfile.rename(temp, path, overwrite=True)
    except BaseException:
        with contextlib.suppress(*WRITE_ERRORS):
            tf.io.gfile.remove(temp)
        raise
