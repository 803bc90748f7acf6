"""Task models: an encoder plus heads, returning a dict of float32 logits (keys named in
`bert_trainer.features`)."""

from bert_trainer.models.bert_classifier import BertClassifier
from bert_trainer.models.bert_pretrainer import BertPretrainer
from bert_trainer.models.bert_span_labeler import BertSpanLabeler
from bert_trainer.models.bert_token_classifier import BertTokenClassifier
from bert_trainer.models.causal_lm import CausalLM
from bert_trainer.models.encoder_model import EncoderModel
from bert_trainer.models.gru_translator import GruTranslator
from bert_trainer.models.seq2seq_transformer import Seq2SeqTransformer

__all__ = ["BertClassifier", "BertPretrainer", "BertSpanLabeler", "BertTokenClassifier",
           "CausalLM", "EncoderModel", "GruTranslator", "Seq2SeqTransformer"]
