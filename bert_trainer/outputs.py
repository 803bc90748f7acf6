"""A command's output: written aside, renamed into place whole, replaced only when it is ours.

Every command that writes (export, convert, vocab, predict, create_pretraining_data) follows
three rules, implemented here once:

1. Complete or absent. The output is written to a hidden temporary sibling in the same
   directory (`.NAME.tmp-PID`) and renamed into place only when it is complete. A refusal, a
   fault or Ctrl-C removes the temporary and leaves an existing output as it was. A directory
   or file set replaces the old one by renaming the old one aside, the new one in, and only
   then deleting the old one; an interrupt between the renames puts the old one back.
2. Only what the command made. `--overwrite` replaces an output of the command's own kind
   (`Kind`): a directory whose marker file (`MARKER`) names the command and lists every entry
   in it, or a file the kind recognizes by content (a vocabulary, a predictions file). Anything
   else is refused with one line naming what was found. No command writes inside a bert-train
   model directory (`enclosing_model_dir`): that belongs to the run that made it.
3. Storage faults are one line. A full disk or a refused write while writing becomes a
   `UserError` from `errors.storage_fault` naming the path, what was being written and the
   space needed when known; the temporaries are removed first.
"""

import contextlib
import dataclasses
import glob
import json
import os
import shutil
from collections.abc import Callable, Iterator

from bert_trainer.errors import UserError, storage_fault

MARKER = ".bert-train-output.json"  # in a directory output: the command and its entries
# What makes a directory a bert-train model directory (a run's, a conversion's, or the parent
# of a multi-seed fine-tune's seed-N runs).
MODEL_DIR_FILES = ("bert_train.json", "checkpoint", "multi_seed.json")
MODEL_DIR_PATTERNS = ("ckpt-*.index",)
_SHOWN = 6  # entries named in a refusal


@dataclasses.dataclass(frozen=True)
class Kind:
    """A kind of output one command makes, and how that command recognizes one it made.

    Attributes:
      command: the command's name, e.g. "export" (stored in a directory's marker).
      description: what it is, for messages: "a SavedModel written by bert-train export".
      directory: whether the output is a directory (else a file).
      recognizes: for a file: whether the existing file is of this kind (read by content);
        for a directory: whether its entries (names) are one this command made before it wrote
        a marker (None: only a marker counts).
    """

    command: str
    description: str
    directory: bool
    recognizes: Callable[[str], bool] | None = None


def check_apart(output: str, source: str, source_flag: str) -> None:
    """Refuses an `--output` that is, contains or lies inside a directory the command reads.

    Args:
      output: the --output path.
      source: the directory read (a model directory, a checkpoint to convert).
      source_flag: its flag, named in the message, e.g. "--model_dir".

    Raises:
      UserError: naming both paths; writing there could replace or mix into what is read.
    """
    target, origin = os.path.realpath(output), os.path.realpath(source)
    if target == origin:
        raise UserError(f"--output={output} is the {source_flag} directory; write to a new "
                        "directory")
    if origin.startswith(target + os.sep):
        raise UserError(f"--output={output} contains {source_flag}={source}; write to a new "
                        "directory")
    if target.startswith(origin + os.sep):
        raise UserError(f"--output={output} is inside {source_flag}={source}, which belongs "
                        "to what made it; write to a directory outside it")


def temporary_sibling(path: str, tag: str = "tmp") -> str:
    """`DIR/.NAME.tag-PID`: hidden, on the same file system, unique to this process.

    Model directories use it too (their files are written aside the same way), remote ones
    (gs://...) included.
    """
    if "://" in path:
        directory, _, name = path.rstrip("/").rpartition("/")
        return f"{directory}/.{name}.{tag}-{os.getpid()}"
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.{tag}-{os.getpid()}")


def enclosing_model_dir(path: str) -> str | None:
    """The bert-train model directory that `path` is inside (its parent or above), or None."""
    directory = os.path.dirname(os.path.abspath(path))
    while True:
        if is_model_dir(directory):
            return directory
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def is_model_dir(directory: str) -> bool:
    """Whether `directory` holds a bert-train model (bert_train.json or checkpoints)."""
    if not os.path.isdir(directory):
        return False
    return (any(os.path.exists(os.path.join(directory, n)) for n in MODEL_DIR_FILES)
            or any(glob.glob(os.path.join(glob.escape(directory), p))
                   for p in MODEL_DIR_PATTERNS))


