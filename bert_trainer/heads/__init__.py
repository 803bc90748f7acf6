"""Task heads: they read the encoder's outputs and return float32 logits."""

from bert_trainer.heads.classification_head import ClassificationHead
from bert_trainer.heads.span_labeling import SpanLabeling
from bert_trainer.heads.token_classification import TokenClassification

__all__ = ["ClassificationHead", "SpanLabeling", "TokenClassification"]
