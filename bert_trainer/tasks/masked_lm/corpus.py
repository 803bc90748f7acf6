"""Sentence-pair pretraining TFRecords from text, streaming (google-research/bert's algorithm).

For each document, sentences are packed into chunks of about `max_seq_length - 3` tokens (a
shorter random target with probability `short_seq_prob`); each chunk is split at a random
sentence boundary into A and B, and half of the time B is replaced by sentences from another
document (`next_sentence_labels` = 1, google-research/bert's `is_random_next`; 0 = the actual
next sentences). The pair is truncated from a random end of the longer side. This is done
`dupe_factor` times with different random splits.

Streaming: the corpus is cut into chunks of `chunk_documents` consecutive documents; each chunk
is tokenized and turned into examples on its own, with a random generator seeded by `seed` and
the chunk's index, and its examples are shuffled and dealt round-robin to the shards in chunk
order. Memory is bounded by a few chunks whatever the corpus size, and the chunks can be made
on several processes (`num_workers`, see `chunk_workers`) or by a Beam pipeline
(`bert_trainer.data.beam`) with the same result. The "random next" document is drawn from the
same chunk (google-research/bert draws from the whole corpus, held in memory). The output is
deterministic for a seed, the inputs and `chunk_documents`, whatever the number of workers.

Default output is unmasked (our feature names, for dynamic masking in the input pipeline);
`static_masking=True` writes google-research/bert's feature names with fixed masks.
"""

import collections
import dataclasses
import itertools
import os
import random
import struct
import sys

import tensorflow as tf

from bert_trainer import features
from bert_trainer.data import beam, masking, pretraining_run
from bert_trainer.data.corpus_chunks import chunk_rng, chunk_stats, tokenize_documents
from bert_trainer.data.corpus_options import CorpusOptions, corpus_options
from bert_trainer.data.example_wire import example_bytes, float_feature, int64_feature, varint_table
from bert_trainer.data.tokenizer import Tokenizer
from bert_trainer.errors import UserError

Instance = collections.namedtuple("Instance", "tokens_a tokens_b is_random_next truncated")


@dataclasses.dataclass(frozen=True)
class PretrainingDataConfig:
    """How examples are made. Field names follow google-research/bert's flags."""

    max_seq_length: int = 128
    short_seq_prob: float = 0.1
    dupe_factor: int = 1  # Dynamic masking already varies the masks; google's default is 10.
    seed: int = 12345
    static_masking: bool = False
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    whole_word_masking: bool = False
    chunk_documents: int = 1000

    def validate(self):
        if self.max_seq_length < 5:
            raise UserError(f"--max_seq_length={self.max_seq_length} is too short for "
                            "[CLS] A [SEP] B [SEP]; use at least 5 (BERT uses 128 or 512)")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise UserError(f"--short_seq_prob={self.short_seq_prob} must be in [0, 1]")
        if self.dupe_factor < 1:
            raise UserError(f"--dupe_factor={self.dupe_factor} must be >= 1")
        if self.static_masking and not 0.0 < self.masked_lm_prob < 1.0:
            raise UserError(f"--masked_lm_prob={self.masked_lm_prob} must be in (0, 1)")
        if self.static_masking and self.max_predictions_per_seq < 1:
            raise UserError(f"--max_predictions_per_seq={self.max_predictions_per_seq} "
                            "must be >= 1")
        if self.chunk_documents < 2:
            raise UserError(f"chunk_documents={self.chunk_documents} must be >= 2")


def truncate_seq_pair(tokens_a: list, tokens_b: list, max_num_tokens: int,
                      rng: random.Random) -> bool:
    """Trims the longer list (ties: B) one token at a time from a random end, in place.

    Same random draws as google-research/bert's loop, but it moves span bounds and slices
    once instead of deleting from the front of a list token by token.

    Returns:
      True if anything was removed.
    """
    spans = [[0, len(tokens_a)], [0, len(tokens_b)]]  # [start, end) kept of A and of B.
    length = [len(tokens_a), len(tokens_b)]
    if sum(length) <= max_num_tokens:
        return False
    while length[0] + length[1] > max_num_tokens:
        side = 0 if length[0] > length[1] else 1
        # Removing from the front or the back at random adds noise, as google-research/bert.
        if rng.random() < 0.5:
            spans[side][0] += 1  # Drop the first kept token.
        else:
            spans[side][1] -= 1  # Drop the last kept token.
        length[side] -= 1
    tokens_a[:] = tokens_a[spans[0][0]:spans[0][1]]
    tokens_b[:] = tokens_b[spans[1][0]:spans[1][1]]
    return True


def _random_document(pool: list, current: int, rng: random.Random) -> list:
    """A document of `pool` other than `pool[current]` (10 tries, as google-research/bert)."""
    for _ in range(10):
        index = rng.randint(0, len(pool) - 1)
        if index != current:
            break
    return pool[index]


