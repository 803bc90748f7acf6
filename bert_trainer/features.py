"""Feature and output names shared by the data pipeline, the models and the exports.

They are the names of the keras-nlp Transformer Encoder RFC. Defined once here so that
a dataset and a model can never disagree on a key.
"""

# Encoder inputs.
INPUT_WORD_IDS = "input_word_ids"
INPUT_MASK = "input_mask"
INPUT_TYPE_IDS = "input_type_ids"
ENCODER_INPUTS = (INPUT_WORD_IDS, INPUT_MASK, INPUT_TYPE_IDS)

# Pretraining targets.
MASKED_LM_POSITIONS = "masked_lm_positions"
MASKED_LM_IDS = "masked_lm_ids"
MASKED_LM_WEIGHTS = "masked_lm_weights"
NEXT_SENTENCE_LABELS = "next_sentence_labels"

# Fine-tuning targets.
LABEL_IDS = "label_ids"            # classification [batch] int32, regression [batch] float32
START_POSITIONS = "start_positions"  # QA [batch] int32
END_POSITIONS = "end_positions"      # QA [batch] int32
# Token tagging uses LABEL_IDS with shape [batch, seq]; -1 marks positions the loss ignores.
IGNORE_LABEL = -1

# Encoder outputs.
SEQUENCE_OUTPUT = "sequence_output"
POOLED_OUTPUT = "pooled_output"
ENCODER_OUTPUTS = "encoder_outputs"

# google-research/bert TFRecord names (static-masked pretraining data), mapped to ours.
GOOGLE_BERT_NAMES = {
    "input_ids": INPUT_WORD_IDS,
    "input_mask": INPUT_MASK,
    "segment_ids": INPUT_TYPE_IDS,
    "masked_lm_positions": MASKED_LM_POSITIONS,
    "masked_lm_ids": MASKED_LM_IDS,
    "masked_lm_weights": MASKED_LM_WEIGHTS,
    "next_sentence_labels": NEXT_SENTENCE_LABELS,
}

# Special tokens every vocabulary must hold.
PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)


# Training computes the masked LM only at weighted predictions (BertPretrainer), padded with
# unweighted ones to a multiple of this many rows so that few distinct shapes occur.
PREDICTION_ROW_MULTIPLE = 16


def computed_prediction_rows(num_weighted: int, total: int) -> int:
    """Rows the masked LM computes in training for a batch with `num_weighted` weighted
    predictions out of `total` (batch x P): `num_weighted` rounded up to a multiple of
    `PREDICTION_ROW_MULTIPLE`, at most `total`."""
    multiple = PREDICTION_ROW_MULTIPLE
    return min(total, -(-num_weighted // multiple) * multiple)
