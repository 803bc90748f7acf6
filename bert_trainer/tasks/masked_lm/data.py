"""Masked-LM pretraining input pipeline: TFRecord shards -> shuffled, batched, masked dicts.

Reads both what `create_pretraining_data` writes - unmasked examples with our feature names,
masked here on the fly ("dynamic") - and static-masked examples with google-research/bert's
names (`input_ids`, `segment_ids`, ...), from our `--static_masking` or google-research/bert's
own `create_pretraining_data.py` ("static"). The kind is detected from the first record.
"""

import os
import random

import numpy as np
import tensorflow as tf

from bert_trainer import features
from bert_trainer.data import input_utils
from bert_trainer.data.masking import MaskingVocab, mask_batch
from bert_trainer.data.record_files import inspect_records, list_files, record_dataset
from bert_trainer.data.tokenizer import Tokenizer
from bert_trainer.errors import UserError

MASKING_MODES = ("auto", "dynamic", "static")
_GOOGLE_TO_OURS = features.GOOGLE_BERT_NAMES
_OURS_TO_GOOGLE = {ours: google for google, ours in _GOOGLE_TO_OURS.items()}


def _detect(path: str, masking: str, seq_length: int, max_predictions_per_seq: int) -> str:
    """Returns "static" or "dynamic" and checks the record lengths against the arguments."""
    lengths = inspect_records(path)
    found = "static" if _OURS_TO_GOOGLE[features.INPUT_WORD_IDS] in lengths else "dynamic"
    if found == "dynamic" and features.INPUT_WORD_IDS not in lengths:
        raise UserError(f"{path} has features {sorted(lengths)}, not pretraining examples; "
                        "make it with create_pretraining_data")
    if set(lengths) == {features.INPUT_WORD_IDS}:
        raise UserError(f"{path} holds causal-LM blocks (create_pretraining_data "
                        "--objective=causal_lm), not masked-LM examples; pretrain them with a "
                        "causal config, e.g. --gin_file=configs/causal_lm/mini.gin")
    if masking != "auto" and masking != found:
        raise UserError(f"{path} holds {found}-masked examples but masking='{masking}'; "
                        f"pass masking='{found}' or 'auto'")
    if found == "static":
        lengths = {_GOOGLE_TO_OURS.get(name, name): n for name, n in lengths.items()}
    if lengths[features.INPUT_WORD_IDS] != seq_length:
        n = lengths[features.INPUT_WORD_IDS]
        raise UserError(f"{path} has sequences of length {n} but seq_length={seq_length}; "
                        f"pass seq_length={n}")
    n = lengths.get(features.MASKED_LM_POSITIONS)
    if found == "static" and n != max_predictions_per_seq:
        raise UserError(f"{path} has {n} masked positions per sequence but "
                        f"max_predictions_per_seq={max_predictions_per_seq}; pass "
                        f"max_predictions_per_seq={n}")
    return found


def _parse_fn(static: bool, seq_length: int, max_predictions_per_seq: int,
              use_next_sentence_label: bool):
    """A function parsing a batch of serialized examples into our feature names, int32."""
    seq = tf.io.FixedLenFeature([seq_length], tf.int64)
    spec = {name: seq for name in features.ENCODER_INPUTS}
    spec[features.NEXT_SENTENCE_LABELS] = tf.io.FixedLenFeature([1], tf.int64)
    if static:
        pred = tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64)
        spec[features.MASKED_LM_POSITIONS] = spec[features.MASKED_LM_IDS] = pred
        spec[features.MASKED_LM_WEIGHTS] = tf.io.FixedLenFeature(
            [max_predictions_per_seq], tf.float32)
        spec = {_OURS_TO_GOOGLE[name]: value for name, value in spec.items()}
    if not use_next_sentence_label:
        del spec[features.NEXT_SENTENCE_LABELS]  # The same name in both layouts.

    def parse(serialized):  # (batch,) strings -> dict of (batch, ...) tensors.
        parsed = tf.io.parse_example(serialized, spec)
        out = {}
        for name, value in parsed.items():
            name = _GOOGLE_TO_OURS.get(name, name)
            out[name] = value if value.dtype == tf.float32 else tf.cast(value, tf.int32)
        if use_next_sentence_label:
            out[features.NEXT_SENTENCE_LABELS] = out[features.NEXT_SENTENCE_LABELS][:, 0]
        return out

    return parse


