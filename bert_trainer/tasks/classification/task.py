"""Sentence (pair) classification: GLUE, IMDB, or your own TSV/CSV/JSONL files.

The model is `BertClassifier` (pooled output -> dropout -> dense), trained on softmax
cross-entropy (`tasks/regression` subclasses it for one-output scores). Evaluation
gathers every prediction to the host and scores it with `bert_trainer.metrics.classification`,
so F1, Matthews correlation and rank correlations are exact over the whole split rather than
averages of per-batch values.

Texts longer than `seq_length` (FinetuneConfig.long_texts = "windows", the default) are cut
into windows (`data/windows.py`): training treats every window as a row with its text's label,
so an epoch trains on every window and the step count counts windows. Evaluation scores texts:
it gathers every window's logits and combines a text's windows (mean of the logits, or max:
FinetuneConfig.window_pooling) before the metrics; its loss and "window_accuracy" are per
window. "truncate" keeps the first `seq_length` pieces, one row per text. Texts that lost
pieces either way are counted (the `cut_texts` metric, in training summaries and evaluation
results: no silent truncation).
"""

import keras
import numpy as np
from keras import ops

from bert_trainer import features as F
from bert_trainer.checkpoints import model_dir as model_dir_lib
from bert_trainer.data import windows
from bert_trainer.errors import UserError
from bert_trainer.features import LOGITS
from bert_trainer.metrics import classification as classification_metrics
from bert_trainer.models import BertClassifier
from bert_trainer.tasks.classification import data as classification_data
from bert_trainer.tasks.finetuning import DataConfig, EncoderSpec, FinetuneConfig, FinetuningTask

PREDICTIONS = "predictions"  # eval output: class id [batch] int, or the score [batch] float
CUT_TEXTS = "cut_texts"  # metric: texts (pairs) that lost pieces to fit (classification_data.CUT)

# (host-side metrics, metric whose best checkpoint is kept) per task: GLUE's official metrics.
_TASK_METRICS = {
    "cola": (("accuracy", "matthews_corrcoef"), "matthews_corrcoef"),
    "mrpc": (("accuracy", "f1"), "f1"),
    "qqp": (("accuracy", "f1"), "f1"),
}
_CLASSIFICATION_METRICS = (("accuracy",), "accuracy")


