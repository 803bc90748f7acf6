"""Sentence (pair) regression on raw text: one score per input, in graph."""

from bert_trainer.serving import SCORE
from bert_trainer.tasks.classification.serving import ClassifierServing


class RegressionServing(ClassifierServing):
    """`ClassifierServing` of a one-output model: `serving_default(text[, text_b])` returns
    score float32 [b] (with windows: the mean or max of the windows' scores)."""

    family = "regression"

    def _label_names(self, label_names):
        return None  # A score has no class names.

    def _answer(self, logits) -> dict:
        return {SCORE: logits[:, 0]}  # (batch,)
