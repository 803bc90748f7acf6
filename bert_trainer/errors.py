"""The exception types the CLI turns into one line and an exit code.

Library code raises `UserError` (a `ValueError`) with a one-line message that names the
offending thing (file, flag, argument, size) and the fix. The CLI prints it without a
traceback and exits with `EXIT_USER_ERROR`; `Preempted` (a clean stop on SIGTERM/SIGINT/SIGHUP)
exits with `EXIT_PREEMPTED`.
"""

import errno
import os
import shutil

EXIT_USER_ERROR = 2
EXIT_PREEMPTED = 143  # 128 + SIGTERM: the run was stopped cleanly and can be resumed.
EXIT_NONFINITE = 3    # loss or gradient became NaN/Inf.
EXIT_PEER_LOST = 75   # EX_TEMPFAIL: a multi-worker peer went away; restart all workers to resume.


class UserError(ValueError):
    """Bad input from the user: a file, a flag, a config or a checkpoint."""


# Lines of TensorFlow's (and Python's) error text that give context, not the cause.
_NOT_THE_CAUSE = ("Graph execution error", "Detected at node", "Additional GRPC", ":UNKNOWN",
                  "[[", "File ")


def first_line(error) -> str:
    """The first line of an error (an exception, or its text) that says what went wrong:
    TensorFlow's messages run to many lines of context, gin appends "In call to configurable"
    lines. An exception with no text gives its type's name."""
    text = getattr(error, "message", None) or str(error)
    lines = [line for line in text.strip().splitlines() if line.strip()]
    causes = [line for line in lines
              if not line[:1].isspace() and not line.startswith(_NOT_THE_CAUSE)]
    if causes or lines:
        return (causes or lines)[0]
    return type(error).__name__ if isinstance(error, BaseException) else ""


# What a storage fault is, by errno and by the text TensorFlow's file system layer puts in
# its errors (it raises ResourceExhaustedError / PermissionDeniedError / ..., not OSError).
_FAULTS = (
    (errno.ENOSPC, "No space left on device", "no space left on the device"),
    (errno.EDQUOT, "Disk quota exceeded", "the disk quota is exceeded"),
    (errno.EROFS, "Read-only file system", "the file system is read-only"),
    (errno.EACCES, "Permission denied", "permission denied"),
    (errno.EPERM, "Operation not permitted", "operation not permitted"),
)


def storage_fault(error: BaseException, *, writing: str, path: str,
                  needed_bytes: int | None = None, hint: str = "") -> "UserError | None":
    """A one-line UserError for a full disk or a refused write, or None for other errors.

    Args:
        error: what the write raised: an OSError, or a TensorFlow error whose message carries
            the operating system's text ("No space left on device", "Permission denied", ...).
        writing: what was being written, e.g. "checkpoint ckpt-12" or "SavedModel".
        path: where it was being written.
        needed_bytes: the size of what was being written, when known.
        hint: appended after the fix, e.g. "the last good checkpoint ckpt-10 is intact".

    Returns:
        "writing {writing} to {path} failed: {cause}[ (needs about N MB, M MB free)]; free
        space or fix the permissions and run again[; {hint}]", or None when `error` is not a
        storage fault (the caller re-raises it).
    """
    number = getattr(error, "errno", None)
    text = getattr(error, "message", None) or str(error)
    cause = next((c for n, t, c in _FAULTS if number == n or t in text), None)
    if cause is None:
        return None
    space = ""
    if needed_bytes is not None:
        space = f" (needs about {_megabytes(needed_bytes)}"
        free = _free_bytes(path)
        space += f", {_megabytes(free)} free)" if free is not None else ")"
    fix = ("free some space" if number in (errno.ENOSPC, errno.EDQUOT) or "space" in cause
           or "quota" in cause else "make it writable (or choose another path)")
    return UserError(f"writing {writing} to {path} failed: {cause}{space}; {fix} and run "
                     f"again{'; ' + hint if hint else ''}")


def _megabytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _free_bytes(path: str) -> int | None:
    """Free bytes on the file system holding `path` (its nearest existing parent)."""

    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent
    try:
        return shutil.disk_usage(path or ".").free
    except OSError:
        return None


class Preempted(Exception):  # noqa: N818 (named after the event, like KeyboardInterrupt)
    """Training stopped on a signal after writing a checkpoint; rerun the command to resume.

    Raised by `training.Trainer.train_and_evaluate` (see training/preemption.py); the CLI
    prints its one-line message and exits with `EXIT_PREEMPTED`.

    Attributes:
        step: the last step applied and checkpointed.
        checkpoint: the checkpoint written at `step`.
        signal_name: "SIGTERM", "SIGINT", "SIGHUP" or "a peer worker's stop signal".
    """

    def __init__(self, step: int, checkpoint: str | None, signal_name: str):
        self.step = step
        self.checkpoint = checkpoint
        self.signal_name = signal_name
        super().__init__(f"stopped by {signal_name} after step {step}; checkpoint "
                         f"{checkpoint or '(none)'} written. Run the same command again to "
                         "resume from it.")


def require_positive_ints(config, names, prefix: str = "") -> None:
    """Raises a UserError naming the first of `config`'s fields `names` that is not an int >= 1.

    Args:
        config: a dataclass instance (or any object with those attributes).
        names: field names to check, in order.
        prefix: put before the field name in the message, e.g. "SquadConfig.".
    """
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{prefix}{name}={value!r} must be a positive integer")