class SentenceClassificationTask(FinetuningTask):
    """Classifies a sentence or a sentence pair (`RegressionTask` scores one).

    Args:
      task_data: a "classification" `TaskData`; classes are its label_names.
      encoder, config, data: see `FinetuningTask`.
      metrics: host-side eval metrics (names of `metrics.classification.METRICS`); None: the
        task's defaults (`default_metrics`). `best_metric` is the task's default one when it
        is among them, else the first of them.

    Attributes:
      num_classes: outputs of the head (1 for regression).
      metric_names: the host-side eval metrics.
    """

    family = "classification"

    def __init__(self, task_data, encoder: EncoderSpec, *,
                 config: FinetuneConfig | None = None, data: DataConfig | None = None,
                 metrics: tuple[str, ...] | None = None):
        super().__init__(task_data, encoder, config=config, data=data)
        self.num_classes = task_data.num_labels
        self._check_classes()
        names, best = self.default_metrics(self.name)
        self.metric_names = tuple(metrics) if metrics else names
        unknown = sorted(set(self.metric_names) - set(classification_metrics.METRICS))
        if unknown:
            raise UserError(f"task '{self.name}': unknown metric {unknown[0]!r}; choose from "
                            f"{', '.join(sorted(classification_metrics.METRICS))}")
        self.best_metric = best if best in self.metric_names else self.metric_names[0]
        self.window_options = windows.config_options(self.config)
        if self.window_options["long_texts"] == "head_tail" and task_data.is_pair:
            raise UserError(f"FinetuneConfig.long_texts='head_tail' keeps the head and tail of "
                            f"one text; task '{self.name}' reads pairs: use windows or truncate")
        self.windowed = self.window_options["long_texts"] == "windows"

    def _check_classes(self) -> None:
        if self.num_classes < 2:
            raise UserError(f"task '{self.name}' has {self.num_classes} label(s) "
                            f"{list(self.task_data.label_names or ())}; classification needs at "
                            "least 2 (use --task=regression for scores)")

    @staticmethod
    def default_metrics(name: str) -> tuple[tuple[str, ...], str]:
        """(metric names, best metric) of a task: GLUE's official ones, else accuracy."""
        return _TASK_METRICS.get(name, _CLASSIFICATION_METRICS)

    def predictions(self, logits):
        """A prediction per row of logits (batch, classes): the class id."""
        return ops.argmax(logits, axis=-1)

    def build_head_model(self, encoder: keras.Model) -> keras.Model:
        return self.head_model(encoder, num_classes=self.num_classes, pooling=self.config.pooling,
                               dropout_rate=self.config.dropout_rate)

    @classmethod
    def head_model(cls, encoder: keras.Model, *, num_classes: int, pooling: str = "cls",
                   dropout_rate: float = 0.1) -> keras.Model:
        return BertClassifier(encoder, num_classes=num_classes, dropout_rate=dropout_rate,
                              pooling=pooling, name="bert_classifier")

    def build_inputs(self, split, input_context, *, is_training):
        return classification_data.classification_dataset(
            self.raw_examples(split), self.tokenizer, seq_length=self.config.seq_length,
            **self.label_options(), long_texts=self.window_options["long_texts"],
            doc_stride=self.config.doc_stride,
            options=self.pipeline_options(is_training, input_context))

    def label_options(self) -> dict:
        """Label options of the `data` pipeline (regression: float scores)."""
        return {}

    def count_windows(self, raw):
        return classification_data.count_windows(raw, self.tokenizer,
                                  seq_length=self.config.seq_length,
                                  doc_stride=self.config.doc_stride)

    def build_losses(self, features, outputs):
        logits = outputs[LOGITS]  # (batch, num_classes) float32
        labels = features[F.LABEL_IDS]  # (batch,)
        loss = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        return {"loss": loss}

    def build_metrics(self, training):
        # F1 and correlations need the whole split: they are computed on the host.
        # With windows, evaluation rows are windows: the text accuracy is host-side.
        name = "window_accuracy" if self.windowed and not training else "accuracy"
        return [keras.metrics.SparseCategoricalAccuracy(name=name),
                keras.metrics.Sum(name=CUT_TEXTS)]

    def update_metrics(self, metrics, features, outputs):
        for metric in metrics:
            if metric.name != CUT_TEXTS:
                metric.update_state(features[F.LABEL_IDS], outputs[LOGITS])
            elif classification_data.CUT in features:
                metric.update_state(ops.cast(features[classification_data.CUT], "float32"))

    def eval_step_outputs(self, features, outputs):
        logits = outputs[LOGITS]
        if windows.EXAMPLE_INDEX in features:  # Window rows: combined in aggregate_eval.
            return {LOGITS: ops.cast(logits, "float32"), F.LABEL_IDS: features[F.LABEL_IDS],
                    **{k: features[k] for k in (windows.EXAMPLE_INDEX, windows.NUM_WINDOWS)}}
        return {PREDICTIONS: self.predictions(logits), F.LABEL_IDS: features[F.LABEL_IDS]}

    def aggregate_eval(self, gathered):
        results = {}
        if LOGITS in gathered:  # Windows: one prediction per text from its windows' logits.
            logits, labels = windows.pool_eval(
                gathered[LOGITS], gathered[F.LABEL_IDS], gathered[windows.EXAMPLE_INDEX],
                gathered[windows.NUM_WINDOWS], self.window_options["window_pooling"])
            predictions = np.asarray(self.predictions(logits))
            results["num_windows"] = float(np.size(gathered[LOGITS], 0))
        elif PREDICTIONS in gathered:
            labels, predictions = gathered[F.LABEL_IDS], gathered[PREDICTIONS]
        else:  # An empty evaluation gathered nothing.
            return {}
        if np.size(labels):
            results.update(classification_metrics.compute(self.metric_names, labels,
                                                          predictions))
        results["num_examples"] = float(np.size(labels))
        return results

    def task_info(self) -> dict:
        return {**super().task_info(), "metrics": list(self.metric_names),
                "windows": dict(self.window_options), "pooling": self.config.pooling}

    def check_resume(self, model_dir: str) -> None:
        """`FinetuningTask.check_resume`, and the windowing too: a resumed run must read the
        same rows (a directory written before windows records none and is not compared)."""
        super().check_resume(model_dir)
        stored = model_dir_lib.trained_task(model_dir)
        windows.check_resume(model_dir, stored, self.task_info())
        if stored and stored.get("pooling", "cls") != self.config.pooling:
            raise UserError(f"{model_dir} was trained with FinetuneConfig.pooling="
                            f"{stored.get('pooling', 'cls')!r}, this run asks for "
                            f"{self.config.pooling!r}; keep the pooling or use another "
                            "--model_dir")
