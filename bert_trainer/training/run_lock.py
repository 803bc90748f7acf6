"""A model_dir belongs to one run: a lock file that names the run holding it.

`model_dir/.bert_train.lock` holds {"host", "pid", "command", "started"} (JSON). The lock
itself is an exclusive `flock` on that file, held by an open descriptor for the run's whole
life, so the kernel releases it when the process ends however it ends (SIGKILL, OOM kill,
power loss of a local disk). A lock file left behind by a dead run therefore is not locked:
the next run takes it over and says whose it was. A file locked by a live process makes the
second run refuse in one line, naming the holder.

The file can be deleted or replaced while the run holds it (`rm`, an editor, a sync tool),
which would let a second run lock a new file at the same path. So the run also holds an
exclusive `flock` on the model_dir itself (its directory descriptor: nothing can unlink that
while the run works in it), and the trainer checks at each checkpoint (`verify`) that the file
at the path is still the one it locked; if not, it stops there with one line, the checkpoint
written.

A holder on another host whose file system does not carry `flock` between machines cannot
be checked from here: a lock file naming another host is refused even when unlocked; the
message names the file to delete once that run is known to have ended.

Remote model directories (gs://...) are not locked (there is no atomic create-exclusive
there); the run logs that once.

Multi-worker runs: only the chief writes `model_dir`, so only the chief takes the lock; the
other workers write their private `.worker_*` directories inside it (see `strategies`).
"""

import contextlib
import datetime
import errno
import fcntl
import json
import os
import socket
import time

from absl import logging

from bert_trainer.checkpoints import leftovers
from bert_trainer.errors import UserError

LOCK_FILE = ".bert_train.lock"

# The locks this process holds: {real path of the model_dir: RunLock}.
_held: dict[str, "RunLock"] = {}


class RunLock:
    """An acquired lock on one model_dir; `release()` (or the context manager) gives it back.

    Attributes:
        model_dir: the locked directory.
        path: the lock file.
        created_dir: the topmost directory acquiring created (`model_dir` or a parent), or
            None; release removes the directories it created again when the run left nothing
            in them.
    """

    def __init__(self, model_dir: str, path: str, fds: tuple[int, int | None],
                 created_dir: str | None):
        self.model_dir = model_dir
        self.path = path
        self.created_dir = created_dir
        self._fd: int | None = fds[0]
        self._dir_fd = fds[1]

    def problem(self) -> str | None:
        """None while the file at `path` is the one this run locked, else what happened."""
        if self._fd is None:
            return None
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return "was deleted"
        return None if os.path.samestat(os.fstat(self._fd), now) else "was replaced"

    def release(self) -> None:
        """Removes the lock file (if it is still ours) and unlocks; idempotent."""
        if self._fd is None:
            return
        _held.pop(_key(self.model_dir), None)
        # Unlink before unlocking: a run waiting on this inode sees it was replaced and retries.
        if self.problem() is None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        os.close(self._fd)
        if self._dir_fd is not None:
            os.close(self._dir_fd)
        self._fd = self._dir_fd = None
        _remove_created(self.model_dir, self.created_dir)

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def holds(model_dir: str) -> bool:
    """Whether this process holds the lock of `model_dir`."""
    return _key(model_dir) in _held


def verify(model_dir: str, checkpoint: str) -> None:
    """Stops a run whose lock file was deleted or replaced (called after each checkpoint).

    Args:
        model_dir: the run's directory; nothing is checked unless this process holds it.
        checkpoint: the checkpoint just written, named in the message.

    Raises:
        UserError: the lock file at the path is not the one this run locked.
    """
    lock = _held.get(_key(model_dir))
    problem = lock.problem() if lock is not None else None
    if problem:
        raise UserError(f"the run lock {lock.path} {problem} while this run held it (another "
                        f"run may use --model_dir={model_dir}); stopped after writing "
                        f"{checkpoint}: make sure no other run uses the directory, then run the "
                        "same command again to resume")


