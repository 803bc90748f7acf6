"""The one exception type for bad user input.

Library code raises `UserError` (a `ValueError`) with a one-line message that names the
offending thing (file, flag, argument, size) and the fix. The CLI prints it without a
traceback and exits with `EXIT_USER_ERROR`.
"""

EXIT_USER_ERROR = 2
EXIT_PREEMPTED = 143  # 128 + SIGTERM: the run was stopped cleanly and can be resumed.
EXIT_NONFINITE = 3    # loss or gradient became NaN/Inf.


class UserError(ValueError):
    """Bad input from the user: a file, a flag, a config or a checkpoint."""
