"""Per-token tagging (e.g. named entities) on the sequence output."""

import keras

from bert_trainer import features
from bert_trainer.features import LOGITS
from bert_trainer.heads import TokenClassification
from bert_trainer.layers.initializers import clone_initializer
from bert_trainer.models.encoder_model import EncoderModel


@keras.saving.register_keras_serializable(package="bert_trainer")
class BertTokenClassifier(EncoderModel):
    """encoder -> sequence_output -> `classifier` (`TokenClassification`).

    Args:
      encoder: the encoder.
      num_classes: number of tags.
      dropout_rate: dropout on the sequence output.
      initializer: head initializer (default: the encoder's).

    Call args:
      inputs: dict with the encoder inputs.
      training: enables dropout.

    Returns:
      dict `logits`: float32 `[batch, seq, num_classes]`.
    """

    def __init__(self, encoder, num_classes, dropout_rate=0.1, initializer=None, **kwargs):
        super().__init__(encoder, initializer=initializer, **kwargs)
        self.num_classes = num_classes
        self.dropout_rate = dropout_rate
        self.classifier = TokenClassification(
            num_classes, dropout_rate=dropout_rate, initializer=clone_initializer(self.initializer),
            name="classifier", dtype=self.dtype_policy)
        self.classifier.build((None, None, encoder.hidden_size))
        self.built = True  # every head is built above

    def call(self, inputs, training=None):
        sequence = self.encode(inputs, training=training)[features.SEQUENCE_OUTPUT]
        return {LOGITS: self.classifier(sequence, training=training)}

    def get_config(self):
        config = super().get_config()
        config.update(num_classes=self.num_classes, dropout_rate=self.dropout_rate)
        return config
