"""Where bert-train keeps what it computes once per machine: the fused kernels, tokenizer tables.

The root is `$BERT_TRAIN_CACHE` if set, else `$XDG_CACHE_HOME/bert_train`, else
`~/.cache/bert_train`, with one directory per kind of entry (`kernels/`, `normalizer/`).

`read` and `write` keep small binary entries whose name already says everything they depend
on: the bytes are stored with their SHA-256 appended, and written aside then renamed, so a
reader gets a whole, unchanged entry or None (missing, cut short, altered). A cache that
cannot be written (a read-only home, a full disk) costs only the recomputation.
"""

import hashlib
import os
import pathlib
import tempfile

CACHE_ENV = "BERT_TRAIN_CACHE"
_DIGEST = hashlib.sha256().digest_size


def cache_dir(kind: str) -> pathlib.Path:
    """The directory of one kind of entry (not created)."""
    root = os.environ.get(CACHE_ENV)
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                ".cache")
        root = os.path.join(base, "bert_train")
    return pathlib.Path(root) / kind


def read(path: pathlib.Path) -> bytes | None:
    """The bytes `write` stored at `path`, or None if it is absent, unreadable or altered."""
    try:
        stored = path.read_bytes()
    except OSError:
        return None
    data, digest = stored[:-_DIGEST], stored[-_DIGEST:]
    if len(stored) <= _DIGEST or hashlib.sha256(data).digest() != digest:
        return None
    return data


def write(path: pathlib.Path, data: bytes) -> bool:
    """Stores `data` at `path` (aside, then renamed); False where the cache cannot be written."""
    staging = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, staging = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data + hashlib.sha256(data).digest())
        os.chmod(staging, 0o644)  # mkstemp's 0600 would hide it from other users of the cache
        os.replace(staging, path)
        return True
    except OSError:
        if staging is not None and os.path.exists(staging):
            os.unlink(staging)
        return False
