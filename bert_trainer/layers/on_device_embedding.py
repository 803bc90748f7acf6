"""Token embedding lookup: a gather, or a one-hot matmul for accelerators."""

import keras
from keras import ops

from bert_trainer.layers.initializers import clone_initializer


@keras.saving.register_keras_serializable(package="bert_trainer")
class OnDeviceEmbedding(keras.layers.Layer):
    """Maps integer ids to vectors of a learned `[vocab_size, embedding_width]` table.

    `use_one_hot=False` gathers rows; `use_one_hot=True` multiplies a one-hot matrix by
    the table, which is faster on TPUs for small vocabularies (e.g. token types). Both
    give the same outputs and the same gradients.

    Args:
      vocab_size: number of rows of the table (ids must lie in `[0, vocab_size)`).
      embedding_width: size of each embedding vector.
      initializer: initializer of the table.
      use_one_hot: look ids up by one-hot matmul instead of gather.
      scale_factor: if set, outputs are multiplied by this number.

    Call args:
      inputs: integer ids, any shape `[...]`.

    Returns:
      `[..., embedding_width]` embeddings in the layer's compute dtype.
    """

    def __init__(self, vocab_size, embedding_width, initializer="glorot_uniform",
                 use_one_hot=False, scale_factor=None, **kwargs):
        super().__init__(**kwargs)
        for arg, value in (("vocab_size", vocab_size), ("embedding_width", embedding_width)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"OnDeviceEmbedding: {arg} must be a positive int, got {value!r}")
        self.vocab_size = vocab_size
        self.embedding_width = embedding_width
        self.initializer = keras.initializers.get(initializer)
        self.use_one_hot = use_one_hot
        self.scale_factor = scale_factor

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocab_size, self.embedding_width),
            initializer=clone_initializer(self.initializer),
        )
        self.built = True

    def call(self, inputs):
        dtype = keras.backend.standardize_dtype(inputs.dtype)
        if "int" not in dtype:
            raise ValueError(f"OnDeviceEmbedding '{self.name}': ids must be integers, got {dtype}; "
                             "cast the ids to int32")
        if self.use_one_hot:
            one_hot = ops.one_hot(inputs, self.vocab_size, dtype=self.compute_dtype)  # (..., vocab)
            outputs = ops.matmul(one_hot, self.embeddings)  # (..., width)
        else:
            outputs = ops.take(self.embeddings, inputs, axis=0)  # (..., width)
        if self.scale_factor is not None:
            outputs = outputs * ops.cast(self.scale_factor, outputs.dtype)
        return outputs

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.embedding_width)

    def get_config(self):
        config = super().get_config()
        config.update(
            vocab_size=self.vocab_size,
            embedding_width=self.embedding_width,
            initializer=keras.initializers.serialize(self.initializer),
            use_one_hot=self.use_one_hot,
            scale_factor=self.scale_factor,
        )
        return config
