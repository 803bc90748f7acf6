"""Causal-LM pretraining TFRecords from text: documents packed into fixed-length blocks.

GPT-2 / nanoGPT style: every document is tokenized with the WordPiece vocabulary and the
documents are joined into one token stream with ONE separator before each document,

    [SEP] doc1 tokens [SEP] doc2 tokens [SEP] doc3 tokens ...

which is cut into blocks of exactly `block_size` tokens. Documents span blocks, so no token
is padding; the final partial block (fewer than `block_size` tokens) is dropped, and the
summary JSON says how many tokens that was (`tokens_dropped`). Every other token of the
stream is in exactly one block.

Streaming: documents are read and tokenized `chunk_documents` at a time (on `num_workers`
processes, see `chunk_workers`); in chunk order, each chunk's stream is appended to the
leftover of the previous one and cut into blocks, whose order within the chunk is shuffled with
a generator seeded by `seed` and the chunk's index before they are dealt to the shards (so one
shard does not hold a long run of one document's consecutive blocks). Memory is bounded by a
few chunks, and the output is deterministic for a seed, the inputs and `chunk_documents`,
whatever the number of workers.

Each record holds one feature, `input_word_ids` (int64 [block_size]).
"""

import collections
import dataclasses
import os
import sys

import numpy as np
import tensorflow as tf

from bert_trainer import features
from bert_trainer.data import beam, pretraining_run
from bert_trainer.data.corpus_chunks import chunk_rng, chunk_stats, tokenize_documents
from bert_trainer.data.corpus_options import CorpusOptions, corpus_options
from bert_trainer.data.tokenizer import Tokenizer
from bert_trainer.errors import UserError

OBJECTIVE = "causal_lm"
# Longer blocks than any positional table we build (GPT-2 has 1,024): a larger value is a typo.
MAX_BLOCK_SIZE = 65_536


@dataclasses.dataclass(frozen=True)
class CausalDataConfig:
    """How blocks are made.

    Attributes:
      block_size: tokens per block (the model's training sequence length).
      seed: shuffles the blocks within each chunk.
      chunk_documents: documents read and tokenized at a time.
    """

    block_size: int = 256
    seed: int = 12345
    chunk_documents: int = 1000

    def validate(self):
        if self.block_size < 2:
            raise UserError(f"--block_size={self.block_size} is too short: a block needs at "
                            "least 2 tokens (a token and the next one it predicts); GPT-2 "
                            "uses 1024")
        if self.block_size > MAX_BLOCK_SIZE:
            raise UserError(f"--block_size={self.block_size} exceeds {MAX_BLOCK_SIZE:,}, "
                            "longer than any model's positions; use the model's "
                            "max_sequence_length (e.g. 256 or 1024)")
        if self.chunk_documents < 1:
            raise UserError(f"chunk_documents={self.chunk_documents} must be >= 1")


def document_stream(documents: list[list[np.ndarray]], sep_id: int) -> np.ndarray:
    """The token stream of tokenized documents: `[SEP] doc1 [SEP] doc2 ...`.

    Args:
      documents: documents as lists of int token-id arrays (one per sentence).
      sep_id: the separator's id.

    Returns:
      int64 [sum of tokens + len(documents)].
    """
    sep = np.array([sep_id], np.int64)
    pieces = [piece for doc in documents for piece in (sep, *doc)]
    return np.concatenate(pieces).astype(np.int64) if pieces else np.zeros([0], np.int64)


class BlockPacker:
    """Cuts a stream that arrives in pieces into blocks of `block_size` tokens.

    Tokens that do not fill a block wait for the next piece; `pending` is what is left at the
    end (fewer than `block_size` tokens: the final partial block).
    """

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.pending = np.zeros([0], np.int64)

    def add(self, tokens: np.ndarray) -> np.ndarray:
        """Appends `tokens` to the stream; returns the blocks completed, int64 [n, block_size]."""
        stream = np.concatenate([self.pending, np.asarray(tokens, np.int64)])
        n = len(stream) // self.block_size
        self.pending = stream[n * self.block_size:]
        return stream[:n * self.block_size].reshape(n, self.block_size)


