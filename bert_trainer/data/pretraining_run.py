"""What both objectives of create_pretraining_data do around making examples.

Before any text is read: the arguments, the inputs, the vocabulary and the output are checked
(`start_run`), so bad input fails in one line with nothing written. After: the shards are
written aside and moved into place with their summary last, or nothing is left
(`write_shard_set`).
"""

import collections
import contextlib
import dataclasses
import json
import os
import posixpath
import time
import uuid

import tensorflow as tf

from bert_trainer import outputs
from bert_trainer.data import beam, chunk_workers, shard_set, text_corpus
from bert_trainer.data import pretraining_data_report as report
from bert_trainer.data.tokenizer import load_vocab
from bert_trainer.errors import UserError


def check_sharding(num_shards: int | None, examples_per_shard: int | None) -> int | None:
    """Validates the sharding arguments; returns `examples_per_shard` (100,000 if neither)."""
    if num_shards is not None and examples_per_shard is not None:
        raise UserError("pass --num_shards or --examples_per_shard, not both")
    if (num_shards is not None and num_shards < 1) or (
            examples_per_shard is not None and examples_per_shard < 1):
        raise UserError("--num_shards and --examples_per_shard must be >= 1")
    if num_shards is None and examples_per_shard is None:
        return 100_000
    return examples_per_shard


@dataclasses.dataclass
class Run:
    """What both objectives check and set up before reading any text."""

    tfds: object  # A `tfds_sources.TfdsText` when the text is not in `files`, else None.
    output: str
    summary_path: str
    old: list
    files: list
    num_shards: int | None
    examples_per_shard: int | None
    num_workers: int
    stats: collections.Counter
    tick: report.Progress
    runner: str = beam.LOCAL  # Or a Beam runner (`bert_trainer.data.beam`).
    beam_args: list = dataclasses.field(default_factory=list)  # The Beam pipeline options.

    def documents(self, input_format: str, encoding_errors: str):
        """The documents of the text files or of the TFDS dataset, streamed."""
        if self.tfds is not None:
            return self.tfds.documents(self.stats)
        return text_corpus.read_documents(self.files, input_format,
                                          encoding_errors=encoding_errors, stats=self.stats)

    def throughput(self) -> dict:
        text_bytes = self.stats["text_bytes"] or sum(_size(f) for f in self.files)
        result = report.throughput(self.stats, text_bytes, time.time() - self.tick.start,
                                   self.num_workers)
        if self.runner != beam.LOCAL:
            result["throughput"]["runner"] = self.runner
        return result


def start_run(inputs, vocab_file, output, num_shards, examples_per_shard, overwrite,
              num_workers, lower_case, progress, runner: str = beam.LOCAL,
              beam_options=()) -> Run:
    """Checks the arguments, the inputs, the vocabulary and the output before anything runs.

    `runner` and `beam_options`: see `bert_trainer.data.beam.check_runner`; a Beam runner
    reads text files (--input), not a TFDS dataset.
    """
    beam_args = beam.check_runner(runner, beam_options)
    if runner != beam.LOCAL and not isinstance(inputs, str | list | tuple):
        raise UserError(f"--runner={runner} reads text files (--input); a --tfds dataset is "
                        "read with --runner=local")
    beam.check_paths(runner, inputs, vocab_file, output)  # Dataflow: gs:// only.
    examples_per_shard = check_sharding(num_shards, examples_per_shard)
    chunk_workers.check_num_workers(num_workers)
    # Not isinstance(TfdsText): importing tfds_sources loads tensorflow_datasets (seconds).
    files, tfds = [], None if isinstance(inputs, str | list | tuple) else inputs
    if tfds is not None:
        tfds.texts()  # An unknown or unprepared dataset, or a wrong text key, fails here.
    else:
        files = text_corpus.expand_inputs(inputs)
        unreadable = [f for f in files
                      if not text_corpus.is_url(f) and not os.access(f, os.R_OK)]
        if unreadable:
            raise UserError(f"--input: {unreadable[0]} is not readable (permission denied); "
                            "fix its permissions or leave it out")
    load_vocab(vocab_file)  # A bad vocabulary fails here, in one line (the workers load it).
    summary_path, old = shard_set.check_output(output, overwrite)
    if not text_corpus.is_url(output):
        output = os.path.abspath(os.path.expanduser(output))
    return Run(tfds, output, summary_path, old, files,
               num_shards, examples_per_shard, num_workers, collections.Counter(),
               report.Progress(progress), runner, beam_args)


