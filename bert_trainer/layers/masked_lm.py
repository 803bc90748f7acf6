"""The masked language model head with its output projection tied to the embedding table."""

import keras
from keras import ops

from bert_trainer.layers.initializers import clone_initializer
from bert_trainer.layers.layer_normalization import LayerNormalization
from bert_trainer.layers.positions import gather_positions
from bert_trainer.layers.tied_projection import matmul_transposed

_OUTPUTS = ("logits", "predictions")


@keras.saving.register_keras_serializable(package="bert_trainer")
class MaskedLM(keras.layers.Layer):
    """Predicts the original tokens at the masked positions.

        x = sequence_output gathered at masked_positions           # (batch, P, hidden)
        x = layer_norm(activation(dense(x)))                        # (batch, P, width)
        logits = x @ embedding_table^T + bias                       # (batch, P, vocab)

    The projection reuses the encoder's word-embedding table (`[vocab, width]`; `width`
    may differ from `hidden` for factorized embeddings), so the table gets gradients from
    both ends. Under a mixed policy (e.g. "mixed_bfloat16") the transform runs in the
    policy's compute dtype, but by default the projection computes in the variable dtype:
    the table and bias are read unrounded and the logits come out float32. With
    `projection_in_compute_dtype=True` the projection (for BERT-base pretraining about a
    sixth of the FLOPs, for small models more) runs in the compute dtype as well, as
    Model Garden on TPU and PyTorch's autocast do; the logits are then rounded to that
    dtype before the float32 bias and come out float32.

    Serialization: a variable cannot live in a config, so `get_config()` records the
    table's shape `[vocab, width]` under `embedding_table`, and a `MaskedLM` built from
    that config owns a new table of that shape (untied; `.keras` loading then fills it).
    Models that tie the table (`BertPretrainer`) re-tie it in their own `from_config`.

    Sublayers / weights (public; the checkpoint converters use them):
      dense: Dense hidden -> width with `activation`.
      layer_norm: LayerNormalization (epsilon 1e-12).
      bias: `[vocab]` output bias.
      embedding_table: the tied (or own) `[vocab, width]` table.

    Args:
      embedding_table: the `[vocab, width]` variable to tie to (usually
        `encoder.get_embedding_table()`), or a `(vocab, width)` shape to own a new table.
      activation: activation of the dense transform (BERT uses "gelu").
      initializer: initializer of the dense kernel (and of an owned table).
      output: "logits", or "predictions" for log-probabilities (log-softmax of the logits).
        Kept as `output_type`: `output` is a read-only property of every Keras layer.
      projection_in_compute_dtype: run the tied projection in the policy's compute dtype
        (e.g. bfloat16) instead of reading the float32 table; no effect under float32.

    Call args:
      inputs: sequence output `[batch, seq, hidden]`.
      masked_positions: int `[batch, P]` positions to predict; `None` predicts every position.

    Returns:
      float32 `[batch, P, vocab]` logits or log-probabilities.
    """

    def __init__(self, embedding_table, activation=None, initializer="glorot_uniform",
                 output="logits", projection_in_compute_dtype=False, **kwargs):
        super().__init__(**kwargs)
        if output not in _OUTPUTS:
            raise ValueError(f"MaskedLM: output must be one of {_OUTPUTS}, got {output!r}")
        # The transform uses the requested policy; the projection must read the float32
        # table, not a bfloat16 copy, so this layer computes in the variable dtype.
        self.transform_dtype_policy = self.dtype_policy
        self.dtype_policy = keras.DTypePolicy(self.transform_dtype_policy.variable_dtype)
        self.activation = keras.activations.get(activation)
        self.initializer = keras.initializers.get(initializer)
        self.output_type = output
        self.projection_in_compute_dtype = bool(projection_in_compute_dtype)
        if isinstance(embedding_table, (list, tuple)):
            self.embedding_table = self.add_weight(
                name="embedding_table", shape=tuple(embedding_table),
                initializer=clone_initializer(self.initializer))
        else:
            # Assigning tracks the variable: a .keras file stores it here and with the
            # encoder (same values); a tf.train.Checkpoint stores it once.
            self.embedding_table = embedding_table
        if len(self.embedding_table.shape) != 2:
            raise ValueError(f"MaskedLM: embedding_table must be [vocab, width], got shape "
                             f"{tuple(self.embedding_table.shape)}")
        vocab_size, width = self.embedding_table.shape
        self.dense = keras.layers.Dense(
            width, activation=self.activation,
            kernel_initializer=clone_initializer(self.initializer), name="transform",
            dtype=self.transform_dtype_policy)
        self.layer_norm = LayerNormalization(
            epsilon=1e-12, name="transform_layer_norm", dtype=self.transform_dtype_policy)
        self.bias = self.add_weight(name="bias", shape=(vocab_size,), initializer="zeros")

    def build(self, input_shape):
        self.dense.build(input_shape)
        self.layer_norm.build((*input_shape[:-1], self.embedding_table.shape[1]))
        self.built = True

    def call(self, inputs, masked_positions=None):
        x = inputs  # (batch, seq, hidden)
        if masked_positions is not None:
            if len(masked_positions.shape) != 2:
                raise ValueError(f"MaskedLM '{self.name}': masked_positions must be [batch, P], "
                                 f"got shape {tuple(masked_positions.shape)}")
            x = gather_positions(x, masked_positions)  # (batch, P, hidden)
        x = self.layer_norm(self.dense(x))  # (batch, P, width), transform dtype
        dtype = (self.transform_dtype_policy.compute_dtype if self.projection_in_compute_dtype
                 else self.compute_dtype)
        table = ops.cast(self.embedding_table, dtype)
        # 2-D, with ops.add (BiasAdd): TensorFlow fuses the bias into the matmul in float32.
        rows = ops.reshape(ops.cast(x, dtype), (-1, x.shape[-1]))
        logits = matmul_transposed(rows, table)  # (batch * P, vocab)
        logits = ops.add(ops.cast(logits, self.compute_dtype), self.bias)  # float32
        logits = ops.reshape(logits, (*ops.shape(x)[:-1], -1))
        if self.output_type == "predictions":
            return ops.log_softmax(logits, axis=-1)
        return logits  # (batch, P, vocab)

    def compute_output_shape(self, inputs_shape, masked_positions_shape=None):
        length = inputs_shape[1] if masked_positions_shape is None else masked_positions_shape[1]
        return (inputs_shape[0], length, self.embedding_table.shape[0])

    def get_config(self):
        config = super().get_config()
        config.update(
            embedding_table=list(self.embedding_table.shape),
            activation=keras.activations.serialize(self.activation),
            initializer=keras.initializers.serialize(self.initializer),
            output=self.output_type,
            projection_in_compute_dtype=self.projection_in_compute_dtype,
            # The requested policy, not the float32 one this layer computes in.
            dtype=keras.dtype_policies.serialize(self.transform_dtype_policy),
        )
        return config
