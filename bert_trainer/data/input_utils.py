"""Shared `tf.data` plumbing for the fine-tuning pipelines: shard, shuffle, batch, prefetch.

Every fine-tuning builder (classification, SQuAD, tagging) ends in `batch_pipeline`, so they
all shard the same way under `tf.distribute`, batch per replica, shuffle and repeat only for
training, drop the remainder only for training and honour one deterministic mode.

Sharding is per *example* (`Dataset.shard` on the raw examples, before tokenization), not per
file: fine-tuning sets are one or a few files (a TFDS split of GLUE is often a single shard),
so file-level sharding would leave input pipelines empty. Reading every example in every
pipeline and keeping one in N costs only the cheap read, never the tokenization.
"""

import dataclasses

import tensorflow as tf

from bert_trainer.data import length_buckets as buckets_lib
from bert_trainer.errors import UserError

AUTOTUNE = tf.data.AUTOTUNE
DEFAULT_SHUFFLE_BUFFER = 10_000
DEFAULT_SEED = 1234  # Used by deterministic mode when no seed is given.


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
    """How an input pipeline batches, shuffles and orders its examples: the one object every
    family's data builder takes (`options=`), made by the task
    (`FinetuningTask.pipeline_options`, the pretraining tasks' `build_inputs`).

    Attributes:
      batch_size: per-replica batch size (see `per_replica_batch_size`).
      is_training: shuffle, repeat forever and drop the last partial batch so every step has
        a static batch size; evaluation reads each example once, in order, keeping the
        remainder.
      input_context: `tf.distribute.InputContext` (shards the data over input pipelines), or
        None.
      shuffle_buffer: examples held by the shuffle buffer (training only).
      seed: shuffle seed (each builder says what None means).
      deterministic: fixed element order and seeded shuffling (reproducible runs).
      length_buckets: cut batches to the smallest of at most this many widths chosen from the
        data that holds their longest example; 0 or 1: every batch keeps the full length.
      group_by_length: training batches hold examples of one width (fewer padded slots; but
        where the length says something of the label, batches of one class).
    """

    batch_size: int
    is_training: bool = True
    input_context: object = None
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER
    seed: int | None = None
    deterministic: bool = False
    length_buckets: int = 0
    group_by_length: bool = False

    def __post_init__(self):
        if self.batch_size < 1:
            raise UserError(f"batch size {self.batch_size} must be >= 1")
        if self.shuffle_buffer < 1:
            raise UserError(f"shuffle buffer {self.shuffle_buffer} must be >= 1")

    # Also a read-only mapping of its fields (`options["seed"]`, `**options`), as
    # `FinetuningTask.pipeline_options` returned a dict before: a plugin family's
    # `build_inputs` written against that keeps working.
    def keys(self):
        return [field.name for field in dataclasses.fields(self)]

    def __getitem__(self, name: str):
        if name not in self.keys():
            raise KeyError(name)
        return getattr(self, name)


def pipeline_options(options: PipelineOptions | None = None, **fields) -> PipelineOptions:
    """`options`, or the `PipelineOptions` of `fields` given as keyword arguments instead.

    Raises:
      TypeError: both, or a field `PipelineOptions` has not.
    """
    if options is None:
        return PipelineOptions(**fields)
    if fields:
        raise TypeError(f"pass options= or its fields, not both ({sorted(fields)})")
    return options


def per_replica_batch_size(global_batch_size: int, input_context=None) -> int:
    """Batch size of one replica.

    Args:
      global_batch_size: examples per step summed over all replicas.
      input_context: a `tf.distribute.InputContext`, or None for a single replica.

    Returns:
      `global_batch_size / num_replicas_in_sync`.

    Raises:
      UserError: the global batch does not divide evenly among the replicas.
    """
    if global_batch_size < 1:
        raise UserError(f"batch size {global_batch_size} must be >= 1")
    if input_context is None:
        return global_batch_size
    replicas = input_context.num_replicas_in_sync
    if global_batch_size % replicas:
        raise UserError(f"global batch size {global_batch_size} does not divide among {replicas} "
                        f"replicas; use a multiple of {replicas}")
    return global_batch_size // replicas


