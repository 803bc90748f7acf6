"""Task models: an encoder plus heads, returning a dict of float32 logits."""

from bert_trainer.models.bert_classifier import BertClassifier
from bert_trainer.models.bert_pretrainer import BertPretrainer
from bert_trainer.models.bert_span_labeler import BertSpanLabeler
from bert_trainer.models.bert_token_classifier import BertTokenClassifier
from bert_trainer.models.encoder_model import EncoderModel
from bert_trainer.models.output_names import (
                                              END_LOGITS,
                                              LOGITS,
                                              MLM_LOGITS,
                                              MLM_ROW_LOGITS,
                                              MLM_ROWS,
                                              NEXT_SENTENCE_LOGITS,
                                              START_LOGITS,
)

__all__ = [
    "BertClassifier", "BertPretrainer", "BertSpanLabeler", "BertTokenClassifier", "EncoderModel",
    "END_LOGITS", "LOGITS", "MLM_LOGITS", "MLM_ROW_LOGITS", "MLM_ROWS", "NEXT_SENTENCE_LOGITS",
    "START_LOGITS",
]