def create_instances_from_document(pool: list, doc_index: int, config: PretrainingDataConfig,
                                   rng: random.Random) -> list[Instance]:
    """google-research/bert's `create_instances_from_document` over token ids.

    Args:
      pool: documents, each a list of sentences, lists of ids (`tokenize_documents(...,
        as_lists=True)`); random-next sentences come from here.
      doc_index: index in `pool` of the document to cut into examples.
      config: lengths and probabilities.
      rng: the writer's random generator.

    Returns:
      Instances whose token lists are plain Python lists of ids (no [CLS]/[SEP]).
    """
    document = pool[doc_index]
    max_num_tokens = config.max_seq_length - 3  # [CLS], [SEP], [SEP].
    target_seq_length = max_num_tokens
    if rng.random() < config.short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances, chunk, chunk_length, i = [], [], 0, 0
    while i < len(document):
        chunk.append(document[i])
        chunk_length += len(document[i])
        if i == len(document) - 1 or chunk_length >= target_seq_length:
            is_random_next = rng.random() < 0.5
            if len(chunk) == 1 and not is_random_next:
                # google-research/bert forces a random B for a one-sentence chunk, which skews
                # labels to ~60 % random on long-sentence text; take the true next sentence.
                if i == len(document) - 1:
                    is_random_next = True  # No next sentence in this document.
                else:
                    i += 1
                    chunk.append(document[i])
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            tokens_a = list(itertools.chain.from_iterable(chunk[:a_end]))
            if is_random_next:
                tokens_b = []
                other = _random_document(pool, doc_index, rng)
                for sentence in other[rng.randint(0, len(other) - 1):]:
                    tokens_b.extend(sentence)
                    if len(tokens_b) >= target_seq_length - len(tokens_a):
                        break
                i -= len(chunk) - a_end  # Put the unused sentences back.
            else:
                tokens_b = list(itertools.chain.from_iterable(chunk[a_end:]))
            truncated = truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
            if tokens_a and tokens_b:
                instances.append(Instance(tokens_a, tokens_b, is_random_next, truncated))
            chunk, chunk_length = [], 0
        i += 1
    return instances


_ONE_F32, _ZERO_F32 = struct.pack("<f", 1.0), struct.pack("<f", 0.0)
_WEIGHTS = next(g for g, o in features.GOOGLE_BERT_NAMES.items()
                if o == features.MASKED_LM_WEIGHTS)


def instance_to_record(instance: Instance, tokenizer: Tokenizer, config: PretrainingDataConfig,
                       rng: random.Random, vocab: masking.MaskingVocab) -> bytes:
    """Packs `[CLS] A [SEP] B [SEP]`, pads to `max_seq_length`, optionally masks statically.

    Returns:
      The serialized `tf.train.Example`: the bytes of protobuf's deterministic serialization
      (feature names in order), written directly (token ids are varints from a table).
    """
    table = varint_table(vocab.vocab_size)
    ids = [tokenizer.cls_id, *instance.tokens_a, tokenizer.sep_id]
    len_a = len(ids)
    ids += instance.tokens_b
    ids.append(tokenizer.sep_id)
    length, used = config.max_seq_length, len(ids)
    padding = length - used
    feats = {
        features.INPUT_MASK: int64_feature(b"\x01" * used + b"\x00" * padding),
        features.INPUT_TYPE_IDS: int64_feature(
            b"\x00" * len_a + b"\x01" * (used - len_a) + b"\x00" * padding),
        features.NEXT_SENTENCE_LABELS: int64_feature(table[int(instance.is_random_next)])}
    if config.static_masking:
        p = config.max_predictions_per_seq
        ids, positions, labels = masking.static_mask_list(
            ids, rng, vocab=vocab, max_predictions_per_seq=p,
            masked_lm_prob=config.masked_lm_prob, whole_word=config.whole_word_masking)
        unused = p - len(positions)
        feats[features.MASKED_LM_POSITIONS] = int64_feature(
            b"".join([table[i] for i in positions]) + b"\x00" * unused)
        feats[features.MASKED_LM_IDS] = int64_feature(
            b"".join([table[i] for i in labels]) + b"\x00" * unused)
    feats[features.INPUT_WORD_IDS] = int64_feature(
        b"".join([table[i] for i in ids]) + table[tokenizer.pad_id] * padding)
    if not config.static_masking:
        return example_bytes(feats)
    feats[features.MASKED_LM_WEIGHTS] = float_feature(_ONE_F32 * len(positions)
                                                      + _ZERO_F32 * unused)
    return example_bytes({google: feats[ours]
                          for google, ours in features.GOOGLE_BERT_NAMES.items()})


def instance_to_example(instance: Instance, tokenizer: Tokenizer, config: PretrainingDataConfig,
                        rng: random.Random, vocab: masking.MaskingVocab) -> tf.train.Example:
    """`instance_to_record`'s example as a `tf.train.Example`."""
    return tf.train.Example.FromString(instance_to_record(instance, tokenizer, config, rng,
                                                          vocab))


