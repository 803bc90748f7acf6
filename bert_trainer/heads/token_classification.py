"""Per-token classification head (tagging, e.g. named entities)."""

import keras

from bert_trainer.layers.initializers import clone_initializer


@keras.saving.register_keras_serializable(package="bert_trainer")
class TokenClassification(keras.layers.Layer):
    """sequence_output -> dropout -> dense: one logit vector per token.

    Args:
      num_classes: number of tags.
      dropout_rate: dropout on the sequence output.
      initializer: kernel initializer of `dense`.

    Sublayers: `dense` (Dense hidden -> num_classes, float32 under mixed precision).

    Call args:
      inputs: sequence output `[batch, seq, hidden]`.
      training: enables dropout.

    Returns:
      float32 logits `[batch, seq, num_classes]`.
    """

    def __init__(self, num_classes, dropout_rate=0.1, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        if not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"TokenClassification: num_classes must be a positive int, "
                             f"got {num_classes!r}")
        self.num_classes = num_classes
        self.dropout_rate = dropout_rate
        self.initializer = keras.initializers.get(initializer)
        self.dropout = keras.layers.Dropout(dropout_rate, name="dropout",
                                            dtype=self.dtype_policy)
        self.dense = keras.layers.Dense(
            num_classes, kernel_initializer=clone_initializer(self.initializer), name="logits",
            dtype=keras.DTypePolicy(self.dtype_policy.variable_dtype))

    def build(self, input_shape):
        self.dense.build(input_shape)
        self.built = True

    def call(self, inputs, training=None):
        return self.dense(self.dropout(inputs, training=training))  # (batch, seq, num_classes)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.num_classes)

    def get_config(self):
        config = super().get_config()
        config.update(num_classes=self.num_classes, dropout_rate=self.dropout_rate,
                      initializer=keras.initializers.serialize(self.initializer))
        return config
