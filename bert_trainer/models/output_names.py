"""Names of the models' output dict entries, shared with the tasks' losses and metrics.

(Candidates for `bert_trainer/features.py`, next to the encoder output names.)
"""

MLM_LOGITS = "mlm_logits"                        # [batch, num_predictions, vocab] float32
# BertPretrainer in training, given the weights: only the weighted predictions' rows.
MLM_ROW_LOGITS = "mlm_row_logits"                # [rows, vocab] float32
MLM_ROWS = "mlm_rows"                            # [rows] int32: batch index * P + k
NEXT_SENTENCE_LOGITS = "next_sentence_logits"    # [batch, num_next_sentence_labels] float32
LOGITS = "logits"                                # classifier [batch, C]; tagger [batch, seq, C]
START_LOGITS = "start_logits"                    # [batch, seq] float32
END_LOGITS = "end_logits"                        # [batch, seq] float32
