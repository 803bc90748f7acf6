"""Learned absolute position embeddings, as in BERT."""

import keras
from keras import ops

from bert_trainer.layers.initializers import clone_initializer


@keras.saving.register_keras_serializable(package="bert_trainer")
class PositionEmbedding(keras.layers.Layer):
    """A learned `[max_length, width]` table, sliced to the input's sequence length.

    Args:
      max_length: the longest sequence the layer accepts (rows of the table).
      initializer: initializer of the table.

    Call args:
      inputs: `[batch, seq, width]` (usually the word embeddings); only its shape is used.

    Returns:
      `[batch, seq, width]`: row `p` of the table at sequence position `p`.

    Raises:
      ValueError: when `seq > max_length` (checked on the static shape, i.e. always in
        eager mode and for fixed-length graphs; a dynamic length fails in the slice op).
    """

    def __init__(self, max_length, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        if not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"PositionEmbedding: max_length must be a positive int, "
                             f"got {max_length!r}")
        self.max_length = max_length
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape):
        width = input_shape[-1]
        if width is None:
            raise ValueError(f"PositionEmbedding '{self.name}': the last input dimension must be "
                             f"known, got shape {tuple(input_shape)}")
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.max_length, width),
            initializer=clone_initializer(self.initializer),
        )
        self.built = True

    def call(self, inputs):
        static_length = inputs.shape[1]
        if static_length is not None and static_length > self.max_length:
            raise ValueError(
                f"PositionEmbedding '{self.name}': sequence length {static_length} is longer than "
                f"max_length={self.max_length}; truncate the input or raise max_sequence_length")
        shape = ops.shape(inputs)
        table = ops.slice(self.embeddings, (0, 0), (shape[1], shape[2]))  # (seq, width)
        return ops.broadcast_to(table[None], shape)  # (batch, seq, width)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(max_length=self.max_length,
                      initializer=keras.initializers.serialize(self.initializer))
        return config
