"""The "length_parity" task family: is a text's word count odd? Defined outside the package.

Everything a family provides, in one module that `bert_trainer` never imports:
- data: a TSV reader of `text<TAB>even|odd` lines (own format, own label parsing);
- head: `ParityModel`, one logit on the pooled output; loss: binary cross-entropy on it;
- metrics: "parity_accuracy" over the whole split (host side), "odd_rate" in graph;
- serving: `ParityServing`, text in -> {"parity": "even"|"odd", "odd_probability"};
- predict: {"parity", "odd_probability"} per input line;
- recipe: length_parity.gin beside this file.
Importing the module registers the family (`register_family`).
"""

import os

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from bert_trainer import features as F
from bert_trainer.data import sources
from bert_trainer.data.task_data import validated_stream
from bert_trainer.errors import UserError
from bert_trainer.models.encoder_model import EncoderModel
from bert_trainer.serving import TEXT, TaskServing, text_input_spec
from bert_trainer.tasks.family import Family, decode
from bert_trainer.tasks.finetuning import FinetuningTask
from bert_trainer.tasks.plugins import register_family

NAME = "length_parity"
PARITY_LOGIT = "parity_logit"
LABELS = {"even": 0.0, "odd": 1.0}


@keras.saving.register_keras_serializable(package="family_plugin")
class ParityModel(EncoderModel):
    """encoder -> pooled_output -> Dense(1): {"parity_logit": float32 [batch]}."""

    def __init__(self, encoder, **kwargs):
        super().__init__(encoder, **kwargs)
        self.parity = keras.layers.Dense(1, name="parity", dtype=self.dtype_policy)
        self.parity.build((None, encoder.hidden_size))
        self.built = True

    def call(self, inputs, training=None):
        pooled = self.encode(inputs, training=training, pooled_only=True)[F.POOLED_OUTPUT]
        return {PARITY_LOGIT: ops.cast(self.parity(pooled)[:, 0], "float32")}


class ParityTask(FinetuningTask):
    """Binary cross-entropy on one logit; host-side accuracy over the whole split."""

    family = NAME
    best_metric = "parity_accuracy"

    def build_head_model(self, encoder):
        return ParityModel(encoder, name="parity_model")

    def build_inputs(self, split, input_context, *, is_training):
        options = self.pipeline_options(is_training, input_context)
        raw = self.raw_examples(split)
        if is_training:
            raw = raw.shuffle(options["shuffle_buffer"], seed=options["seed"]).repeat()

        def featurize(batch):
            inputs = self.tokenizer.pack([self.tokenizer.tokenize(batch[TEXT])],
                                         self.config.seq_length)
            inputs[F.LABEL_IDS] = batch["label"]
            return inputs

        return raw.batch(options["batch_size"], drop_remainder=is_training).map(featurize)

    def build_losses(self, features, outputs):
        logit, label = outputs[PARITY_LOGIT], features[F.LABEL_IDS]
        return {"loss": ops.softplus(logit) - label * logit}  # BCE with logits, (batch,)

    def build_metrics(self, training):
        return [keras.metrics.Mean(name="odd_rate")]

    def update_metrics(self, metrics, features, outputs):
        metrics[0].update_state(ops.cast(outputs[PARITY_LOGIT] > 0, "float32"))

    def eval_step_outputs(self, features, outputs):
        return {PARITY_LOGIT: outputs[PARITY_LOGIT], F.LABEL_IDS: features[F.LABEL_IDS]}

    def aggregate_eval(self, gathered):
        if PARITY_LOGIT not in gathered:
            return {}
        right = (gathered[PARITY_LOGIT] > 0) == (gathered[F.LABEL_IDS] > 0.5)
        return {"parity_accuracy": float(np.mean(right)), "num_examples": float(right.size)}


class ParityServing(TaskServing):
    """`serving_default(text)` -> parity string [b], odd_probability float32 [b]."""

    def _text_spec(self):
        return self._answer, [text_input_spec(TEXT)]

    def _answer(self, text):
        inputs = self.tokenizer.pack([self.tokenizer.tokenize(text)], self.seq_length)
        logit = self._run_model(inputs)[PARITY_LOGIT]  # (batch,)
        return {"parity": tf.where(logit > 0, "odd", "even"),
                "odd_probability": tf.sigmoid(logit)}


class LengthParityFamily(Family):
    """Word-count parity of a text (see the module docstring)."""

    name = NAME
    recipe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "length_parity.gin")
    task_class = ParityTask
    local_tasks = (NAME,)
    input_orders = ((TEXT,),)
    answer_outputs = ("parity", "odd_probability")

    def num_labels(self, task_data):
        return 1

    def _rows(self, path, stats):
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                text, sep, label = line.rstrip("\n").rpartition("\t")
                if not sep or label not in LABELS:
                    raise UserError(f"{path}:{number}: expected text<TAB>even|odd")
                if stats is not None:
                    stats.examples += 1
                yield {TEXT: text, "label": LABELS[label]}

    def read_local(self, td, path, skip_bad_rows, stats):
        sources.check_file(path)
        signature = {TEXT: tf.TensorSpec([], tf.string), "label": tf.TensorSpec([], tf.float32)}
        return validated_stream(lambda counts: self._rows(path, counts), lambda first: signature,
                                stats)

    def head_model(self, encoder, task, where):
        return ParityModel(encoder, name="parity_model")

    def serving_module(self, model, task, **common):
        return ParityServing(model, **common)

    def format_answer(self, outputs, i):
        return {"parity": decode(outputs["parity"][i]),
                "odd_probability": round(float(outputs["odd_probability"][i]), 6)}


FAMILY = register_family(LengthParityFamily())
