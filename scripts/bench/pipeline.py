"""Input pipeline throughput: TFRecord shards -> shuffled, parsed, dynamically masked batches.

Uses bert-train's own code end to end: `create_pretraining_data` writes real sentence-pair
examples from corpus text, and `pretraining_dataset` reads them back the way training does
(is_training=True: shuffle, repeat, batch, parse, mask, prefetch). It is timed alone, on all
cores; during training it shares them with the step, which is why the target is >= 5x the
step's consumption rather than 1x.
"""

import os

import tensorflow as tf

from bert_trainer import features
from bert_trainer.data.corpus_options import CorpusOptions
from bert_trainer.tasks.masked_lm.corpus import (
    PretrainingDataConfig,
    create_pretraining_data,
)
from bert_trainer.tasks.masked_lm.data import pretraining_dataset


def build(inputs: str, vocab: str, workdir: str, seq_length: int = 128, batch_size: int = 32,
          max_predictions: int = 20):
    """Writes the TFRecords, builds the dataset and returns a runner pulling batches.

    Args:
      inputs: corpus text files (comma list / globs).
      vocab: vocab.txt path.
      workdir: directory for the shards (created).
      seq_length, batch_size, max_predictions: as the training step uses them.

    Returns:
      (info, run): info holds the create_pretraining_data summary numbers; run(n) pulls n
      batches and returns {"examples", "real_tokens"} (non-padding tokens).
    """
    os.makedirs(workdir, exist_ok=True)
    summary = create_pretraining_data(
        inputs, vocab, os.path.join(workdir, "train-*.tfrecord"),
        PretrainingDataConfig(max_seq_length=seq_length, seed=1),
        options=CorpusOptions(overwrite=True), progress=None)
    dataset = pretraining_dataset(
        os.path.join(workdir, "train-*.tfrecord"), seq_length=seq_length,
        max_predictions_per_seq=max_predictions, batch_size=batch_size, vocab=vocab,
        is_training=True, seed=1)
    iterator = iter(dataset)

    def run(n: int) -> dict:
        examples, real_tokens = 0, 0
        for _ in range(n):
            batch = next(iterator)
            examples += int(tf.shape(batch[features.INPUT_WORD_IDS])[0])
            real_tokens += int(tf.reduce_sum(batch[features.INPUT_MASK]))
        return {"examples": examples, "real_tokens": real_tokens}

    info = {key: summary[key] for key in ("examples", "documents", "examples_per_second",
                                           "fraction_truncated", "seconds")}
    return info, run
