"""Length bucketing: batches of similar-length examples, cut to a few fixed widths.

Fine-tuning examples are short next to the model's sequence length (SST-2 sentences average
about 25 word pieces; the recipe pads them to 128), so a batch padded to `seq_length` spends most
of its compute on padding. Here every batch is cut to the smallest of a few widths (the bucket
boundaries) that holds its longest example:

- by default batches keep their order (the seeded shuffle's in training; evaluation outputs are
  matched to examples by position), each cut to the smallest boundary that holds its longest
  example. Where the fused CPU kernels run, the encoder then also skips the padding left
  inside a batch (token packing), so little is computed in vain;
- with `group_by_length`, training draws each batch from one length bucket (`tf.data`'s
  `bucket_by_sequence_length` over the seeded, shuffled stream): fewer padded slots, for
  hardware that computes them, at a price: where length correlates with the label (it does
  in some datasets), batches hold mostly one class.

Boundaries come from the data: the first `SAMPLE_EXAMPLES` examples (the same on every worker,
so all agree) are drawn into batches as the pipeline draws them, and the widths, multiples of
`MULTIPLE` with `seq_length` last, are those that pad these batches least. A run sees no
other widths, so a compiled step is traced (or XLA-compiled) at most once per boundary. Nothing
else changes: the values at the real tokens are those of the padded batch, because attention
never looks at padding.
"""

import dataclasses

import numpy as np
import tensorflow as tf
from absl import logging

from bert_trainer import features

SAMPLE_EXAMPLES = 2048  # examples whose lengths choose the boundaries
MULTIPLE = 8  # boundaries are multiples of this (aligned rows for the matrix kernels)


@dataclasses.dataclass(frozen=True)
class LengthBuckets:
    """The widths batches are cut to.

    Attributes:
      boundaries: ascending widths; the last is the full sequence length.
    """

    boundaries: tuple[int, ...]

    @property
    def seq_length(self) -> int:
        return self.boundaries[-1]

    def width(self, lengths: tf.Tensor) -> tf.Tensor:
        """int32 scalar: the smallest boundary >= the longest of `lengths` (int [batch])."""
        bounds = tf.constant(self.boundaries, tf.int32)
        longest = tf.reduce_max(tf.concat([tf.cast(lengths, tf.int32), [1]], 0))
        index = tf.searchsorted(bounds, longest[None], side="left")[0]
        return bounds[tf.minimum(index, len(self.boundaries) - 1)]

    def cut(self, batch: dict) -> dict:
        """A batch with every sequence feature ([batch, seq_length, ...]) cut to `width`."""
        width = self.width(example_lengths(batch))
        return {k: v[:, :width] if _is_sequence(v, self.seq_length) else v
                for k, v in batch.items()}


def example_lengths(batch: dict) -> tf.Tensor:
    """int32 [batch]: the real tokens of each example (its input mask's sum)."""
    return tf.reduce_sum(tf.cast(batch[features.INPUT_MASK] != 0, tf.int32), axis=-1)


def _is_sequence(tensor: tf.Tensor, seq_length: int) -> bool:
    return tensor.shape.rank >= 2 and tensor.shape[1] == seq_length


def choose_boundaries(lengths, seq_length: int, max_buckets: int) -> tuple[int, ...]:
    """Bucket widths for examples of these lengths: the fewest padded slots.

    Args:
      lengths: real-token counts of a sample of the examples.
      seq_length: the longest width (examples never exceed it).
      max_buckets: at most this many widths.

    Returns:
      Ascending widths, multiples of `MULTIPLE` (but the last, `seq_length`, always there):
      of every such choice, the one that pads the sample least (dynamic programming over the
      length histogram).
    """
    lengths = np.asarray(lengths, np.int64)
    if max_buckets <= 1 or lengths.size == 0:
        return (seq_length,)
    candidates = sorted({*range(MULTIPLE, seq_length, MULTIPLE), seq_length})
    held = [int(np.sum(lengths <= c)) for c in candidates]  # examples width c holds
    n, inf = len(candidates), float("inf")
    # best[k][j]: fewest slots for the examples <= candidates[j] with k + 1 widths, the
    # largest candidates[j]; before[k][j]: the index of the width below it (-1: none).
    best = [[inf] * n for _ in range(max_buckets)]
    before = [[-1] * n for _ in range(max_buckets)]
    best[0] = [held[j] * candidates[j] for j in range(n)]
    for k in range(1, max_buckets):
        for j in range(n):
            for i in range(j):
                cost = best[k - 1][i] + (held[j] - held[i]) * candidates[j]
                if cost < best[k][j]:
                    best[k][j], before[k][j] = cost, i
    k = int(np.argmin([row[n - 1] for row in best]))
    widths, j = [], n - 1
    while j >= 0:
        widths.append(candidates[j])
        j, k = before[k][j], k - 1
    return tuple(sorted(widths))


