"""The Beam pipeline of create_pretraining_data: the local path's chunks, work and shards.

Chunks. The local path numbers the documents of the input files in order (file by file, as
`text_corpus.read_documents` yields them) and cuts them into chunks of `chunk_documents`
consecutive documents: chunk i holds documents i*C .. (i+1)*C - 1, across file boundaries. The
pipeline makes the same chunks without reading the corpus on the driver, which only lists the
files: (1) a worker counts each file's documents; (2) the counts, one number a file, give each
file the number of its first document (a side input); (3) a worker reads each file again and
sends its documents, in runs of consecutive ones, to their chunk (a `GroupByKey` on the chunk
index); (4) a chunk's runs are put back in document order: the local path's chunk, whole.

Work. Each chunk goes through the local path's own per-chunk function (masked LM:
`make_chunk`; causal LM: `chunk_stream`), whose result depends only on the chunk's documents,
its index and the seed. The callers (the families' corpus writers) pass these functions in
(keyword arguments below), so this module imports neither.

Order. The local path writes chunk 0's records, then chunk 1's, and so on, and record g of
that sequence goes to shard `shard_set.shard_of(g, ...)`. The records of each chunk (one
number a chunk, a side input) give each chunk the number of its first record, so every record
knows its g; records are grouped by shard and each shard is written in g order: the same bytes
as the local `ShardWriter`. Causal LM: the local path appends each chunk's token stream to the
leftover of the previous one and cuts blocks; here the streams' lengths give each chunk its
offset in the whole stream, each block is assembled from the pieces of the chunks it spans and
belongs to the chunk that completes it, and each chunk shuffles its blocks with the same
generator (`corpus_chunks.chunk_rng(seed, chunk)`) as the local path.

Writing. A worker writes each shard aside in the run's hidden staging directory and renames
it when complete (a retried bundle writes the same bytes); the driver then moves the set into
place, summary last (`pretraining_run.publish_shard_set`): an output appears only when
complete, and a failed run leaves an earlier set as it was.

Memory: a worker holds one chunk or one shard's records; the driver, the file list. Files go
through `tf.io.gfile` (or `text_corpus.open_binary`): gs:// (ram:// in the tests) works as a
local path; staging must be on a file system every worker sees (a shared mount, or gs://).
"""

import bisect
import collections
import contextlib
import json
import logging
import os
import re
import typing
import uuid

import apache_beam as beam
import numpy as np
import tensorflow as tf
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, WorkerOptions

from bert_trainer.data import shard_set, text_corpus
from bert_trainer.errors import UserError

STATS_FILE = ".beam-stats.json"  # In the staging directory: the run's counts, for the summary.


def masked_lm(run, config, vocab_file: str, *, make_chunk, worker_state):
    """fn(staging) -> shards, for `pretraining_run.publish_shard_set`: masked-LM examples.

    Args:
      run: from `pretraining_run.start_run` (its files, output, and its `CorpusOptions`: how
        the text is read, the sharding, the runner and its options).
      config: the masked-LM corpus writer's `PretrainingDataConfig`.
      vocab_file: as its `create_pretraining_data`.
      make_chunk, worker_state: that writer's own.
    """
    def build(pipeline):
        chunks, counted = _chunks(pipeline, run, config.chunk_documents)
        made = chunks | "MakeExamples" >> beam.ParDo(
            _Work(make_chunk, worker_state, (vocab_file, run.options.lower_case, config)))
        layout = (made | "RecordsPerChunk" >> beam.Map(lambda c: (c[0], len(c[1][0])))
                  | "AllRecordsPerChunk" >> beam.combiners.ToList()
                  | "RecordLayout" >> beam.Map(_layout))
        numbered = made | "NumberRecords" >> beam.FlatMap(_number_records,
                                                          beam.pvalue.AsSingleton(layout))
        counts = made | "Counts" >> beam.Map(lambda c: c[1][1])
        examples = layout | "Examples" >> beam.Map(lambda lay: lay[1])
        return numbered, examples, counts, counted, None

    return _producer(run, build)


