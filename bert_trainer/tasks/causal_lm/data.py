"""Causal-LM input pipeline: block TFRecords -> shuffled, batched `input_word_ids`.

Reads what `create_pretraining_data --objective=causal_lm` writes (`corpus.py`):
one feature, `input_word_ids` int64 [block_size], every token real. File sharding over input
pipelines and the seeded shuffle are `data.record_files.record_dataset`'s (as the masked LM's),
so the order is the same in every run and a resumed run skips to exactly where it stopped.
"""

import random

import tensorflow as tf

from bert_trainer import features
from bert_trainer.data import input_utils, record_files
from bert_trainer.errors import UserError

_MAKE_IT = "make it with 'bert-train create_pretraining_data --objective=causal_lm'"


def check_records(path: str, block_size: int) -> None:
    """Checks that `path` holds causal-LM blocks of `block_size` tokens.

    Raises:
      UserError: not TFRecords of tf.train.Example, masked-LM examples (or anything else
        than blocks), or blocks of another length.
    """
    lengths = record_files.inspect_records(path)
    if set(lengths) != {features.INPUT_WORD_IDS}:
        kind = ("masked-LM examples" if features.INPUT_MASK in lengths or "input_ids" in lengths
                else f"features {sorted(lengths)}")
        raise UserError(f"{path} holds {kind}, not causal-LM blocks; {_MAKE_IT}")
    n = lengths[features.INPUT_WORD_IDS]
    if n != block_size:
        raise UserError(f"{path} has blocks of {n} tokens but CausalLMConfig.block_size="
                        f"{block_size}; pass CausalLMConfig.block_size = {n} or remake the "
                        f"data with --block_size={block_size}")


def causal_lm_dataset(file_pattern, *, block_size: int,
                      options: input_utils.PipelineOptions | None = None,
                      **fields) -> tf.data.Dataset:
    """Batches of causal-LM blocks.

    Args:
      file_pattern: TFRecord glob(s): a string (comma list allowed) or a list.
      block_size: tokens per block (checked against the first record).
      options: the `input_utils.PipelineOptions` (or their fields as keyword arguments):
        training shuffles (`shuffle_buffer` blocks), repeats forever and drops the last
        partial batch; `input_context` shards the files across input pipelines; the seed
        orders the files and the shuffle (None draws one at random); `deterministic` keeps
        the element order fixed across runs (a slower interleave).

    Returns:
      tf.data.Dataset of dicts: input_word_ids int32 [batch, block_size] and input_mask
      (all ones) of the same shape.
    """
    options = input_utils.pipeline_options(options, **fields)
    try:
        files = record_files.list_files(file_pattern)
    except UserError:
        raise UserError(f"causal-LM data '{file_pattern}' matches no file; {_MAKE_IT}") from None
    check_records(files[0], block_size)
    seed = random.SystemRandom().randrange(2**31) if options.seed is None else options.seed
    dataset, _ = record_files.record_dataset(files, file_pattern, options, seed)
    spec = {features.INPUT_WORD_IDS: tf.io.FixedLenFeature([block_size], tf.int64)}

    def parse(serialized):  # (batch,) strings -> dict of (batch, block_size) int32
        ids = tf.cast(tf.io.parse_example(serialized, spec)[features.INPUT_WORD_IDS], tf.int32)
        # Every token of a block is real; the mask lets the trainer count tokens per second
        # and the loss weigh the targets as for data with padding.
        return {features.INPUT_WORD_IDS: ids, features.INPUT_MASK: tf.ones_like(ids)}

    # Batching before parsing lets parse_example decode a whole batch in one op.
    dataset = dataset.batch(options.batch_size, drop_remainder=options.is_training)
    dataset = dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE,
                          deterministic=options.deterministic)
    return dataset.prefetch(tf.data.AUTOTUNE)