def block_to_example(block: np.ndarray) -> tf.train.Example:
    feature = tf.train.Feature(int64_list=tf.train.Int64List(value=block))
    return tf.train.Example(features=tf.train.Features(
        feature={features.INPUT_WORD_IDS: feature}))


def create_causal_lm_data(inputs, vocab_file: str, output: str,
                          config: CausalDataConfig = CausalDataConfig(),
                          options: CorpusOptions | None = None, progress=sys.stderr,
                          **fields) -> dict:
    """Writes causal-LM block TFRecords and a JSON summary next to them.

    Args:
      inputs: text files: comma list / globs (see `text_corpus.expand_inputs`), or a
        `tfds_sources.TfdsText` dataset.
      vocab_file: the WordPiece `vocab.txt` (it must hold `[SEP]`).
      output: shard pattern with one `*`, e.g. `DIR/causal-*.tfrecord`; `*` becomes
        `SSSSS-of-NNNNN` and the summary goes to `DIR/causal-summary.json`.
      config: see `CausalDataConfig`.
      options: how the text is read and the shards written (see `CorpusOptions`; None:
        the defaults); the examples are blocks, and `num_workers` processes tokenize the text.
      progress: stream for progress lines, or None.
      **fields: or, without `options`, its fields as keyword arguments.

    Returns:
      The summary dict (also written as JSON): counts of documents, tokens, blocks
      ("examples"), `tokens_dropped` (the final partial block), the shards.
    """
    options = corpus_options(options, **fields)
    config.validate()
    run = pretraining_run.start_run(inputs, vocab_file, output, options, progress)

    def summarize(shards):
        dropped = run.stats["tokens_dropped"]
        if not run.stats["examples"]:
            raise UserError(
                f"--input={inputs} produced no blocks: {run.stats['documents']} documents make "
                f"{dropped} tokens with separators, fewer than --block_size={config.block_size}; "
                "give more text or a smaller --block_size")
        return _summary(run, dropped, shards, config, vocab_file)

    if run.runner != beam.LOCAL:
        from bert_trainer.data.beam import pipeline  # noqa: PLC0415 (an optional extra)

        return pretraining_run.publish_shard_set(run, pipeline.causal_lm(
            run, config, vocab_file, chunk_stream=chunk_stream, stream_state=stream_state,
            chunk_rng=chunk_rng, block_to_example=block_to_example), summarize)
    packer = BlockPacker(config.block_size)

    def write(writer):
        with run.map_chunks(chunk_stream, stream_state, (vocab_file, options.lower_case),
                            config.chunk_documents) as results:
            for index, (stream, counts) in enumerate(results):
                blocks = packer.add(stream)
                order = list(range(len(blocks)))
                chunk_rng(config.seed, index).shuffle(order)
                for i in order:
                    writer.write(block_to_example(blocks[i]))
                counts["examples"] = len(blocks)
                run.count(counts)
        run.stats["tokens_dropped"] = len(packer.pending)  # The final partial block.

    return pretraining_run.write_shard_set(run, write, summarize)


def stream_state(vocab_file: str, lower_case: bool) -> Tokenizer:
    return Tokenizer(vocab_file, lower_case=lower_case)


def chunk_stream(tokenizer: Tokenizer, chunk: tuple) -> tuple[np.ndarray, collections.Counter]:
    """One chunk of documents (index, sentence strings) as its token stream, and its counts."""
    _, documents = chunk
    docs = tokenize_documents(documents, tokenizer)
    return document_stream(docs, tokenizer.sep_id), chunk_stats(docs)


def _summary(run: pretraining_run.Run, dropped: int, shards: list[str],
             config: CausalDataConfig, vocab_file: str) -> dict:
    stats = run.stats
    return run.summary({
        "objective": OBJECTIVE, "documents": stats["documents"],
        "sentences": stats["sentences"], "corpus_tokens": stats["corpus_tokens"],
        "separator_tokens": stats["documents"], "examples": stats["examples"],
        "block_size": config.block_size, "tokens": stats["examples"] * config.block_size,
        "tokens_dropped": dropped, "final_block": "dropped",
        "shards": [os.path.basename(s) for s in shards],
    }, vocab_file, "bert_trainer", config)
