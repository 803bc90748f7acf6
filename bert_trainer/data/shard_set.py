"""The output of create_pretraining_data: a set of TFRecord shards and its summary, as one.

For `--output=DIR/PREFIX*SUFFIX` the shards are `DIR/PREFIX{i:05d}-of-{n:05d}SUFFIX` and the
summary `DIR/PREFIX` + `summary.json`; the summary lists the shards and marks the set complete.
A new set is written into a hidden staging directory and moved into place with its summary
last (`outputs.replace_files`); an old set is replaced only by `--overwrite`, only when every
file the pattern matches is such a shard, and only once the new set is complete.
"""

import contextlib
import glob
import json
import os
import re

import tensorflow as tf

from bert_trainer import outputs
from bert_trainer.data import text_corpus
from bert_trainer.errors import UserError


class ShardWriter:
    """Deals examples round-robin over `num_shards` files, or fills `examples_per_shard` each.

    The shards are written into `staging` (a hidden directory beside the output) under
    provisional names; `close()` says which final name each one takes, and the caller moves
    the whole set into place at once (`outputs.replace_files`), so a crashed or interrupted run
    never leaves files that match the output pattern.
    """

    def __init__(self, pattern: str, num_shards: int | None, examples_per_shard: int | None,
                 staging: str):
        self.pattern, self.num_shards = pattern, num_shards
        self.examples_per_shard, self.staging = examples_per_shard, staging
        self._paths, self._writers, self._count = [], [], 0
        if num_shards:
            for _ in range(num_shards):
                self._open()

    def _open(self):
        path = os.path.join(self.staging, staged_name(self.pattern, len(self._paths)))
        self._paths.append(path)
        self._writers.append(tf.io.TFRecordWriter(path))

    def write(self, example: tf.train.Example | bytes):
        """Writes one example, or one already serialized."""
        if self.num_shards:
            writer = self._writers[self._count % self.num_shards]
        else:
            if self._count % self.examples_per_shard == 0:
                if self._writers:
                    self._writers[-1].close()
                self._open()
            writer = self._writers[-1]
        if not isinstance(example, bytes):
            example = example.SerializeToString(deterministic=True)  # Sorted feature names.
        writer.write(example)
        self._count += 1

    def close(self) -> list[tuple[str, str]]:
        """Closes the shards; returns (written path, final path) for each, in order."""
        for writer in self._writers:
            writer.close()
        return [(path, final_path(self.pattern, i, len(self._paths)))
                for i, path in enumerate(self._paths)]

    def abort(self) -> None:
        """Closes the files after a failure (their space is freed once they are deleted)."""
        for writer in self._writers:
            with contextlib.suppress(Exception):
                writer.close()


def staged_name(pattern: str, shard: int) -> str:
    """The provisional file name of shard `shard` in the staging directory."""
    return os.path.basename(pattern).replace("*", f"{shard:05d}")


def final_path(pattern: str, shard: int, num_shards: int) -> str:
    """Where shard `shard` of `num_shards` goes: `*` becomes `SSSSS-of-NNNNN`."""
    return pattern.replace("*", f"{shard:05d}-of-{num_shards:05d}")


def shard_of(index: int, num_shards: int | None, examples_per_shard: int | None) -> int:
    """The shard `ShardWriter` writes the `index`-th example (from 0) of a run to."""
    return index % num_shards if num_shards else index // examples_per_shard


def shard_count(examples: int, num_shards: int | None, examples_per_shard: int | None) -> int:
    """How many shards `ShardWriter` writes for `examples` examples."""
    return num_shards if num_shards else -(-examples // examples_per_shard)


def summary_path(output: str) -> str:
    """The summary of the shard set `output` (DIR/train-*.tfrecord: DIR/train-summary.json)."""
    return os.path.splitext(output.replace("*", "summary"))[0] + ".json"


def check_output(output: str, overwrite: bool) -> tuple[str, list[str]]:
    """Validates the output pattern; refuses old files that may not be replaced.

    Nothing is deleted here: the old shards and summary are replaced only once the new set
    is complete (see `create_pretraining_data`).

    Returns:
      (the summary's path, the old shards and summary that the new set replaces).
    """
    if output.count("*") != 1 or "*" in os.path.dirname(output):
        raise UserError(f"--output={output} must hold exactly one '*' in the file name, "
                        "e.g. DIR/train-*.tfrecord")
    remote = text_corpus.is_url(output)  # gs://, ram://: through tf.io.gfile.
    if remote:
        matching, is_file = tf.io.gfile.glob, _gfile_is_file
    else:
        matching, is_file = glob.glob, os.path.isfile
        output = os.path.abspath(os.path.expanduser(output))
        owner = outputs.enclosing_model_dir(output)
        if owner is not None:
            raise UserError(f"--output={output} is inside the model directory {owner}, which "
                            "belongs to the run that made it; write the data elsewhere")
    summary = summary_path(output)
    shards = [p for p in sorted(matching(output)) if p != summary]
    old = [summary] * is_file(summary) + shards
    if old and not overwrite:
        if shards:
            raise UserError(f"--output={output} already matches {len(shards)} file(s); remove "
                            "them, pick another --output or pass --overwrite")
        raise UserError(f"--output={output}: {summary} exists (the summary of earlier data); "
                        "pick another --output or pass --overwrite")
    prefix, suffix = os.path.basename(output).split("*")
    shard_name = re.compile(re.escape(prefix) + r"\d{5}-of-\d{5}" + re.escape(suffix))
    foreign = [p for p in shards if not shard_name.fullmatch(os.path.basename(p))]
    if is_file(summary) and not is_summary(summary):
        foreign.insert(0, summary)
    if foreign:
        names = ", ".join(os.path.basename(p) for p in foreign[:6])
        raise UserError(f"--output={output}: {names}{' ...' * (len(foreign) > 6)} "
                        "(not pretraining data written by bert-train create_pretraining_data) "
                        "would be replaced; pick another --output")
    if not remote:  # An object store's permissions show when the first shard is written.
        outputs.check_writable(output, "--output")
    return summary, old


def _gfile_is_file(path: str) -> bool:
    return tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path)


def is_summary(path: str) -> bool:
    """Whether `path` is a summary that create_pretraining_data wrote (a JSON with shards)."""
    try:
        with text_corpus.open_binary(path) as f:
            data = json.loads(f.read())
    except (OSError, ValueError, tf.errors.OpError):
        return False
    return isinstance(data, dict) and isinstance(data.get("shards"), list)