def acquire(model_dir: str, command: str) -> RunLock | None:
    """Locks `model_dir` for this run, creating the directory when needed.

    Args:
        model_dir: the run's directory (created if missing; `RunLock.release` removes it again
            when the run wrote nothing into it).
        command: what holds it, named to a second run, e.g. "bert-train finetune".

    Returns:
        The lock, or None for a remote directory (not lockable; see the module docstring).

    Raises:
        UserError: another live run holds `model_dir` (the message names it: command, pid,
            host, start time), this process already holds it, or the lock file cannot be
            created (e.g. a read-only directory).
    """
    if "://" in model_dir:
        logging.info("%s is remote: it is not locked against a second run", model_dir)
        return None
    if holds(model_dir):
        raise UserError(f"--model_dir={model_dir} is already in use by this process; choose "
                        "another --model_dir")
    created = None
    missing = os.path.abspath(model_dir)
    while not os.path.exists(missing):
        created, missing = missing, os.path.dirname(missing)
    try:
        os.makedirs(model_dir, exist_ok=True)
    except OSError as e:
        _remove_created(model_dir, created)
        raise UserError(f"--model_dir={model_dir} cannot be created ({e.strerror}); choose "
                        "another --model_dir") from None
    path = os.path.join(model_dir, LOCK_FILE)
    dir_fd = None
    try:
        dir_fd = _lock_dir(model_dir, path)
        fd = _lock_file(model_dir, path, command)
    except BaseException:
        if dir_fd is not None:
            os.close(dir_fd)
        _remove_created(model_dir, created)
        raise
    lock = RunLock(model_dir, path, (fd, dir_fd), created)
    _held[_key(model_dir)] = lock
    leftovers.remove_stale(model_dir)  # ours now: what a killed run left can go
    return lock


@contextlib.contextmanager
def hold(model_dir: str, command: str, *, enabled: bool = True):
    """Holds the lock of `model_dir` for a block, unless this process holds it already.

    Args:
        model_dir: the run's directory.
        command: what holds it (see `acquire`).
        enabled: False for a worker that does not write `model_dir` (a non-chief worker).
    """
    if not enabled or holds(model_dir):
        yield
        return
    lock = acquire(model_dir, command)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def _lock_dir(model_dir: str, path: str) -> int | None:
    """Locks the directory itself (survives the lock file being deleted); its descriptor, or
    None where directories cannot be locked (the file lock alone then holds, as before)."""
    fd = os.open(model_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise UserError(_in_use(model_dir, _read_holder(path))) from None
        logging.info("%s: the directory cannot be locked (%s); the lock file alone holds it",
                     model_dir, e.strerror)
        return None
    return fd


def _lock_file(model_dir: str, path: str, command: str) -> int:
    """Opens, locks and fills in the lock file; returns its descriptor."""
    while True:
        try:
            # Read-only: the lock is on the descriptor, and no file stays open for writing.
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise UserError(f"--model_dir={model_dir}: cannot create the lock file {path} "
                            f"({e.strerror}); make the directory writable or choose another "
                            "--model_dir") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise UserError(f"--model_dir={model_dir}: cannot lock {path} ({e.strerror}); "
                                "choose a --model_dir on a local file system") from None
            raise UserError(_in_use(model_dir, _read_holder(path))) from None
        # Locked, but maybe a file its previous holder has just unlinked: lock the new one.
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    previous = _parse(os.pread(fd, 65536, 0))
    if previous and previous.get("host") != socket.gethostname():
        os.close(fd)
        raise UserError(_in_use(model_dir, previous, other_host=path))
    if previous:
        logging.warning("%s was left by %s (pid %s, since %s), which is no longer running; "
                        "taking it over", path, previous.get("command", "a run"),
                        previous.get("pid"), previous.get("started"))
    record = {"host": socket.gethostname(), "pid": os.getpid(), "command": command,
              "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    except OSError as e:
        os.close(fd)
        raise UserError(f"--model_dir={model_dir}: cannot write the lock file {path} "
                        f"({e.strerror}); free some space or choose another --model_dir") from None
    return fd


def _remove_created(model_dir: str, created: str | None) -> None:
    """Removes the empty directories from `model_dir` up to `created` (which acquire made)."""
    if created is None:
        return
    directory = os.path.abspath(model_dir)
    while True:
        try:
            os.rmdir(directory)
        except OSError:  # not empty: the run wrote something there, keep it
            return
        if directory == created:
            return
        directory = os.path.dirname(directory)


def _in_use(model_dir: str, holder: dict | None, other_host: str | None = None) -> str:
    if not holder:
        return (f"--model_dir={model_dir} is in use by another run; wait for it or choose "
                "another --model_dir")
    who = (f"{holder.get('command', 'another run')} (pid {holder.get('pid')} on host "
           f"{holder.get('host')}, since {holder.get('started')})")
    if other_host:
        return (f"--model_dir={model_dir} is in use by {who}; wait for it or choose another "
                f"--model_dir (if that run has ended, delete {other_host})")
    return f"--model_dir={model_dir} is in use by {who}; wait for it or choose another --model_dir"


def _read_holder(path: str) -> dict | None:
    """The holder's record; retried briefly, as a new holder writes it just after locking."""
    for _ in range(20):
        try:
            with open(path, "rb") as f:
                record = _parse(f.read())
        except OSError:
            record = None
        if record:
            return record
        time.sleep(0.05)
    return None


def _parse(data: bytes) -> dict | None:
    try:
        record = json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def _key(model_dir: str) -> str:
    return os.path.realpath(model_dir)
