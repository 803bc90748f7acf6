"""What both objectives of create_pretraining_data do around making examples.

Before any text is read: the options (a `CorpusOptions`, checked when built), the inputs, the
vocabulary and the output are checked (`start_run`), so bad input fails in one line with
nothing written. While: the chunks go through the writer's function on worker processes
(`Run.map_chunks`) and are counted (`Run.count`). After: the shards are written aside and
moved into place with their summary last (`Run.summary` ends every objective's), or nothing is
left (`write_shard_set`).
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
from bert_trainer.data.corpus_chunks import read_chunks
from bert_trainer.data.corpus_options import CorpusOptions
from bert_trainer.data.tokenizer import load_vocab
from bert_trainer.errors import UserError


@dataclasses.dataclass
class Run:
    """What both objectives check and set up before reading any text."""

    tfds: object  # A `tfds_sources.TfdsText` when the text is not in `files`, else None.
    output: str
    summary_path: str
    old: list
    files: list
    options: CorpusOptions
    num_workers: int  # The processes (or Beam workers) that made the examples, for the summary.
    stats: collections.Counter
    tick: report.Progress
    beam_args: list = dataclasses.field(default_factory=list)  # The Beam pipeline options.

    @property
    def runner(self) -> str:
        return self.options.runner

    @property
    def num_shards(self) -> int | None:
        return self.options.num_shards

    @property
    def examples_per_shard(self) -> int | None:
        return self.options.shard_size

    def documents(self):
        """The documents of the text files or of the TFDS dataset, streamed."""
        if self.tfds is not None:
            return self.tfds.documents(self.stats)
        return text_corpus.read_documents(self.files, self.options.input_format,
                                          encoding_errors=self.options.encoding_errors,
                                          stats=self.stats)

    @contextlib.contextmanager
    def map_chunks(self, work, make_state, state_args: tuple, chunk_documents: int):
        """`chunk_workers.map_chunks` of `work` over the documents, `chunk_documents` at a time,
        on the options' `num_workers` processes; `num_workers` becomes the number started."""
        chunks = read_chunks(self.documents(), chunk_documents)
        with chunk_workers.map_chunks(work, make_state, state_args, chunks,
                                      self.options.num_workers) as results:
            self.num_workers = results.num_workers  # what the summary reports
            yield results

    def count(self, counts: collections.Counter) -> None:
        """Adds one chunk's counts to the run's and reports progress."""
        self.stats.update(counts)
        self.tick(self.stats)

    def summary(self, head: dict, vocab_file: str, feature_names: str, config) -> dict:
        """`head` (the objective's counts), then what every corpus summary ends with: bad UTF-8
        lines, throughput, the inputs, the tokenizer, the feature names and `config`."""
        return {
            **head, "bad_utf8_lines": self.stats["bad_utf8_lines"], **self.throughput(),
            "input_files": len(self.files), "vocab_file": (vocab_file if "://" in vocab_file
                                                           else os.path.abspath(vocab_file)),
            "lower_case": self.options.lower_case, "feature_names": feature_names,
            "config": dataclasses.asdict(config),
        }

    def throughput(self) -> dict:
        text_bytes = self.stats["text_bytes"] or sum(_size(f) for f in self.files)
        result = report.throughput(self.stats, text_bytes, time.time() - self.tick.start,
                                   self.num_workers)
        if self.runner != beam.LOCAL:
            result["throughput"]["runner"] = self.runner
        return result


def start_run(inputs, vocab_file: str, output: str, options: CorpusOptions, progress) -> Run:
    """Checks the inputs, the vocabulary and the output before anything runs.

    `options` checked themselves when built; here a Beam runner (see
    `bert_trainer.data.beam.check_runner`) must import, and reads text files (--input), not a
    TFDS dataset.
    """
    runner = options.runner
    beam_args = beam.check_runner(runner, options.beam_options)
    if runner != beam.LOCAL and not isinstance(inputs, str | list | tuple):
        raise UserError(f"--runner={runner} reads text files (--input); a --tfds dataset is "
                        "read with --runner=local")
    beam.check_paths(runner, inputs, vocab_file, output)  # Dataflow: gs:// only.
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
        # Before the output is checked: --overwrite must not be the fix a rerun is told of.
        text_corpus.check_not_outputs(files, inputs, {
            output: f"a shard of this run's --output={output}",
            shard_set.summary_path(output): f"the summary this run writes (--output={output})"},
            recognize=_summary_of_other_data)
    load_vocab(vocab_file)  # A bad vocabulary fails here, in one line (the workers load it).
    summary_path, old = shard_set.check_output(output, options.overwrite)
    if not text_corpus.is_url(output):
        output = os.path.abspath(os.path.expanduser(output))
    return Run(tfds, output, summary_path, old, files, options, options.num_workers,
               collections.Counter(), report.Progress(progress), beam_args)


def _summary_of_other_data(path: str) -> str | None:
    """What `path` is when it is the summary of a shard set (not text), else None."""
    if (path.endswith(".json") and not text_corpus.is_url(path)
            and os.path.getsize(path) < _LARGEST_SUMMARY_BYTES and shard_set.is_summary(path)):
        return "the summary of a pretraining data set (create_pretraining_data wrote it)"
    return None


_LARGEST_SUMMARY_BYTES = 16 << 20  # a summary lists its shards: far below this


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
