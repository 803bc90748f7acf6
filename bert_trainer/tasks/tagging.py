"""Token tagging (named entities: CoNLL-2003 or your own CoNLL column files).

Each word's tag sits on its first word piece; the other pieces, [CLS], [SEP] and padding carry
`features.IGNORE_LABEL` (see `data/tagging_data.py`). The loss is the cross-entropy averaged
over a sentence's labelled pieces, so every sentence weighs the same whatever its length.
Evaluation maps the predictions back to one tag per word and scores entities with the
conlleval definition (`metrics.tagging.entity_f1`: an entity counts only when its type and
both ends are right).
"""

import keras
import numpy as np
from keras import ops

from bert_trainer import features as F
from bert_trainer.data import length_buckets, tagging_data
from bert_trainer.errors import UserError
from bert_trainer.metrics import tagging as tagging_metrics
from bert_trainer.models import LOGITS, BertTokenClassifier
from bert_trainer.tasks.finetuning import DataConfig, EncoderSpec, FinetuneConfig, FinetuningTask

PREDICTIONS = "predictions"  # eval output: predicted tag id per piece, int [batch, seq]


def _labelled(labels):
    """(labels with ignored positions set to tag 0, float mask of the labelled positions)."""
    mask = ops.not_equal(labels, F.IGNORE_LABEL)
    return ops.where(mask, labels, 0), ops.cast(mask, "float32")


class TaggingTask(FinetuningTask):
    """Per-word tagging with `BertTokenClassifier`.

    Args:
      task_data: a "tagging" `TaskData`; its label_names are the IOB2 tags in id order.
      encoder, config, data: see `FinetuningTask`.

    Attributes:
      label_names: the tags.
    """

    family = "tagging"
    best_metric = "f1"

    def __init__(self, task_data, encoder: EncoderSpec, *,
                 config: FinetuneConfig | None = None, data: DataConfig | None = None):
        super().__init__(task_data, encoder, config=config, data=data)
        self.label_names = tuple(task_data.label_names or ())
        if len(self.label_names) < 2:
            raise UserError(f"task '{self.name}' has the tags {list(self.label_names)}; tagging "
                            "needs at least 2 (check the tag column of the training file)")

    def build_head_model(self, encoder: keras.Model) -> keras.Model:
        return BertTokenClassifier(encoder, num_classes=len(self.label_names),
                                   dropout_rate=self.config.dropout_rate,
                                   name="bert_token_classifier")

    def build_inputs(self, split, input_context, *, is_training):
        return tagging_data.tagging_dataset(
            self.raw_examples(split), self.tokenizer, seq_length=self.config.seq_length,
            **self.pipeline_options(is_training, input_context))

    def build_losses(self, features, outputs):
        labels, mask = _labelled(features[F.LABEL_IDS])  # (batch, seq)
        xent = keras.losses.sparse_categorical_crossentropy(
            labels, outputs[LOGITS], from_logits=True)  # (batch, seq)
        # A sentence whose words were all cut (or an empty one) has no labelled piece: its
        # loss is 0 rather than 0/0.
        per_example = ops.sum(xent * mask, axis=1) / ops.maximum(ops.sum(mask, axis=1), 1.0)
        return {"loss": per_example}

    def build_metrics(self, training):
        # Over first pieces only, i.e. the fraction of words tagged right.
        return [keras.metrics.SparseCategoricalAccuracy(name="token_accuracy")]

    def update_metrics(self, metrics, features, outputs):
        labels, mask = _labelled(features[F.LABEL_IDS])
        metrics[0].update_state(labels, outputs[LOGITS], sample_weight=mask)

    def eval_step_outputs(self, features, outputs):
        # Batches may be cut short (length buckets): back to seq_length, the padding ignored.
        width = self.config.seq_length
        return {PREDICTIONS: length_buckets.pad_to_width(
                    ops.argmax(outputs[LOGITS], axis=-1), width),
                F.LABEL_IDS: length_buckets.pad_to_width(
                    features[F.LABEL_IDS], width, F.IGNORE_LABEL)}

    def aggregate_eval(self, gathered):
        """Entity precision, recall and F1 (fractions) over the words that fit `seq_length`."""
        if PREDICTIONS not in gathered:
            return {}
        labels = gathered[F.LABEL_IDS]
        gold_ids = np.where(labels == F.IGNORE_LABEL, 0, labels)
        gold = tagging_data.word_predictions(gold_ids, labels, self.label_names)
        predicted = tagging_data.word_predictions(gathered[PREDICTIONS], labels, self.label_names)
        scores = tagging_metrics.entity_f1(gold, predicted, scheme="IOB2")
        results = {k: float(scores[k]) for k in ("precision", "recall", "f1")}
        results["num_sentences"] = float(len(gold))
        results["num_entities"] = float(scores["num_true"])
        return results
