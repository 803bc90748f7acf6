"""The regression family: STS-B and your own scored texts; classification's reader and head
with one float output.

Raw examples (`TaskData.load`): {"text": string, "text_b": string (pairs only), "label":
float32 score}. Local files are TSV, CSV or JSONL read through a column mapping, as for
classification; a label must be a finite number.
"""

import math

import tensorflow as tf

from bert_trainer.data.sources import TextColumns
from bert_trainer.errors import UserError
from bert_trainer.tasks.classification.family import ClassificationFamily, glue, stored_pooling
from bert_trainer.tasks.family import finite, mark_truncated
from bert_trainer.tasks.regression.serving import RegressionServing
from bert_trainer.tasks.regression.task import RegressionTask


class RegressionFamily(ClassificationFamily):
    """Sentence (pair) regression (see the module docstring)."""

    name = "regression"
    recipe = "configs/tasks/regression.gin"
    task_class = RegressionTask
    local_tasks = ("regression",)
    has_label_names = False
    answer_outputs = ("score",)
    label_dtype = tf.float32

    def presets(self):
        return (glue("stsb", None, {"text": "sentence1", "text_b": "sentence2"},
                     TextColumns("sentence1", "sentence2", "score"), family=self),)

    def num_labels(self, task_data) -> int:
        return 1

    def parse_label(self, td, value, where, index=None):
        try:
            number = float(value)
        except ValueError:
            raise UserError(f"{where}: regression label {value!r} is not a number; "
                            "fix the label or the label column") from None
        if not math.isfinite(number):  # NaN/Inf would poison the loss at the first step.
            raise UserError(f"{where}: label {value!r} is not a finite number; fix the label")
        return number

    def head_options(self, task, where):
        return {"num_classes": 1, "pooling": stored_pooling(task, where)}

    def serving_module(self, model, task, **common):
        return RegressionServing(model, **common, **self.serving_options(task))

    def format_answer(self, outputs, i):
        return mark_truncated({"score": finite(outputs["score"][i])}, outputs, i)
