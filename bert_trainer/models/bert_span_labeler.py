"""Extractive question answering: start/end logits over the tokens (SQuAD)."""

import keras

from bert_trainer import features
from bert_trainer.features import END_LOGITS, START_LOGITS
from bert_trainer.heads import SpanLabeling
from bert_trainer.layers.initializers import clone_initializer
from bert_trainer.models.encoder_model import EncoderModel


@keras.saving.register_keras_serializable(package="bert_trainer")
class BertSpanLabeler(EncoderModel):
    """encoder -> sequence_output -> `span_labeling` (`SpanLabeling`); padding never wins.

    Args:
      encoder: the encoder.
      initializer: head initializer (default: the encoder's).

    Call args:
      inputs: dict with the encoder inputs (`input_mask` also masks the logits).
      training: enables dropout in the encoder.

    Returns:
      dict `start_logits`, `end_logits`: float32 `[batch, seq]`.
    """

    def __init__(self, encoder, initializer=None, **kwargs):
        super().__init__(encoder, initializer=initializer, **kwargs)
        self.span_labeling = SpanLabeling(
            initializer=clone_initializer(self.initializer), name="span_labeling",
            dtype=self.dtype_policy)
        self.span_labeling.build((None, None, encoder.hidden_size))
        self.built = True  # every head is built above

    def call(self, inputs, training=None):
        sequence = self.encode(inputs, training=training)[features.SEQUENCE_OUTPUT]
        start, end = self.span_labeling(sequence, input_mask=inputs[features.INPUT_MASK])
        return {START_LOGITS: start, END_LOGITS: end}
