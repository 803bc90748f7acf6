"""Sentence-pair input pipeline for translation, tokenized in graph with one joint vocabulary.

Raw pairs {"source", "target"} (`TaskData.load`) are batched, then tokenized and packed as a
batch (BERT2BERT's convention, Rothe et al. 2020):

- the source as the encoder inputs `[CLS] source [SEP]` (input_type_ids all 0), its pieces
  cut to `seq_length - 2`;
- the target as `[CLS] target [SEP]` split in two, each `max_target_length` wide:
  `decoder_input_ids` = `[CLS] target` (what the decoder reads, teacher forcing) and
  `target_ids` = `target [SEP]` (what it must predict), 0-padded (0: no loss); the target
  keeps at most `max_target_length - 1` pieces.

Length bucketing (`data/length_buckets.py`'s widths, chosen from the data): source and target
lengths differ, so each side gets its own widths and every batch is cut to the smallest
source width that holds its longest source and the smallest target width that holds its
longest target. Short pairs then do not pay for long ones; with `group_by_length`, training
batches are also drawn from one source-length bucket.
"""

import dataclasses

import numpy as np
import tensorflow as tf
from absl import logging

from bert_trainer import features
from bert_trainer.data import input_utils
from bert_trainer.data import length_buckets as buckets_lib

SOURCE, TARGET = "source", "target"
EXAMPLE_INDEX = "example_index"  # int32 [batch]: the pair's position in its split
CUT = "cut"  # int32 [batch]: 1 when the pair's source or target was cut to fit (counted)
DECODER_FEATURES = (features.DECODER_INPUT_IDS, features.TARGET_IDS)


def source_features(tokenizer, source, seq_length: int) -> dict:
    """Encoder inputs `[CLS] source [SEP]` of a batch of source texts.

    Args:
      tokenizer: a `bert_trainer.data.tokenizer.Tokenizer`.
      source: string [batch].
      seq_length: packed length; longer sources keep their first `seq_length - 2` pieces.

    Returns:
      features.ENCODER_INPUTS int32 [batch, seq_length].
    """
    return tokenizer.pack([tokenizer.tokenize(source)], seq_length)


def source_cut(pieces, seq_length: int) -> tf.Tensor:
    """bool [batch]: which tokenized sources (ragged [batch, (pieces)]) `[CLS] source [SEP]`
    cuts to `seq_length`."""
    return pieces.row_lengths() > seq_length - 2


def target_features(tokenizer, target, max_target_length: int) -> dict:
    """Teacher-forcing decoder inputs and targets of a batch of target texts.

    Args:
      tokenizer: the (joint) `Tokenizer`.
      target: string [batch].
      max_target_length: width of both outputs; a target keeps its first
        `max_target_length - 1` pieces.

    Returns:
      features.DECODER_INPUT_IDS (`[CLS] target`) and features.TARGET_IDS (`target [SEP]`),
      int32 [batch, max_target_length], 0-padded.
    """
    return _target_from_pieces(tokenizer, tokenizer.tokenize(target), max_target_length)


def _target_from_pieces(tokenizer, pieces, max_target_length: int) -> dict:
    pieces = tf.cast(pieces[:, :max_target_length - 1], tf.int32)
    rows = pieces.nrows()
    cls = tf.fill([rows, 1], tf.constant(tokenizer.cls_id, tf.int32))
    sep = tf.fill([rows, 1], tf.constant(tokenizer.sep_id, tf.int32))
    shape = [None, max_target_length]
    inputs = tf.concat([tf.RaggedTensor.from_tensor(cls), pieces], axis=1)
    targets = tf.concat([pieces, tf.RaggedTensor.from_tensor(sep)], axis=1)
    return {features.DECODER_INPUT_IDS: inputs.to_tensor(0, shape=shape),
            features.TARGET_IDS: targets.to_tensor(0, shape=shape)}


def pair_features(tokenizer, batch: dict, seq_length: int, max_target_length: int) -> dict:
    """`source_features` and `target_features` of a batch of raw pairs, CUT (which pairs lost
    pieces: the task counts them) and EXAMPLE_INDEX when the batch has it."""
    source, target = tokenizer.tokenize(batch[SOURCE]), tokenizer.tokenize(batch[TARGET])
    out = tokenizer.pack([source], seq_length)
    out.update(_target_from_pieces(tokenizer, target, max_target_length))
    out[CUT] = tf.cast(source_cut(source, seq_length)
                       | (target.row_lengths() > max_target_length - 1), tf.int32)
    if EXAMPLE_INDEX in batch:
        out[EXAMPLE_INDEX] = tf.cast(batch[EXAMPLE_INDEX], tf.int32)
    return out


def target_lengths(batch: dict) -> tf.Tensor:
    """int32 [batch]: the target tokens of each pair (its `target_ids` that are not 0)."""
    return tf.reduce_sum(tf.cast(batch[features.TARGET_IDS] != 0, tf.int32), axis=-1)


@dataclasses.dataclass(frozen=True)
class PairBuckets:
    """Source and target widths that batches are cut to.

    Attributes:
      source, target: `length_buckets.LengthBuckets` of each side.
    """

    source: buckets_lib.LengthBuckets
    target: buckets_lib.LengthBuckets

    def cut(self, batch: dict) -> dict:
        """A batch with the encoder inputs and the decoder features cut to their widths."""
        width = self.source.width(buckets_lib.example_lengths(batch))
        target_width = self.target.width(target_lengths(batch))
        return {k: v[:, :target_width] if k in DECODER_FEATURES
                else v[:, :width] if k in features.ENCODER_INPUTS else v
                for k, v in batch.items()}


