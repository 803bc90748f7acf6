"""Progress lines on stderr, stamped with the seconds since the benchmark started."""

import sys
import time

START = time.perf_counter()


def elapsed() -> float:
    """Seconds since the benchmark process imported this module."""
    return time.perf_counter() - START


def say(message: str) -> None:
    print(f"[benchmark {elapsed():6.1f}s] {message}", file=sys.stderr, flush=True)
