"""Progress lines, throughput and the JSON summary file of `create_pretraining_data`.

Kept apart from the example-making algorithms (each objective's corpus writer, which also
says what its summary holds): what a run reports about itself is not part of how examples are
made.
"""

import json
import os
import sys
import time


class Progress:
    """Prints a line to stderr at most every `every` seconds (and once more at the end).

    Args:
      stream: where the lines go; None prints nothing.
      every: the least number of seconds between two lines (unless forced).
    """

    def __init__(self, stream=sys.stderr, every: float = 5.0):
        self.stream, self.every = stream, every
        self.start = self._last = time.time()
        self._printed = -1

    def __call__(self, stats, force: bool = False):
        """Prints `stats` (a Counter with "documents" and "examples") if it is time to."""
        now = time.time()
        if self.stream is None or stats["examples"] == self._printed or (
                now - self._last < self.every and not force):
            return
        self._last, self._printed = now, stats["examples"]
        rate = stats["examples"] / max(now - self.start, 1e-9)
        print(f"create_pretraining_data: {stats['documents']:,} documents, "
              f"{stats['examples']:,} examples ({rate:,.0f}/s)", file=self.stream, flush=True)


# Keys of a summary that measure the run rather than describe its output: they differ between
# two runs that wrote the same bytes.
RUN_KEYS = ("seconds", "examples_per_second", "throughput")


def throughput(stats, text_bytes: int, seconds: float, num_workers: int) -> dict:
    """How fast a run went: overall and per worker process (one core each).

    Returns:
      {"seconds", "examples_per_second", "throughput": {num_workers, text_mb,
      text_mb_per_second, examples_per_second, and both per worker}}.
    """
    seconds = max(seconds, 1e-9)
    mb_per_second = text_bytes / 1e6 / seconds
    examples_per_second = stats["examples"] / seconds
    return {"seconds": round(seconds, 3), "examples_per_second": round(examples_per_second, 1),
            "throughput": {
                "num_workers": num_workers, "text_mb": round(text_bytes / 1e6, 3),
                "text_mb_per_second": round(mb_per_second, 3),
                "examples_per_second": round(examples_per_second, 1),
                "text_mb_per_second_per_worker": round(mb_per_second / num_workers, 3),
                "examples_per_second_per_worker": round(examples_per_second / num_workers, 1)}}


def write_json(path: str, summary: dict) -> None:
    """Writes a summary JSON whole or not at all (it marks its split complete)."""
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)
