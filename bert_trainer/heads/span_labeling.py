"""Start/end span logits for extractive question answering (SQuAD)."""

import keras
from keras import ops

from bert_trainer.layers.initializers import clone_initializer

# Added where input_mask is 0: exp() of it underflows to exactly 0 in float32, so a padding
# position gets zero probability and can never be the argmax.
PADDING_LOGIT = -1e9


@keras.saving.register_keras_serializable(package="bert_trainer")
class SpanLabeling(keras.layers.Layer):
    """sequence_output -> dense(2) -> start and end logits per token; padding never wins.

    Args:
      initializer: kernel initializer of `dense`.

    Sublayers: `dense` (Dense hidden -> 2: start, end; float32 under mixed precision).

    Call args:
      inputs: sequence output `[batch, seq, hidden]`.
      input_mask: `[batch, seq]`, 1 for real tokens, 0 for padding. `None`: no padding.

    Returns:
      `(start_logits, end_logits)`, each float32 `[batch, seq]`; `PADDING_LOGIT` where
      `input_mask` is 0.
    """

    def __init__(self, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.initializer = keras.initializers.get(initializer)
        self.dense = keras.layers.Dense(
            2, kernel_initializer=clone_initializer(self.initializer), name="span_logits",
            dtype=keras.DTypePolicy(self.dtype_policy.variable_dtype))

    def build(self, inputs_shape, input_mask_shape=None):
        self.dense.build(inputs_shape)
        self.built = True

    def call(self, inputs, input_mask=None):
        logits = self.dense(inputs)  # (batch, seq, 2) float32
        if input_mask is not None:
            real = ops.cast(input_mask, "bool")[:, :, None]  # (batch, seq, 1)
            logits = ops.where(real, logits, ops.cast(PADDING_LOGIT, logits.dtype))
        return logits[:, :, 0], logits[:, :, 1]

    def compute_output_shape(self, inputs_shape, input_mask_shape=None):
        return tuple(inputs_shape[:2]), tuple(inputs_shape[:2])

    def get_config(self):
        config = super().get_config()
        config.update(initializer=keras.initializers.serialize(self.initializer))
        return config
