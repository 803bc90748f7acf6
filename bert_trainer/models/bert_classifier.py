"""Sentence (pair) classification or regression on the pooled output (or the tokens' mean)."""

import keras
from keras import ops

from bert_trainer import features
from bert_trainer.features import LOGITS
from bert_trainer.heads import ClassificationHead
from bert_trainer.layers.initializers import clone_initializer
from bert_trainer.models.encoder_model import EncoderModel

POOLINGS = ("cls", "mean")


@keras.saving.register_keras_serializable(package="bert_trainer")
class BertClassifier(EncoderModel):
    """encoder -> pooled_output -> `classifier` (`ClassificationHead`).

    Args:
      encoder: the encoder.
      num_classes: number of classes; 1 for regression.
      dropout_rate: dropout on the pooled output.
      initializer: head initializer (default: the encoder's).
      pooling: what the head reads: "cls" (the encoder's `pooled_output`, BERT's) or "mean"
        (the mean of `sequence_output` over the real tokens, as Sentence-BERT pools): an
        encoder whose [CLS] and pooler pretraining did not train (masked LM alone, a short
        run) still gives every token's state to the head.

    Call args:
      inputs: dict with the encoder inputs.
      training: enables dropout.

    Returns:
      dict `logits`: float32 `[batch, num_classes]`.
    """

    def __init__(self, encoder, num_classes, dropout_rate=0.1, initializer=None, pooling="cls",
                 **kwargs):
        if pooling not in POOLINGS:
            raise ValueError(f"pooling={pooling!r} is unknown; use one of {', '.join(POOLINGS)}")
        super().__init__(encoder, initializer=initializer, **kwargs)
        self.num_classes = num_classes
        self.dropout_rate = dropout_rate
        self.pooling = pooling
        self.classifier = ClassificationHead(
            num_classes, dropout_rate=dropout_rate, initializer=clone_initializer(self.initializer),
            name="classifier", dtype=self.dtype_policy)
        self.classifier.build((None, encoder.hidden_size))
        self.built = True  # every head is built above

    def call(self, inputs, training=None):
        if self.pooling == "mean":
            tokens = self.encode(inputs, training=training)[features.SEQUENCE_OUTPUT]
            mask = ops.cast(inputs[features.INPUT_MASK], tokens.dtype)[..., None]
            pooled = ops.sum(tokens * mask, axis=1) / ops.maximum(ops.sum(mask, axis=1), 1)
        else:
            pooled = self.encode(inputs, training=training,
                                 pooled_only=True)[features.POOLED_OUTPUT]
        return {LOGITS: self.classifier(pooled, training=training)}

    def get_config(self):
        config = super().get_config()
        config.update(num_classes=self.num_classes, dropout_rate=self.dropout_rate,
                      pooling=self.pooling)
        return config
