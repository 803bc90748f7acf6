"""Sentence (pair) classification on raw text: class probabilities and names, in graph.

Tokenization and packing are the training pipeline's (`data.text_features` /
`data.window_features`), so a served text is encoded exactly as in fine-tuning; a text longer
than `seq_length` is cut into windows whose logits are combined (mean or max) in graph.
Every signature also returns `truncated` bool [b]: the text (pair) lost pieces to fit
(`--long_texts=truncate` or `head_tail`, or a pair's first text cut to leave room for the
second's windows), and what its rows padded (`serving.padding_counts`): a batch is padded to
its longest row (window), not to `seq_length`.
"""

import tensorflow as tf

from bert_trainer.data import windows
from bert_trainer.errors import UserError
from bert_trainer.features import INPUT_MASK, LOGITS
from bert_trainer.serving import TEXT, TEXT_B, TaskServing, padding_counts, text_input_spec
from bert_trainer.tasks.classification.data import CUT, text_features, window_features
from bert_trainer.tasks.family import TRUNCATED

PROBABILITIES, LABEL_INDEX, LABEL_NAME = "probabilities", "label_index", "label_name"


class ClassifierServing(TaskServing):
    """Sentence (pair) classification on raw text (`RegressionServing` scores instead).

    Args:
      model: a `BertClassifier`.
      label_names: class names in id order.
      pair: the task reads two texts (`text`, `text_b`).
      long_texts, doc_stride, window_pooling: how texts longer than `seq_length` are read
        (`FinetuneConfig`'s fields of the same names).
      **kwargs: `ServingModule` arguments.

    `serving_default(text [b] string[, text_b [b] string])` returns probabilities float32
    [b, C], label_index int32 [b], label_name string [b], truncated bool [b], input_tokens and
    padding_tokens int32 [b] (`serving.padding_counts`). With
    windows, the probabilities are the softmax of the combined (mean or max) window logits.
    """

    family = "classification"

    def __init__(self, model, *, label_names=None, pair: bool = False,
                 long_texts: str = "windows", doc_stride: int | None = None,
                 window_pooling: str = "mean", **kwargs):
        super().__init__(model, **kwargs)
        windows.check_options(long_texts, doc_stride, window_pooling)
        self.long_texts, self.doc_stride = long_texts, doc_stride
        self.window_pooling = window_pooling
        self.pair = bool(pair)
        self.label_names = self._label_names(label_names)

    def _label_names(self, label_names):
        names = tuple(str(n) for n in label_names or ())
        if len(names) != self.model.num_classes:
            raise UserError(f"{len(names)} label_names for a classifier of "
                            f"{self.model.num_classes} classes; fix task.label_names in "
                            "bert_train.json")
        return names

    def _text_spec(self):
        if self.pair:
            return self._classify_pair, [text_input_spec(TEXT), text_input_spec(TEXT_B)]
        return self._classify_one, [text_input_spec(TEXT)]

    def _classify_one(self, text):
        return self._classify({TEXT: text})

    def _classify_pair(self, text, text_b):
        return self._classify({TEXT: text, TEXT_B: text_b})

    def _classify(self, batch: dict) -> dict:
        """Tokenizes and packs as in training, runs the model, combines a text's windows."""
        if self.long_texts == "windows":
            rows = window_features(self.tokenizer, batch, self.seq_length,
                                   doc_stride=self.doc_stride, with_cut=True,
                                   pad_to_longest=self.pad_to_longest)
            window_logits = self._run_windows(rows, [None, self.model.num_classes])  # (W, C)
            count = tf.shape(batch[TEXT])[0]
            example = rows[windows.EXAMPLE_INDEX]
            logits = windows.pool(window_logits, example, count, self.window_pooling)
            cut = tf.math.unsorted_segment_max(rows[CUT], example, count)
            padding = padding_counts(rows[INPUT_MASK], example, count)
        else:
            inputs = text_features(self.tokenizer, batch, self.seq_length, with_cut=True,
                                   head_tail=self.long_texts == "head_tail",
                                   pad_to_longest=self.pad_to_longest)
            logits, cut = self._run_model(inputs)[LOGITS], inputs[CUT]
            padding = padding_counts(inputs[INPUT_MASK])
        return {**self._answer(logits), TRUNCATED: cut > 0, **padding}

    def _answer(self, logits) -> dict:
        """The signature's outputs of the combined logits (batch, classes)."""
        probabilities = tf.nn.softmax(logits, axis=-1)  # (batch, classes)
        index = tf.argmax(logits, axis=-1, output_type=tf.int32)  # (batch,)
        return {PROBABILITIES: probabilities, LABEL_INDEX: index,
                LABEL_NAME: tf.gather(tf.constant(self.label_names), index)}