def causal_lm(run, config, vocab_file: str, *, chunk_stream, stream_state, chunk_rng,
              block_to_example):
    """fn(staging) -> shards, for `pretraining_run.publish_shard_set`: causal-LM blocks.

    Args:
      run: from `pretraining_run.start_run`.
      config: the causal-LM corpus writer's `CausalDataConfig`.
      vocab_file: as its `create_causal_lm_data`.
      chunk_stream, stream_state, block_to_example: that writer's own; chunk_rng:
        `corpus_chunks.chunk_rng`.
    """
    block_size = config.block_size

    def build(pipeline):
        chunks, counted = _chunks(pipeline, run, config.chunk_documents)
        streams = chunks | "TokenStreams" >> beam.ParDo(
            _Work(chunk_stream, stream_state, (vocab_file, run.options.lower_case)))
        layout = (streams | "TokensPerChunk" >> beam.Map(lambda c: (c[0], len(c[1][0])))
                  | "AllTokensPerChunk" >> beam.combiners.ToList()
                  | "StreamLayout" >> beam.Map(_layout))
        numbered = (streams
                    | "BlockPieces" >> beam.FlatMap(_block_pieces,
                                                    beam.pvalue.AsSingleton(layout), block_size)
                    | "GroupBlocksByChunk" >> beam.GroupByKey()
                    | "ShuffleBlocks" >> beam.FlatMap(_chunk_blocks,
                                                      beam.pvalue.AsSingleton(layout),
                                                      block_size, config.seed, chunk_rng,
                                                      block_to_example))
        counts = streams | "Counts" >> beam.Map(lambda c: c[1][1])
        # The blocks are the examples; the final partial block's tokens are dropped.
        blocks = layout | "Blocks" >> beam.Map(lambda lay: lay[1] // block_size)
        dropped = layout | "Dropped" >> beam.Map(
            lambda lay: {"tokens_dropped": lay[1] % block_size})
        return numbered, blocks, counts, counted, dropped

    return _producer(run, build)


# ---- Chunks: the local path's, made from per-file document counts. ----

def _chunks(pipeline, run, chunk_documents: int):
    """(chunk index, documents) of the local path's `read_chunks` over the run's files, read
    as its options say."""
    input_format, encoding_errors = run.options.input_format, run.options.encoding_errors
    paths = (pipeline | "Files" >> beam.Create(list(enumerate(run.files)))
             | "SpreadFiles" >> beam.Reshuffle())
    counted = paths | "CountDocuments" >> beam.Map(_count_documents, input_format,
                                                   encoding_errors)
    first = (counted | "AllCounts" >> beam.combiners.ToList()
             | "FirstDocuments" >> beam.Map(_first_documents))
    return (paths
            | "ReadDocuments" >> beam.FlatMap(_chunk_runs, beam.pvalue.AsSingleton(first),
                                              input_format, encoding_errors, chunk_documents)
            | "GroupChunks" >> beam.GroupByKey()
            | "OrderChunks" >> beam.Map(_chunk)), counted


def _count_documents(item: tuple, input_format: str, encoding_errors: str) -> tuple:
    """(file index, its documents, its lines that are not UTF-8)."""
    index, path = item
    stats = collections.Counter()
    documents = sum(1 for _ in text_corpus.read_documents(
        [path], input_format, encoding_errors=encoding_errors, stats=stats))
    return index, documents, stats["bad_utf8_lines"]


def _first_documents(counts: list) -> dict:
    """{file index: the number of its first document in the whole corpus}."""
    first, total = {}, 0
    for index, documents, _ in sorted(counts):
        first[index] = total
        total += documents
    return first


def _chunk_runs(item: tuple, first: dict, input_format: str, encoding_errors: str,
                chunk_documents: int):
    """A file's documents as (chunk index, (first document's number, consecutive documents))."""
    index, path = item
    number = start = first[index]
    run = []
    for document in text_corpus.read_documents([path], input_format,
                                               encoding_errors=encoding_errors):
        if run and number // chunk_documents != start // chunk_documents:
            yield start // chunk_documents, (start, run)
            run, start = [], number
        run.append(document)
        number += 1
    if run:
        yield start // chunk_documents, (start, run)


def _chunk(item: tuple) -> tuple:
    """(chunk index, documents in order) from its runs."""
    index, runs = item
    return index, [doc for _, docs in sorted(runs, key=lambda r: r[0]) for doc in docs]


class _Work(beam.DoFn):
    """`work(state, chunk)` on each chunk; the state is made once per DoFn instance."""

    def __init__(self, work, make_state, state_args: tuple):
        self._work, self._make_state, self._state_args = work, make_state, state_args
        self._state = None

    def setup(self):
        self._state = self._make_state(*self._state_args)

    def process(self, chunk):
        yield chunk[0], self._work(self._state, chunk)


# ---- Order: every record's number in the local output. ----

def _layout(sizes: list) -> tuple[list[int], int]:
    """[(chunk index, size)] -> (the sum of the sizes before each chunk, by index; the total).

    Chunk indices are 0 .. K-1 (every chunk holds a document).
    """
    sizes = dict(sizes)
    firsts, total = [], 0
    for index in range(len(sizes)):
        firsts.append(total)
        total += sizes[index]
    return firsts, total


def _number_records(item: tuple, layout: tuple):
    """(record's number in the local output, serialized example) for a chunk's records."""
    index, (records, _) = item
    first = layout[0][index]
    for k, record in enumerate(records):
        yield first + k, record


def _block_pieces(item: tuple, layout: tuple, block_size: int):
    """A chunk's stream cut at block boundaries, each piece sent to the chunk completing its block.

    Yields:
      (completing chunk, (block number, offset in the block, tokens)); tokens of the final
      partial block are dropped, as by the local `BlockPacker`.
    """
    index, (stream, _) = item
    offsets, total = layout
    start, end = offsets[index], offsets[index] + len(stream)
    blocks = total // block_size
    for block in range(start // block_size, min(-(-end // block_size), blocks)):
        lo, hi = max(start, block * block_size), min(end, (block + 1) * block_size)
        if hi > lo:
            # The chunk holding the block's last token completes it (zero-length chunks
            # share their offset with the next one: bisect_right picks the last of them).
            owner = bisect.bisect_right(offsets, (block + 1) * block_size - 1) - 1
            yield owner, (block, lo - block * block_size, stream[lo - start:hi - start].copy())


def _chunk_blocks(item: tuple, layout: tuple, block_size: int, seed: int, chunk_rng,
                  block_to_example):
    """The blocks a chunk completes, shuffled as the local path does: (number, example)."""
    index, pieces = item
    by_block = collections.defaultdict(list)
    for block, at, tokens in pieces:
        by_block[block].append((at, tokens))
    first = layout[0][index] // block_size  # Blocks completed before this chunk.
    if sorted(by_block) != list(range(first, first + len(by_block))):
        raise AssertionError(f"chunk {index}: blocks {sorted(by_block)} are not consecutive "
                             f"from {first}")
    order = list(range(len(by_block)))
    chunk_rng(seed, index).shuffle(order)
    for position, k in enumerate(order):
        parts = sorted(by_block[first + k], key=lambda p: p[0])
        block = np.concatenate([tokens for _, tokens in parts])
        if len(block) != block_size:
            raise AssertionError(f"block {first + k} has {len(block)} tokens, not {block_size}")
        example = block_to_example(block)
        yield first + position, example.SerializeToString(deterministic=True)


# ---- Writing: shards in the staging directory, a summary's counts beside them. ----

def _to_shard(item: tuple, num_shards: int | None, examples_per_shard: int | None) -> tuple:
    number, record = item
    return shard_set.shard_of(number, num_shards, examples_per_shard), (number, record)


def _write_shard(item: tuple, staging: str, pattern: str) -> int:
    """Writes one shard's records in order to a temporary name, then renames it into place."""
    shard, values = item
    records = sorted((v for v in values if v is not None), key=lambda v: v[0])
    path = os.path.join(staging, shard_set.staged_name(pattern, shard))
    temp = f"{path}.{uuid.uuid4().hex}.tmp"
    with tf.io.TFRecordWriter(temp) as writer:
        for _, record in records:
            writer.write(record)
    tf.io.gfile.rename(temp, path, overwrite=True)
    return shard


def _sum_counters(counters) -> collections.Counter:
    total = collections.Counter()
    for counter in counters:
        total.update(counter)
    return total


def _write_stats(counts: collections.Counter, counted: list, examples: int, shards: int,
                 extra: dict | None, path: str) -> None:
    """The run's counts, for the driver's summary."""
    stats = {**counts, "examples": examples, **(extra or {}),
             "bad_utf8_lines": sum(bad for _, _, bad in counted), "shard_files": shards}
    with tf.io.gfile.GFile(path + ".tmp", "w") as f:
        json.dump(stats, f)
    tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


def _producer(run, build):
    """fn(staging) that runs the pipeline `build` makes and returns the staged shards."""
    def produce(staging: str) -> list[tuple[str, str]]:
        options = PipelineOptions(run.beam_args)
        run.num_workers = _num_workers(run.runner, options)
        if run.tick.stream is not None:
            print(f"create_pretraining_data: running the Beam pipeline on {run.runner} "
                  f"({len(run.files):,} input files)", file=run.tick.stream, flush=True)
        pipeline = beam.Pipeline(runner=_runner(run.runner), options=options)
        numbered, examples, counts, counted, extra = build(pipeline)
        num_shards, per_shard = run.num_shards, run.examples_per_shard
        shard_files = examples | "ShardFiles" >> beam.Map(
            shard_set.shard_count, num_shards, per_shard)
        # (shard, (record's number, record)), and (shard, None) for every shard, so that one
        # with no records is written too (as `ShardWriter` does).
        keyed = numbered | "KeyByShard" >> beam.Map(
            _to_shard, num_shards, per_shard).with_output_types(tuple[int, typing.Any])
        every = shard_files | "EveryShard" >> beam.FlatMap(
            lambda n: ((s, None) for s in range(n))).with_output_types(tuple[int, typing.Any])
        _ = ((keyed, every) | "WithEmptyShards" >> beam.Flatten()
             | "GroupShards" >> beam.GroupByKey()
             | "WriteShards" >> beam.Map(_write_shard, staging, run.output))
        stats_path = os.path.join(staging, STATS_FILE)
        if extra is None:
            extra = pipeline | "NoExtra" >> beam.Create([None])
        _ = (counts | "SumCounts" >> beam.CombineGlobally(_sum_counters)
             | "WriteCounts" >> beam.Map(
                 _write_stats,
                 beam.pvalue.AsSingleton(counted | "AllFileCounts" >> beam.combiners.ToList()),
                 beam.pvalue.AsSingleton(examples), beam.pvalue.AsSingleton(shard_files),
                 beam.pvalue.AsSingleton(extra), stats_path))
        with _user_errors(), _quiet(run.runner):
            state = pipeline.run().wait_until_finish()
        if state not in (None, "DONE"):
            raise UserError(f"the Beam pipeline on {run.runner} ended {state}; nothing was "
                            "written (see the runner's log)")
        with tf.io.gfile.GFile(stats_path, "rb") as f:
            stats = json.loads(f.read())
        shards = stats.pop("shard_files")
        run.stats.update(stats)
        return [(os.path.join(staging, shard_set.staged_name(run.output, s)),
                 shard_set.final_path(run.output, s, shards)) for s in range(shards)]

    return produce


def _runner(name: str):
    """The runner object or name: DirectRunner is Beam's in-process batch runner (FnApiRunner).

    Beam's own DirectRunner first tries Prism, a runner it downloads; this pipeline needs
    nothing Prism adds, and a run should not depend on a download.
    """
    if name == "DirectRunner":
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner  # noqa: PLC0415

        return FnApiRunner()
    return name


def _num_workers(runner: str, options: PipelineOptions) -> int:
    """The workers the options ask for (for the summary's throughput per worker)."""
    if runner == "DirectRunner":
        return max(1, options.view_as(DirectOptions).direct_num_workers)
    workers = options.view_as(WorkerOptions)
    return workers.max_num_workers or workers.num_workers or 1


_USER_ERROR = re.compile(r"UserError: (.+)")
_STEP = re.compile(r"\s*\[while running '[^']*'\]$")  # What Beam appends to a worker's error.


@contextlib.contextmanager
def _user_errors():
    """A `UserError` raised on a worker (bad UTF-8 in strict mode, ...) as itself, one line."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 (runners wrap a worker's exception their own way)
        cause = e
        while cause is not None:
            if isinstance(cause, UserError):
                raise UserError(_STEP.sub("", str(cause))) from None
            cause = cause.__cause__ or cause.__context__
        found = _USER_ERROR.findall(str(e))
        if found:
            raise UserError(_STEP.sub("", found[-1].strip())) from None
        raise


@contextlib.contextmanager
def _quiet(runner: str):
    """DirectRunner: Beam does not log a worker's exception, which reaches the caller anyway.

    Other runners keep their logs: they are how a cluster's failures are found.
    """
    logger = logging.getLogger("apache_beam")
    level = logger.level
    if runner == "DirectRunner":
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)
