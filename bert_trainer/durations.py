"""Durations as users write them: "90s", "20m", "1.5h" (or a number of seconds).

`bert-train pretrain --time_budget=20m` and `TrainerConfig.time_budget = '20m'` read them here;
no TensorFlow, so a bad value is refused before anything is imported or written.
"""

import math
import re

from bert_trainer.errors import UserError

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smh]?)\s*")


def parse_duration(value, what: str = "time_budget") -> float:
    """Seconds of `value`: a number of seconds, or a string such as "90s", "20m", "1.5h".

    A string without a unit is seconds.

    Args:
        value: the duration.
        what: the setting named in the error, e.g. "--time_budget".

    Returns:
        The duration in seconds, > 0 and finite.

    Raises:
        UserError: not a duration, or not > 0.
    """
    if isinstance(value, bool):
        seconds = None
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.fullmatch(value)):
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    else:
        seconds = None
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise UserError(f"{what}={value!r} is not a duration > 0; give seconds or a number and "
                        "a unit, e.g. 90s, 20m or 1.5h")
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest of "90s", "20m", "1.5h" that `parse_duration` reads back as `seconds`."""
    for unit in ("h", "m"):
        amount = seconds / _UNITS[unit]
        if amount >= 1 and amount == round(amount, 2):
            return f"{amount:g}{unit}"
    return f"{seconds:g}s"
