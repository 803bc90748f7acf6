"""Task models: an encoder plus heads, returning a dict of float32 logits (keys named in
`bert_trainer.features`)."""

from bert_trainer.models.bert_classifier import BertClassifier
from bert_trainer.models.bert_pretrainer import BertPretrainer
from bert_trainer.models.bert_span_labeler import BertSpanLabeler
from bert_trainer.models.bert_token_classifier import BertTokenClassifier
from bert_trainer.models.encoder_model import EncoderModel

__all__ = ["BertClassifier", "BertPretrainer", "BertSpanLabeler", "BertTokenClassifier",
           "EncoderModel"]
