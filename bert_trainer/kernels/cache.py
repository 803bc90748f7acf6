"""The kernel cache loads a library only for its digest, from a directory only the user can
write.

A library's file existing says nothing about its bytes: one cut short (a full disk, a copy
interrupted, `truncate`) kills the process that maps it with SIGBUS, and any file put under
the name this machine loads would run its code in every later command. So each build writes
a record beside its library (`bert_kernels_KEY.sha256`: the SHA-256 of the bytes it built and
the library's name, written aside then renamed), and a library is loaded only when its bytes
hash to its record. Anything else (no record, another digest, a truncated or replaced file)
is rebuilt, with one log line saying why (`build.py`).

The directory is created mode 0700, and one that is not the user's own, or that others may
write, is not loaded from. The record guards against damage and against files planted by
someone who cannot also write the record; a process running as the user can write both, which
is why nothing bert-train loads from elsewhere (a SavedModel, a checkpoint) may run code.
"""

import hashlib
import os
import pathlib
import stat
import tempfile

RECORD_SUFFIX = ".sha256"


class CacheError(RuntimeError):
    """The cache directory cannot be used (another user's, or writable by others)."""


def record_path(library: pathlib.Path) -> pathlib.Path:
    """Where the digest record of `library` lies."""
    return library.with_suffix(RECORD_SUFFIX)


def digest(path: pathlib.Path) -> str:
    """The SHA-256 of the file at `path`, in hex."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def write_record(built: pathlib.Path, library: pathlib.Path) -> None:
    """Records the digest of `built` (the bytes about to become `library`) beside `library`,
    written aside then renamed."""
    text = f"{digest(built)}  {library.name}\n"
    fd, staging = tempfile.mkstemp(prefix=f".{library.stem}.", suffix=".tmp",
                                   dir=library.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(staging, 0o400)
        os.replace(staging, record_path(library))
    finally:
        if os.path.exists(staging):
            os.unlink(staging)


def untrusted(library: pathlib.Path) -> str | None:
    """None when `library` holds the bytes its record names; else why not, in words for the
    log line ('has no digest record', ...)."""
    record = record_path(library)
    try:
        fields = record.read_text(encoding="utf-8").split()
    except FileNotFoundError:
        return f"has no digest record ({record.name})"
    except (OSError, UnicodeDecodeError) as e:
        return f"has an unreadable digest record ({e})"
    if len(fields) != 2 or fields[1] != library.name or len(fields[0]) != 64:
        return f"has a malformed digest record ({record.name})"
    try:
        actual = digest(library)
    except OSError as e:
        return f"cannot be read ({e})"
    if actual != fields[0]:
        size = library.stat().st_size
        return (f"does not match its digest record ({size} bytes hashing to {actual[:12]}..., "
                f"recorded {fields[0][:12]}...: cut short, replaced or damaged)")
    return None


def not_private(directory: pathlib.Path) -> str | None:
    """None when `directory` is this user's and no one else may write it; else why not."""
    try:
        info = directory.stat()
    except OSError as e:
        return f"cannot be examined ({e})"
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return f"belongs to user id {info.st_uid}, not to you ({os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def make_private(directory: pathlib.Path) -> None:
    """Creates `directory` mode 0700, or makes this user's existing one 0700.

    Raises:
      CacheError: it belongs to another user; OSError: it cannot be created.
    """
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    reason = not_private(directory)
    if reason and "belongs to" in reason:
        raise CacheError(f"the kernel cache {directory} {reason}")
    if stat.S_IMODE(directory.stat().st_mode) != 0o700:
        os.chmod(directory, 0o700)
