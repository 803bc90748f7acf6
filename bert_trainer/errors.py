"""The exception types the CLI turns into one line and an exit code.

Library code raises `UserError` (a `ValueError`) with a one-line message that names the
offending thing (file, flag, argument, size) and the fix. The CLI prints it without a
traceback and exits with `EXIT_USER_ERROR`; `Preempted` (a clean stop on SIGTERM/SIGINT)
exits with `EXIT_PREEMPTED`.
"""

EXIT_USER_ERROR = 2
EXIT_PREEMPTED = 143  # 128 + SIGTERM: the run was stopped cleanly and can be resumed.
EXIT_NONFINITE = 3    # loss or gradient became NaN/Inf.
EXIT_PEER_LOST = 75   # EX_TEMPFAIL: a multi-worker peer went away; restart all workers to resume.


class UserError(ValueError):
    """Bad input from the user: a file, a flag, a config or a checkpoint."""


class Preempted(Exception):  # noqa: N818 (named after the event, like KeyboardInterrupt)
    """Training stopped on a signal after writing a checkpoint; rerun the command to resume.

    Raised by `training.Trainer.train_and_evaluate` (see training/preemption.py); the CLI
    prints its one-line message and exits with `EXIT_PREEMPTED`.

    Attributes:
        step: the last step applied and checkpointed.
        checkpoint: the checkpoint written at `step`.
        signal_name: "SIGTERM", "SIGINT" or "a peer worker's stop signal".
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
