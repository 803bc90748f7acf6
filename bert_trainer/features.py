"""Feature and output names shared by the data pipeline, the models, the tasks and the exports.

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

# Sequence to sequence. The source is packed as the encoder inputs ([CLS] source [SEP]); the
# target sequence is [CLS] target [SEP] (Rothe et al.'s BERT2BERT convention: [CLS] starts
# decoding, [SEP] ends it). The decoder reads [CLS] target and predicts target [SEP]; 0 pads.
DECODER_INPUT_IDS = "decoder_input_ids"  # [batch, target_len] int32
TARGET_IDS = "target_ids"                # [batch, target_len] int32, 0 = padding (no loss)

# Encoder outputs.
SEQUENCE_OUTPUT = "sequence_output"
POOLED_OUTPUT = "pooled_output"
ENCODER_OUTPUTS = "encoder_outputs"

# Task model outputs, read by the tasks' losses and metrics and by the exports.
MLM_LOGITS = "mlm_logits"                        # [batch, num_predictions, vocab] float32
# BertPretrainer in training, when asked to compute only the weighted predictions.
MLM_ROW_LOGITS = "mlm_row_logits"                # [rows, vocab] float32
MLM_ROWS = "mlm_rows"                            # [rows] int32: batch index * P + k
NEXT_SENTENCE_LOGITS = "next_sentence_logits"    # [batch, num_next_sentence_labels] float32
LOGITS = "logits"                                # classifier [batch, C]; tagger [batch, seq, C]
START_LOGITS = "start_logits"                    # [batch, seq] float32
END_LOGITS = "end_logits"                        # [batch, seq] float32
# Seq2seq: LOGITS is [batch, target_len, vocab] float32; decoding returns these.
DECODED_IDS = "decoded_ids"                      # [batch, length] int32 (no [CLS]; 0 after end)
DECODED_SCORES = "decoded_scores"                # [batch] float32 (length-normalized log-prob)

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

