"""Progress lines and the JSON summary of `create_pretraining_data`.

Kept apart from the example-making algorithm (create_pretraining_data.py): what a run reports
about itself is not part of how examples are made.
"""

import dataclasses
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


def write_summary(path: str, stats, shards: list[str], files: list[str], config,
                  vocab_file: str, lower_case: bool, seconds: float) -> dict:
    """Writes the run's summary JSON next to its shards.

    Args:
      path: the JSON file, e.g. DIR/train-summary.json.
      stats: the run's Counter (documents, sentences, corpus_tokens, examples, tokens,
        truncated, random_next, bad_utf8_lines); `examples` must be > 0.
      shards: the shard paths written.
      files: the input files read.
      config: the `PretrainingDataConfig` used.
      vocab_file, lower_case: the tokenizer's settings.
      seconds: how long the run took.

    Returns:
      The summary dict that was written.
    """
    summary = {
        "documents": stats["documents"], "sentences": stats["sentences"],
        "corpus_tokens": stats["corpus_tokens"], "examples": stats["examples"],
        "tokens": stats["tokens"], "shards": [os.path.basename(s) for s in shards],
        "fraction_truncated": stats["truncated"] / stats["examples"],
        "fraction_random_next": stats["random_next"] / stats["examples"],
        "bad_utf8_lines": stats["bad_utf8_lines"], "seconds": round(seconds, 3),
        "examples_per_second": round(stats["examples"] / max(seconds, 1e-9), 1),
        "input_files": len(files), "vocab_file": os.path.abspath(vocab_file),
        "lower_case": lower_case,
        "feature_names": "google-research/bert" if config.static_masking else "bert_trainer",
        "config": dataclasses.asdict(config),
    }
    write_json(path, summary)
    return summary


def write_json(path: str, summary: dict) -> None:
    """Writes a summary JSON whole or not at all (it marks its split complete)."""
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)