def shard(dataset: tf.data.Dataset, input_context=None) -> tf.data.Dataset:
    """Keeps this input pipeline's share of the examples (disjoint across pipelines).

    Args:
      dataset: unbatched examples.
      input_context: `tf.distribute.InputContext` or None (no sharding).

    Returns:
      Every `num_input_pipelines`-th example, starting at `input_pipeline_id`.
    """
    if input_context is None or input_context.num_input_pipelines <= 1:
        return dataset
    return dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)


def dataset_options(deterministic: bool) -> tf.data.Options:
    """`tf.data.Options` for deterministic or fastest element order.

    Args:
      deterministic: keep element order fixed (parallel maps then wait for stragglers).

    Returns:
      The options to apply with `Dataset.with_options`.
    """
    options = tf.data.Options()
    options.deterministic = deterministic
    # Raw examples of a fine-tuning set come from one source; auto-sharding by file under
    # MultiWorkerMirroredStrategy would be wrong on top of our own `shard`, so turn it off.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return options


def batch_pipeline(examples: tf.data.Dataset, featurize=None,
                   options: PipelineOptions | None = None, *, ragged: bool = False,
                   **fields) -> tf.data.Dataset:
    """shard → (shuffle → repeat when training) → batch → featurize → (bucket) → prefetch.

    Featurizing after batching lets tokenization run once per batch (vectorized), which is
    several times faster than a per-example map. With `length_buckets`, every batch is then
    cut to a width that holds its longest example (`bert_trainer.data.length_buckets`), and
    with `group_by_length` training batches are regrouped to hold examples of one width.

    Args:
      examples: unbatched examples (dicts of tensors).
      featurize: function from a batch of examples to a dict of features, or None.
      options: the `PipelineOptions` (or their fields as keyword arguments); the evaluation
        is always deterministic, and deterministic mode seeds with `DEFAULT_SEED` when the
        seed is None.
      ragged: batch with `ragged_batch` (examples of different lengths, e.g. word lists).

    Returns:
      Batched, prefetched `tf.data.Dataset`.
    """
    o = pipeline_options(options, **fields)
    batch_size, is_training, seed = o.batch_size, o.is_training, o.seed
    if o.deterministic and seed is None:
        seed = DEFAULT_SEED
    # Evaluation output is matched to its examples by position: keep the order.
    deterministic = o.deterministic or not is_training
    grouped = is_training and o.group_by_length
    buckets = buckets_lib.sample_buckets(
        examples, featurize, ragged=ragged, max_buckets=o.length_buckets,
        batch_size=None if grouped else batch_size, shuffled=is_training,
        what="training" if is_training else "evaluation")
    ds = shard(examples, o.input_context)
    if is_training:
        ds = ds.shuffle(o.shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
    if ragged:
        ds = ds.ragged_batch(batch_size, drop_remainder=is_training)
    else:
        ds = ds.batch(batch_size, drop_remainder=is_training)
    if featurize is not None:
        ds = ds.map(featurize, num_parallel_calls=AUTOTUNE, deterministic=deterministic)
    if buckets is not None and grouped:
        ds = buckets_lib.bucketed_batches(ds.unbatch(), buckets, batch_size)
    elif buckets is not None:
        ds = ds.map(buckets.cut, num_parallel_calls=AUTOTUNE, deterministic=True)
    if is_training:
        # tensorflow-text ops lose the static batch size; restore it for XLA / TPU.
        ds = ds.map(lambda batch: tf.nest.map_structure(
            lambda t: tf.ensure_shape(t, [batch_size] + t.shape[1:]), batch))
    return ds.prefetch(AUTOTUNE).with_options(dataset_options(deterministic))