def write_shard_set(run: Run, write, summarize) -> dict:
    """Writes a shard set aside and moves it into place with its summary, or leaves nothing.

    Args:
      run: from `start_run`.
      write: fn(ShardWriter) that writes every record.
      summarize: fn(shard paths) -> the summary dict; it may refuse an empty set (UserError).

    Returns:
      The summary (also written as JSON, last: it marks the set complete).
    """
    def produce(staging):
        writer = shard_set.ShardWriter(run.output, run.num_shards, run.examples_per_shard,
                                       staging)
        try:
            write(writer)
            return writer.close()
        except BaseException:
            writer.abort()
            raise

    return publish_shard_set(run, produce, summarize)


def publish_shard_set(run: Run, produce, summarize) -> dict:
    """Has `produce` write the shards into a staging directory, then moves them into place.

    Args:
      run: from `start_run`.
      produce: fn(staging directory) -> [(written path, final path)] of every shard, in order
        (`ShardWriter.close`'s list; a Beam pipeline's shards are named the same way).
      summarize: fn(shard paths) -> the summary dict; it may refuse an empty set (UserError).

    Returns:
      The summary (also written as JSON, last: it marks the set complete).
    """
    if text_corpus.is_url(run.output):
        return _publish_through_gfile(run, produce, summarize)
    with outputs.staging_directory(run.output.replace("*", "shards"),
                                   writing="pretraining data") as staging:
        shards = produce(staging)
        summary = summarize([f for _, f in shards])
        run.tick(run.stats, force=True)
        staged_summary = os.path.join(staging, os.path.basename(run.summary_path))
        report.write_json(staged_summary, summary)
        # The summary goes last: it marks the set complete. The old set goes only now.
        outputs.replace_files([*shards, (staged_summary, run.summary_path)], run.old)
    return summary


def _size(path: str) -> int:
    if text_corpus.is_url(path):
        return tf.io.gfile.stat(path).length
    return os.path.getsize(path)


def _publish_through_gfile(run: Run, produce, summarize) -> dict:
    """`publish_shard_set` for an output on gs:// (or ram://): every call is `tf.io.gfile`.

    The staging directory is a hidden one beside the output, as locally. An object store has
    no atomic rename (gfile.rename copies, then deletes), so the set is moved shard by shard:
    the old summary is deleted first (the old set is no longer marked complete), the new shards
    are moved into place, old shards the new set does not overwrite are deleted, and the new
    summary is written last. A reader that waits for the summary sees a complete set; a run that
    fails before the move leaves the old set as it was.
    """
    directory, name = posixpath.split(run.output.replace("*", "shards"))
    staging = f"{directory}/.{name}.staging-{uuid.uuid4().hex[:12]}"
    tf.io.gfile.makedirs(staging)
    try:
        shards = produce(staging)
        summary = summarize([f for _, f in shards])
        run.tick(run.stats, force=True)
        staged_summary = posixpath.join(staging, posixpath.basename(run.summary_path))
        with tf.io.gfile.GFile(staged_summary, "w") as f:
            f.write(json.dumps(summary, indent=2) + "\n")
        if run.summary_path in run.old:
            tf.io.gfile.remove(run.summary_path)
        finals = set()
        for staged, final in shards:
            tf.io.gfile.rename(staged, final, overwrite=True)
            finals.add(final)
        for path in run.old:
            if path != run.summary_path and path not in finals and tf.io.gfile.exists(path):
                tf.io.gfile.remove(path)
        tf.io.gfile.rename(staged_summary, run.summary_path, overwrite=True)  # Last.
    finally:
        with contextlib.suppress(tf.errors.OpError):
            tf.io.gfile.rmtree(staging)
    return summary
