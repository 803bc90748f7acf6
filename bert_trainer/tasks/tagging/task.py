"""Token tagging (named entities: CoNLL-2003 or your own CoNLL column files).

Each word's tag sits on its first word piece; the other pieces, [CLS], [SEP] and padding carry
`features.IGNORE_LABEL` (see `data/tagging_data.py`). The loss is the cross-entropy averaged
over a sentence's labelled pieces, so every sentence weighs the same whatever its length.
Evaluation maps the predictions back to one tag per word and scores entities with the
conlleval definition (`metrics.tagging.entity_f1`: an entity counts only when its type and
both ends are right).

Sentences longer than `seq_length - 2` pieces (FinetuneConfig.long_texts = "windows", the
default) are cut into windows (`data/windows.py`): training treats every window as a row (a
word in two windows trains in both), so an epoch trains on every window and the step count
counts windows. Evaluation tags each word from the window where its first piece has the most
context, then scores whole sentences; "token_accuracy" counts each word once, the loss is per
window. "truncate" cuts sentences at `seq_length - 2` pieces instead (their later words are
not scored), and counts them: the `cut_sentences` metric (training summaries, evaluation
results), so nothing is cut silently.
"""

import keras
import numpy as np
from keras import ops

from bert_trainer import features as F
from bert_trainer.checkpoints import model_dir as model_dir_lib
from bert_trainer.data import length_buckets, windows
from bert_trainer.errors import UserError
from bert_trainer.features import LOGITS
from bert_trainer.metrics import tagging as tagging_metrics
from bert_trainer.models import BertTokenClassifier
from bert_trainer.tasks.finetuning import DataConfig, EncoderSpec, FinetuneConfig, FinetuningTask
from bert_trainer.tasks.tagging import data as tagging_data

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
        self.window_options = windows.config_options(self.config)
        if self.window_options["long_texts"] == "head_tail":
            raise UserError("FinetuneConfig.long_texts='head_tail' would cut words out of the "
                            "middle of a tagged sentence; tagging uses windows or truncate")
        self.windowed = self.window_options["long_texts"] == "windows"

    def build_head_model(self, encoder: keras.Model) -> keras.Model:
        return self.head_model(encoder, num_classes=len(self.label_names),
                               dropout_rate=self.config.dropout_rate)

    @classmethod
    def head_model(cls, encoder: keras.Model, *, num_classes: int,
                   dropout_rate: float = 0.1) -> keras.Model:
        return BertTokenClassifier(encoder, num_classes=num_classes, dropout_rate=dropout_rate,
                                   name="bert_token_classifier")

    def build_inputs(self, split, input_context, *, is_training):
        return tagging_data.tagging_dataset(
            self.raw_examples(split), self.tokenizer, seq_length=self.config.seq_length,
            long_texts=self.window_options["long_texts"], doc_stride=self.config.doc_stride,
            options=self.pipeline_options(is_training, input_context))

    def count_windows(self, raw):
        return tagging_data.count_windows(raw, self.tokenizer,
                                  seq_length=self.config.seq_length,
                                  doc_stride=self.config.doc_stride)

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
        return [keras.metrics.SparseCategoricalAccuracy(name="token_accuracy"),
                keras.metrics.Sum(name="cut_sentences")]  # truncate: sentences that lost words

    def update_metrics(self, metrics, features, outputs):
        labels, mask = _labelled(features[F.LABEL_IDS])
        if windows.IS_MAX_CONTEXT in features:  # Each word once: from its chosen window.
            mask = mask * ops.cast(features[windows.IS_MAX_CONTEXT], mask.dtype)
        metrics[0].update_state(labels, outputs[LOGITS], sample_weight=mask)
        if tagging_data.CUT in features:
            metrics[1].update_state(ops.cast(features[tagging_data.CUT], "float32"))

    def eval_step_outputs(self, features, outputs):
        # Batches may be cut short (length buckets): per-piece outputs go back to seq_length,
        # the padding ignored.
        width = self.config.seq_length
        window_keys = [k for k in windows.EVAL_KEYS if k in features]
        outputs = {PREDICTIONS: ops.argmax(outputs[LOGITS], axis=-1),
                   F.LABEL_IDS: features[F.LABEL_IDS], **{k: features[k] for k in window_keys}}
        fill = {F.LABEL_IDS: F.IGNORE_LABEL}
        # tf.distribute gathers numbers only: booleans travel as int32.
        outputs = {k: ops.cast(v, "int32") if v.dtype == "bool" else v
                   for k, v in outputs.items()}
        return {k: length_buckets.pad_to_width(v, width, fill.get(k, 0))
                if len(v.shape) == 2 else v for k, v in outputs.items()}

    def aggregate_eval(self, gathered):
        """Entity precision, recall and F1 (fractions) over whole sentences (windows) or the
        words that fit `seq_length` (truncate)."""
        if PREDICTIONS not in gathered:
            return {}
        labels, predictions = gathered[F.LABEL_IDS], gathered[PREDICTIONS]
        if windows.IS_MAX_CONTEXT in gathered:  # Window rows back to whole sentences.
            merged = windows.merge_pieces(
                {"labels": labels, "predictions": predictions},
                *(gathered[k] for k in (windows.EXAMPLE_INDEX, windows.NUM_WINDOWS,
                                        windows.WINDOW_START, windows.IS_MAX_CONTEXT)))
            labels = [m["labels"] for m in merged]
            predictions = [m["predictions"] for m in merged]
        gold = [self._word_tags(np.where(row == F.IGNORE_LABEL, 0, row), row)
                for row in labels]
        predicted = [self._word_tags(p, row) for p, row in zip(predictions, labels, strict=True)]
        scores = tagging_metrics.entity_f1(gold, predicted, scheme="IOB2")
        results = {k: float(scores[k]) for k in ("precision", "recall", "f1")}
        results["num_sentences"] = float(len(gold))
        results["num_entities"] = float(scores["num_true"])
        return results

    def _word_tags(self, predicted_ids, label_ids) -> list[str]:
        """One sentence's tags: the predictions at its words' first pieces."""
        return tagging_data.word_predictions([predicted_ids], [label_ids], self.label_names)[0]

    def task_info(self) -> dict:
        return {**super().task_info(), "windows": dict(self.window_options)}

    def check_resume(self, model_dir: str) -> None:
        """`FinetuningTask.check_resume`, and the windowing too: a resumed run must read the
        same rows (a directory written before windows records none and is not compared)."""
        super().check_resume(model_dir)
        windows.check_resume(model_dir, model_dir_lib.trained_task(model_dir),
                             self.task_info())