def sample_pair_buckets(raw: tf.data.Dataset, featurize, *, max_buckets: int,
                        batch_size: int, shuffled: bool) -> PairBuckets | None:
    """The `PairBuckets` of a split from its first `length_buckets.SAMPLE_EXAMPLES` pairs.

    Args:
      raw: unbatched raw pairs (before sharding: every worker samples the same ones).
      featurize: the pipeline's batch → features function.
      max_buckets: widths per side; <= 1 turns bucketing off.
      batch_size: batches of this many pairs are cut (their longest pair decides).
      shuffled: batches are drawn in random order (training).

    Returns:
      The buckets, or None when off or the split is empty.
    """
    if max_buckets <= 1:
        return None
    lengths = {"source": [], "target": []}
    widths = {}
    for batch in raw.take(buckets_lib.SAMPLE_EXAMPLES).batch(256).map(featurize):
        lengths["source"].append(buckets_lib.example_lengths(batch).numpy())
        lengths["target"].append(target_lengths(batch).numpy())
        widths = {"source": int(batch[features.INPUT_MASK].shape[1]),
                  "target": int(batch[features.TARGET_IDS].shape[1])}
    if not widths:
        return None
    chosen = {}
    for side in ("source", "target"):
        values = np.concatenate(lengths[side])
        if batch_size > 1:
            order = np.random.default_rng(0).permutation(values) if shuffled else values
            whole = max(1, len(order) // batch_size) * batch_size
            values = np.resize(order, whole).reshape(-1, batch_size).max(axis=1)
        chosen[side] = buckets_lib.LengthBuckets(
            buckets_lib.choose_boundaries(values, widths[side], max_buckets))
    logging.info("Length buckets (translate): source widths %s, target widths %s",
                 list(chosen["source"].boundaries), list(chosen["target"].boundaries))
    return PairBuckets(**chosen)


def _grouped(examples: tf.data.Dataset, buckets: PairBuckets, batch_size: int):
    """Training batches of pairs of one source bucket each (an endless shuffled stream)."""
    edges = [b + 1 for b in buckets.source.boundaries[:-1]]
    return examples.bucket_by_sequence_length(
        lambda x: tf.reduce_sum(tf.cast(x[features.INPUT_MASK] != 0, tf.int32)),
        bucket_boundaries=edges, bucket_batch_sizes=[batch_size] * (len(edges) + 1),
        no_padding=True, drop_remainder=True)


def translate_dataset(raw: tf.data.Dataset, tokenizer, *, seq_length: int,
                      max_target_length: int,
                      options: input_utils.PipelineOptions | None = None,
                      **fields) -> tf.data.Dataset:
    """Batches of a translation task.

    Args:
      raw: unbatched raw pairs {"source", "target"} from `TaskData.load`.
      tokenizer: the joint `Tokenizer` of source and target.
      seq_length: encoder (source) length.
      max_target_length: decoder (target) length.
      options: the `input_utils.PipelineOptions` (or their fields as keyword arguments:
        batch_size, is_training, ...); see `input_utils.batch_pipeline`.

    Returns:
      Dataset of dicts: ENCODER_INPUTS int32 [batch, <= seq_length], DECODER_INPUT_IDS and
      TARGET_IDS int32 [batch, <= max_target_length]; evaluation batches also carry
      EXAMPLE_INDEX int32 [batch] (the pair's position in the split, for its reference text).
    """
    options = input_utils.pipeline_options(options, **fields)
    batch_size, is_training, seed = options.batch_size, options.is_training, options.seed
    if options.deterministic and seed is None:
        seed = input_utils.DEFAULT_SEED
    deterministic = options.deterministic or not is_training

    def featurize(batch):
        return pair_features(tokenizer, batch, seq_length, max_target_length)

    grouped = is_training and options.group_by_length
    buckets = sample_pair_buckets(raw, featurize, max_buckets=options.length_buckets,
                                  batch_size=1 if grouped else batch_size, shuffled=is_training)
    if not is_training:
        raw = raw.enumerate().map(lambda i, pair: {**pair, EXAMPLE_INDEX: i})
    ds = input_utils.shard(raw, options.input_context)
    if is_training:
        ds = ds.shuffle(options.shuffle_buffer, seed=seed,
                        reshuffle_each_iteration=True).repeat()
    ds = ds.batch(batch_size, drop_remainder=is_training)
    ds = ds.map(featurize, num_parallel_calls=input_utils.AUTOTUNE, deterministic=deterministic)
    if buckets is not None and grouped:
        ds = _grouped(ds.unbatch(), buckets, batch_size)
    if buckets is not None:
        ds = ds.map(buckets.cut, num_parallel_calls=input_utils.AUTOTUNE, deterministic=True)
    if is_training:
        # tensorflow-text ops lose the static batch size; restore it for XLA / TPU.
        ds = ds.map(lambda batch: tf.nest.map_structure(
            lambda t: tf.ensure_shape(t, [batch_size] + t.shape[1:]), batch))
    return ds.prefetch(input_utils.AUTOTUNE).with_options(
        input_utils.dataset_options(deterministic))