def _masking_vocab(vocab) -> MaskingVocab:
    if isinstance(vocab, MaskingVocab):
        return vocab
    if isinstance(vocab, Tokenizer):
        return MaskingVocab.from_tokenizer(vocab)
    if isinstance(vocab, str | os.PathLike):
        return MaskingVocab.from_tokenizer(Tokenizer(str(vocab)))
    raise UserError("dynamic masking needs vocab= a Tokenizer, a vocab.txt path or a "
                    f"MaskingVocab, got {type(vocab).__name__}")


def pretraining_dataset(file_pattern, *, seq_length: int, max_predictions_per_seq: int,
                        vocab=None, masking: str = "auto", whole_word: bool = False,
                        masked_lm_prob: float = 0.15, use_next_sentence_label: bool = True,
                        options: input_utils.PipelineOptions | None = None,
                        **fields) -> tf.data.Dataset:
    """Batches of masked pretraining features.

    Args:
      file_pattern: TFRecord glob(s): a string (comma list allowed) or a list.
      seq_length: sequence length of the records (checked against the first record).
      max_predictions_per_seq: P, masked positions per sequence.
      vocab: for dynamic masking: a `Tokenizer`, a vocab.txt path or a `MaskingVocab`.
      masking: "auto" (from the feature names), "dynamic" or "static".
      whole_word: whole-word dynamic masking.
      masked_lm_prob: fraction of real tokens masked (dynamic).
      use_next_sentence_label: emit features.NEXT_SENTENCE_LABELS.
      options: the `input_utils.PipelineOptions` (or their fields as keyword arguments):
        training shuffles (`shuffle_buffer` examples), repeats forever and drops the last
        partial batch; `input_context` shards the files across input pipelines; the seed
        orders the files and seeds the shuffle and the masks (None draws one at random);
        `deterministic` keeps the element order fixed across runs (a slower interleave).

    Returns:
      tf.data.Dataset of dicts: ENCODER_INPUTS int32 [b, seq_length]; MASKED_LM_POSITIONS,
      MASKED_LM_IDS int32 and MASKED_LM_WEIGHTS float32 [b, P]; NEXT_SENTENCE_LABELS int32 [b]
      (1 = random next sentence).
    """
    if masking not in MASKING_MODES:
        raise UserError(f"masking='{masking}' is unknown; use one of {MASKING_MODES}")
    options = input_utils.pipeline_options(options, **fields)
    is_training, deterministic = options.is_training, options.deterministic
    files = list_files(file_pattern)
    static = _detect(files[0], masking, seq_length, max_predictions_per_seq) == "static"
    mask_vocab = None if static else _masking_vocab(vocab)
    seed = random.SystemRandom().randrange(2**31) if options.seed is None else options.seed
    dataset, pipeline_id = record_dataset(files, file_pattern, options, seed)
    # Batching before parsing lets parse_example decode a whole batch in one op.
    dataset = dataset.batch(options.batch_size, drop_remainder=is_training)
    dataset = dataset.map(_parse_fn(static, seq_length, max_predictions_per_seq,
                                    use_next_sentence_label),
                          num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    if not static:
        base_seed = np.array([seed, pipeline_id], np.int64)

        def mask(index, batch):  # The batch index keys the mask, so every epoch differs.
            batch_seed = tf.random.experimental.stateless_fold_in(base_seed, index)
            return mask_batch(batch, batch_seed, vocab=mask_vocab, whole_word=whole_word,
                              max_predictions_per_seq=max_predictions_per_seq,
                              masked_lm_prob=masked_lm_prob)

        dataset = dataset.enumerate().map(mask, num_parallel_calls=tf.data.AUTOTUNE,
                                          deterministic=deterministic)
    return dataset.prefetch(tf.data.AUTOTUNE)
