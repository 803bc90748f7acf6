"""Sentence (pair) regression (STS-B, or your own scores): `BertClassifier` with one output.

A classification task whose head predicts one score: the loss is the squared error, the
prediction is the output itself, and the host-side metrics are Pearson and Spearman
correlations over the whole split (there is no in-graph metric). Long texts are windowed
as in classification (the mean or max of their windows' scores).
"""

import keras
from keras import ops

from bert_trainer import features as F
from bert_trainer.features import LOGITS
from bert_trainer.tasks.classification.task import CUT_TEXTS, SentenceClassificationTask

_REGRESSION_METRICS = (("pearson", "spearman"), "pearson")


class RegressionTask(SentenceClassificationTask):
    """Scores a sentence or a sentence pair (see `SentenceClassificationTask` for the args)."""

    family = "regression"

    def _check_classes(self) -> None:
        pass  # One output, no label names.

    @staticmethod
    def default_metrics(name: str) -> tuple[tuple[str, ...], str]:
        return _REGRESSION_METRICS

    def predictions(self, logits):
        return logits[:, 0]  # (batch,) the score

    def label_options(self) -> dict:
        return {"regression": True}

    def build_losses(self, features, outputs):
        logits = outputs[LOGITS]  # (batch, 1) float32
        labels = features[F.LABEL_IDS]  # (batch,) float32 scores
        return {"loss": ops.square(logits[:, 0] - ops.cast(labels, logits.dtype))}

    def build_metrics(self, training):
        # Correlations need the whole split: they are computed on the host; texts that lost
        # pieces to fit are counted here.
        return [keras.metrics.Sum(name=CUT_TEXTS)]