def sample_buckets(examples: tf.data.Dataset, featurize, *, ragged: bool, max_buckets: int,
                   batch_size: int | None, shuffled: bool, what: str) -> LengthBuckets | None:
    """The `LengthBuckets` of a split, from the lengths of its first `SAMPLE_EXAMPLES` examples.

    Args:
      examples: unbatched examples (before sharding: every worker samples the same ones).
      featurize: the pipeline's batch → features function (None: examples are features).
      ragged: batch the raw examples with `ragged_batch` (as the pipeline does).
      max_buckets: at most this many widths; <= 1 turns bucketing off.
      batch_size: the widths are cut for batches of this many examples (their longest one
        decides), drawn from the sample as the pipeline draws them; None: for each example
        alone (batches grouped by length).
      shuffled: the pipeline's batches are drawn in random order (training), not in order.
      what: names the split in the log line.

    Returns:
      The buckets, or None when bucketing is off or the examples have no input mask.
    """
    if max_buckets <= 1:
        return None
    sample = examples.take(SAMPLE_EXAMPLES)
    sample = sample.ragged_batch(256) if ragged else sample.batch(256)
    if featurize is not None:
        sample = sample.map(featurize)
    lengths, seq_length = [], None
    for batch in sample:
        if features.INPUT_MASK not in batch:
            return None
        seq_length = int(batch[features.INPUT_MASK].shape[1])
        lengths.append(example_lengths(batch).numpy())
    if seq_length is None:  # an empty split
        return None
    lengths = np.concatenate(lengths)
    longest = lengths  # what decides each cut: an example, or the longest of a batch
    if batch_size is not None and batch_size > 1:
        order = np.random.default_rng(0).permutation(lengths) if shuffled else lengths
        whole = max(1, len(order) // batch_size) * batch_size
        longest = np.resize(order, whole).reshape(-1, batch_size).max(axis=1)
    buckets = LengthBuckets(choose_boundaries(longest, seq_length, max_buckets))
    cut = np.asarray(buckets.boundaries)[np.searchsorted(buckets.boundaries, longest)]
    logging.info("Length buckets (%s): widths %s from %d examples (mean %.1f tokens); at most "
                 "%d batch shapes; mean width %.1f instead of %d", what,
                 list(buckets.boundaries), lengths.size, lengths.mean(),
                 len(buckets.boundaries), cut.mean(), seq_length)
    return buckets


def bucketed_batches(examples: tf.data.Dataset, buckets: LengthBuckets, batch_size: int
                     ) -> tf.data.Dataset:
    """Training batches of `batch_size` examples of one bucket each, cut to its width.

    Args:
      examples: unbatched feature dicts, every sequence feature `seq_length` wide; an endless,
        shuffled stream (the remainder of a bucket is never emitted).
      buckets: the widths.
      batch_size: examples per batch.

    Returns:
      Batches; their order depends only on the input order (deterministic).
    """
    # bucket_by_sequence_length's bucket i holds lengths in [edges[i-1], edges[i]): boundary b
    # holds lengths <= b.
    edges = [b + 1 for b in buckets.boundaries[:-1]]
    batches = examples.bucket_by_sequence_length(
        lambda x: tf.reduce_sum(tf.cast(x[features.INPUT_MASK] != 0, tf.int32)),
        bucket_boundaries=edges, bucket_batch_sizes=[batch_size] * (len(edges) + 1),
        no_padding=True, drop_remainder=True)
    return batches.map(buckets.cut)


def pad_to_width(tensor: tf.Tensor, width: int, value=0) -> tf.Tensor:
    """`tensor` [batch, w, ...] padded with `value` at the end of axis 1 to `width` (>= w).

    Evaluation outputs per token come in the width of their batch; padded back to the full
    sequence length they concatenate over batches.
    """
    tensor = tf.convert_to_tensor(tensor)
    if tensor.dtype == tf.bool:  # tf.pad takes numbers only
        return tf.cast(pad_to_width(tf.cast(tensor, tf.int32), width, int(value)), tf.bool)
    pad = width - tf.shape(tensor)[1]
    paddings = [[0, 0], [0, pad]] + [[0, 0]] * (tensor.shape.rank - 2)
    padded = tf.pad(tensor, paddings, constant_values=tf.cast(value, tensor.dtype))
    return tf.ensure_shape(padded, [tensor.shape[0], width, *tensor.shape[2:]])