def check_output(path: str, kind: Kind, *, overwrite: bool, flag: str = "--output") -> str:
    """Refuses, before anything is written, an output path that may not be (re)placed.

    Args:
      path: where the command will write.
      kind: what the command writes there.
      overwrite: whether `--overwrite` was given.
      flag: the flag named in messages.

    Returns:
      The absolute path.

    Raises:
      UserError: `path` is inside a model directory, is a file where a directory goes (or
        the reverse), exists without `overwrite`, holds something the command did not make,
        or its directory cannot be written.
    """
    path = os.path.abspath(os.path.expanduser(path))
    owner = enclosing_model_dir(path)
    if owner is not None:
        raise UserError(f"{flag}={path} is inside the model directory {owner}, which belongs "
                        f"to the run that made it; write the {kind.command} output elsewhere")
    if os.path.exists(path):
        if kind.directory and not os.path.isdir(path):
            raise UserError(f"{flag}={path} is a file; give a directory path")
        if not kind.directory and os.path.isdir(path):
            raise UserError(f"{flag}={path} is a directory; give a file path")
        if not kind.directory or os.listdir(path):
            _check_replaceable(path, kind, overwrite, flag)
    check_writable(path, flag)
    return path


def _check_replaceable(path: str, kind: Kind, overwrite: bool, flag: str) -> None:
    if not overwrite:
        what = ("exists and is not empty; choose a new directory" if kind.directory
                else "exists; choose another path")
        raise UserError(f"{flag}={path} {what} or pass --overwrite")
    if not kind.directory:
        if kind.recognizes is None or not kind.recognizes(path):
            raise UserError(f"{flag}={path} is not {kind.description}, so --overwrite does "
                            "not replace it; choose another path")
        return
    entries = sorted(os.listdir(path))
    listed = _marker_entries(path, kind.command)
    if listed is not None:
        extra = [e for e in entries if e != MARKER and e not in listed]
        if extra:
            raise UserError(f"{flag}={path} holds {_names(path, extra)} besides what bert-train "
                            f"{kind.command} wrote there; move them or choose another {flag}")
        return
    if kind.recognizes is not None and kind.recognizes(path):
        return
    raise UserError(f"{flag}={path} holds {_names(path, entries)} (not {kind.description}), "
                    f"so --overwrite does not replace it; choose another {flag}")


def _names(directory: str, entries: list[str]) -> str:
    shown = [e + "/" * os.path.isdir(os.path.join(directory, e)) for e in entries[:_SHOWN]]
    more = f" and {len(entries) - _SHOWN} more" if len(entries) > _SHOWN else ""
    return ", ".join(shown) + more


def _marker_entries(directory: str, command: str) -> set[str] | None:
    """The entries the marker of `directory` lists, when it names `command`; else None."""
    try:
        with open(os.path.join(directory, MARKER), encoding="utf-8") as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("command") != command:
        return None
    entries = marker.get("entries")
    return set(entries) if isinstance(entries, list) else None


def check_writable(path: str, flag: str) -> None:
    """UserError unless the nearest existing directory above `path` can be written."""
    existing = os.path.dirname(path)
    while existing and not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if existing and not os.path.isdir(existing):
        raise UserError(f"{flag}={path}: {existing} is a file; give a path under a directory")
    if existing and not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{flag}={path}: {existing} is not writable; make it writable or "
                        "choose another path")


@contextlib.contextmanager
def storage_faults(writing: str, path: str, needed_bytes: int | None = None) -> Iterator[None]:
    """Turns a full disk or a refused write inside the block into a one-line UserError."""
    try:
        yield
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 (only storage faults are translated; others re-raise)
        fault = storage_fault(e, writing=writing, path=path, needed_bytes=needed_bytes)
        if fault is None:
            raise
        raise fault from None


