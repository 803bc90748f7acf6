"""Sentence (pair) classification and regression input pipeline, tokenized in graph.

Raw examples {"text", ["text_b"], ["label"]} (`TaskData.load`) are batched first and then
tokenized and packed as a batch (`[CLS] A [SEP] (B [SEP])`, the longer segment trimmed
first), so tensorflow-text runs vectorized inside `tf.data`.
"""

import tensorflow as tf

from bert_trainer import features
from bert_trainer.data import input_utils


def text_features(tokenizer, batch: dict, seq_length: int, *, regression: bool = False) -> dict:
    """Encoder inputs (and labels) of a batch of raw classification examples.

    Args:
      tokenizer: a `bert_trainer.data.tokenizer.Tokenizer`.
      batch: "text" string [batch], optionally "text_b" string [batch] and "label" [batch].
      seq_length: packed sequence length.
      regression: labels are float scores rather than class ids.

    Returns:
      features.ENCODER_INPUTS int32 [batch, seq_length]; features.LABEL_IDS [batch], int32 for
      classes or float32 for regression, when the batch has labels.
    """
    segments = [tokenizer.tokenize(batch["text"])]
    if "text_b" in batch:
        segments.append(tokenizer.tokenize(batch["text_b"]))
    inputs = tokenizer.pack(segments, seq_length)
    if "label" in batch:
        dtype = tf.float32 if regression else tf.int32
        inputs[features.LABEL_IDS] = tf.cast(batch["label"], dtype)
    return inputs


def classification_dataset(raw: tf.data.Dataset, tokenizer, *, seq_length: int,
                           batch_size: int, is_training: bool, regression: bool = False,
                           input_context=None,
                           shuffle_buffer: int = input_utils.DEFAULT_SHUFFLE_BUFFER,
                           seed: int | None = None, deterministic: bool = False,
                           length_buckets: int = 0, group_by_length: bool = False
                           ) -> tf.data.Dataset:
    """Batches of a classification (or regression) task.

    Args:
      raw: unbatched raw examples from `TaskData.load`.
      tokenizer: a `Tokenizer`.
      seq_length: packed sequence length.
      batch_size: per-replica batch size.
      is_training: shuffle, repeat and drop the remainder (see `input_utils.batch_pipeline`).
      regression: float32 labels (STS-B).
      input_context, shuffle_buffer, seed, deterministic, length_buckets,
        group_by_length: see
        `input_utils.batch_pipeline`.

    Returns:
      Dataset of dicts: ENCODER_INPUTS int32 [batch, seq_length], LABEL_IDS [batch].
    """
    def featurize(batch):
        return text_features(tokenizer, batch, seq_length, regression=regression)

    return input_utils.batch_pipeline(
        raw, featurize, batch_size=batch_size, is_training=is_training,
        input_context=input_context, shuffle_buffer=shuffle_buffer, seed=seed,
        deterministic=deterministic, length_buckets=length_buckets,
        group_by_length=group_by_length)