def _process_chunk(docs, config, rng, tokenizer, vocab, stats) -> list[bytes]:
    """The serialized examples of one chunk of tokenized documents, shuffled."""
    instances = []
    for _ in range(config.dupe_factor):
        for index in range(len(docs)):
            # Random-next candidates: the other documents of this chunk.
            instances.extend(create_instances_from_document(docs, index, config, rng))
    rng.shuffle(instances)
    records = []
    for instance in instances:
        # Feature names in order (what protobuf's deterministic serialization writes).
        records.append(instance_to_record(instance, tokenizer, config, rng, vocab))
        stats["tokens"] += len(instance.tokens_a) + len(instance.tokens_b) + 3
        stats["truncated"] += int(instance.truncated)
        stats["random_next"] += int(instance.is_random_next)
    stats["examples"] += len(instances)
    return records


def worker_state(vocab_file: str, lower_case: bool, config: PretrainingDataConfig) -> tuple:
    """What a worker needs to make examples: (config, tokenizer, masking vocabulary)."""
    tokenizer = Tokenizer(vocab_file, lower_case=lower_case)
    return config, tokenizer, masking.MaskingVocab.from_tokenizer(tokenizer)


def make_chunk(state: tuple, chunk: tuple) -> tuple[list[bytes], collections.Counter]:
    """The serialized examples of one chunk and its counts.

    Args:
      state: from `worker_state`.
      chunk: (chunk index, documents as lists of sentence strings).

    Returns:
      (serialized `tf.train.Example`s in output order, Counter of documents, sentences,
      corpus_tokens, examples, tokens, truncated, random_next).
    """
    config, tokenizer, vocab = state
    index, documents = chunk
    docs = tokenize_documents(documents, tokenizer, as_lists=True)
    stats = chunk_stats(docs)
    records = _process_chunk(docs, config, chunk_rng(config.seed, index), tokenizer, vocab,
                             stats)
    return records, stats


def create_pretraining_data(inputs, vocab_file: str, output: str,
                            config: PretrainingDataConfig = PretrainingDataConfig(),
                            options: CorpusOptions | None = None, progress=sys.stderr,
                            **fields) -> dict:
    """Writes pretraining TFRecords and a JSON summary next to them.

    Args:
      inputs: text files: comma list / globs (see `text_corpus.expand_inputs`), or a
        `tfds_sources.TfdsText` dataset.
      vocab_file: the WordPiece `vocab.txt`.
      output: shard pattern with one `*`, e.g. `DIR/train-*.tfrecord`; `*` becomes
        `SSSSS-of-NNNNN` and the summary goes to `DIR/train-summary.json`.
      config: see `PretrainingDataConfig`.
      options: how the text is read and the shards written (see `CorpusOptions`; None:
        the defaults).
      progress: stream for progress lines, or None.
      **fields: or, without `options`, its fields as keyword arguments.

    Returns:
      The summary dict (also written as JSON).
    """
    options = corpus_options(options, **fields)
    config.validate()
    run = pretraining_run.start_run(inputs, vocab_file, output, options, progress)

    def summarize(shards):
        if not run.stats["examples"]:
            raise UserError(f"--input={inputs} produced no examples ({run.stats['documents']} "
                            "documents); it needs text with at least two sentences")
        return _summary(run, shards, config, vocab_file)

    if run.runner != beam.LOCAL:
        from bert_trainer.data.beam import pipeline  # noqa: PLC0415 (an optional extra)

        return pretraining_run.publish_shard_set(run, pipeline.masked_lm(
            run, config, vocab_file, make_chunk=make_chunk, worker_state=worker_state),
            summarize)

    def write(writer):
        with run.map_chunks(make_chunk, worker_state, (vocab_file, options.lower_case, config),
                            config.chunk_documents) as results:
            for records, counts in results:
                for record in records:
                    writer.write(record)
                run.count(counts)

    return pretraining_run.write_shard_set(run, write, summarize)


def _summary(run: pretraining_run.Run, shards: list[str], config: PretrainingDataConfig,
             vocab_file: str) -> dict:
    """The summary of a masked-LM run, written as JSON next to its shards.

    Args:
      run: the run; its `stats` Counter (documents, sentences, corpus_tokens, examples,
        tokens, truncated, random_next, bad_utf8_lines) must have `examples` > 0.
      shards: the shard paths written.
      config: the `PretrainingDataConfig` used.
      vocab_file: the tokenizer's vocabulary.

    Returns:
      The summary dict.
    """
    stats = run.stats
    return run.summary({
        "documents": stats["documents"], "sentences": stats["sentences"],
        "corpus_tokens": stats["corpus_tokens"], "examples": stats["examples"],
        "tokens": stats["tokens"], "shards": [os.path.basename(s) for s in shards],
        "fraction_truncated": stats["truncated"] / stats["examples"],
        "fraction_random_next": stats["random_next"] / stats["examples"],
    }, vocab_file, "google-research/bert" if config.static_masking else "bert_trainer", config)