@contextlib.contextmanager
def _created_parents(path: str) -> Iterator[None]:
    """Creates the missing parents of `path`; removes them again (if empty) on failure."""
    missing, directory = [], os.path.dirname(os.path.abspath(path))
    while not os.path.exists(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    try:
        for directory in reversed(missing):
            os.mkdir(directory)
        yield
    except BaseException:
        for directory in missing:
            with contextlib.suppress(OSError):
                os.rmdir(directory)
        raise


def remove(path: str) -> None:
    """Removes a file or a directory tree if it exists (cleanup: errors are ignored)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.remove(path)


@contextlib.contextmanager
def new_file(path: str, *, writing: str, needed_bytes: int | None = None,
             binary: bool = False) -> Iterator:
    """Yields a file open on a temporary sibling of `path`; renamed over `path` on success.

    Args:
      path: the output file.
      writing: what it is, for a storage fault's message ("vocabulary", "predictions").
      needed_bytes: its size when known (named when the disk is full).
      binary: open in "wb" (else "w", UTF-8).

    Yields:
      The open file. Whatever leaves the block with an exception (a UserError, a fault,
      KeyboardInterrupt) removes the temporary and leaves `path` as it was.
    """
    temp = temporary_sibling(path)
    text = {} if binary else {"encoding": "utf-8"}
    with storage_faults(writing, path, needed_bytes), _created_parents(path):
        try:
            with open(temp, "wb" if binary else "w", **text) as f:
                yield f
                f.flush()
                os.fsync(f.fileno())  # complete on disk before it takes the output's name
            os.replace(temp, path)
        finally:
            remove(temp)


@contextlib.contextmanager
def staging_directory(path: str, *, writing: str,
                      needed_bytes: int | None = None) -> Iterator[str]:
    """Yields an empty hidden directory beside `path` to write an output into; removed after.

    The caller moves what it wrote into place inside the block (`replace_files`); whatever is
    left in the directory when the block ends, normally or not, is deleted. Storage faults in
    the block become one-line UserErrors (see `storage_faults`); parents of `path` created here
    are removed again on failure.
    """
    staging = temporary_sibling(path)
    with storage_faults(writing, path, needed_bytes), _created_parents(path):
        os.mkdir(staging)
        try:
            yield staging
        finally:
            remove(staging)


@contextlib.contextmanager
def new_directory(path: str, kind: Kind, *, writing: str,
                  needed_bytes: int | None = None) -> Iterator[str]:
    """Yields an empty temporary sibling directory of `path`; it replaces `path` on success.

    The marker (`MARKER`, naming `kind.command` and the entries) is written into it before the
    swap, so a later `--overwrite` recognizes the output as this command's.

    Args:
      path: the output directory (absolute; checked by `check_output`).
      kind: what is written.
      writing: what it is, for a storage fault's message ("SavedModel").
      needed_bytes: its size when known.

    Yields:
      The temporary directory to write into.
    """
    with staging_directory(path, writing=writing, needed_bytes=needed_bytes) as staging:
        yield staging
        entries = sorted(os.listdir(staging))
        with open(os.path.join(staging, MARKER), "w", encoding="utf-8") as f:
            json.dump({"command": kind.command, "kind": kind.description, "entries": entries},
                      f, indent=1)
        replace_files([(staging, path)], [path] if os.path.lexists(path) else [])


def replace_files(new: list[tuple[str, str]], old: list[str]) -> None:
    """Puts a new set of files (or directories) in place of an old set, as one step.

    The old entries are renamed aside, the new ones renamed in (in the order given: put the
    one that marks the set complete, e.g. a summary, last), and only then are the old ones
    deleted. An exception or interrupt before the last new entry is in place moves the new
    ones back out and the old ones back in, so a reader finds the old set or the new one.

    Args:
      new: (temporary path, final path) pairs, on the final paths' file system.
      old: existing paths to replace (they may share names with the new ones or not).
    """
    aside = [(p, temporary_sibling(p, "old")) for p in old]
    placed = []
    try:
        for path, hidden in aside:
            os.rename(path, hidden)
        for temp, final in new:
            os.rename(temp, final)
            placed.append((temp, final))
    except BaseException:
        for temp, final in reversed(placed):
            with contextlib.suppress(OSError):
                os.rename(final, temp)
        for path, hidden in aside:
            if os.path.lexists(hidden) and not os.path.lexists(path):
                with contextlib.suppress(OSError):
                    os.rename(hidden, path)
        raise
    for _, hidden in aside:
        remove(hidden)
