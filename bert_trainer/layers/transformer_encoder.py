"""One Transformer encoder block: self-attention then a two-layer feed-forward network."""

import keras
from keras import ops

from bert_trainer.layers.dropout import Dropout
from bert_trainer.layers.gelu import gelu
from bert_trainer.layers.initializers import clone_initializer
from bert_trainer.layers.layer_normalization import LayerNormalization
from bert_trainer.layers.multi_head_attention import MultiHeadAttention
from bert_trainer.layers.positions import gather_positions


def _data_shape(input_shape):
    """The data shape from `build`'s argument: a shape, or `[data_shape, mask_shape]`."""
    if input_shape and isinstance(input_shape[0], (list, tuple)):
        return tuple(input_shape[0])
    return tuple(input_shape)


@keras.saving.register_keras_serializable(package="bert_trainer")
class TransformerEncoder(keras.layers.Layer):
    """The Transformer encoder block of "Attention Is All You Need", as used by BERT.

    Post-norm (BERT, `norm_first=False`):
        x = LN(x + dropout(attention(x)));  x = LN(x + dropout(ffn(x)))
    Pre-norm (`norm_first=True`):
        x = x + dropout(attention(LN(x)));  x = x + dropout(ffn(LN(x)))
    with ffn(x) = output_dense(dropout(inner_activation(intermediate_dense(x)))).

    Sublayers (public, the checkpoint converters map weights onto them):
      attention_layer: `bert_trainer.layers.MultiHeadAttention`, a subclass of
        `keras.layers.MultiHeadAttention` with its weights and a leaner computation (one
        fused Q/K/V matmul, an additive mask bias); its `query_dense`, `key_dense`,
        `value_dense` have kernel `[hidden, heads, head_dim]` and bias `[heads, head_dim]`,
        its `output_dense` kernel `[heads, head_dim, hidden]` and bias `[hidden]`.
      attention_layer_norm: `bert_trainer.layers.LayerNormalization` (Keras' with a cheaper
        gradient) after (post-norm) or before (pre-norm) attention.
      intermediate_dense: Dense hidden -> inner_dim with `inner_activation` (the exact
        "gelu" runs as `bert_trainer.layers.gelu`: the same values, a cheaper gradient).
      output_dense: Dense inner_dim -> hidden.
      output_layer_norm: LayerNormalization after (post-norm) or before (pre-norm) the ffn.

    Args:
      num_attention_heads: number of heads; must divide the hidden size (the input width).
      inner_dim: width of the feed-forward network's first layer.
      inner_activation: activation of that layer.
      output_range: if set, only positions `[0, output_range)` are computed as queries
        (they still attend to the whole sequence); the output is `[batch, output_range, hidden]`.
      kernel_initializer, bias_initializer: initializers of every kernel and bias.
      kernel_regularizer, bias_regularizer, kernel_constraint, bias_constraint: applied to
        every kernel / bias.
      activity_regularizer: Keras' own: a regularizer on this layer's output.
      use_bias: whether the attention projections have biases.
      norm_first: pre-norm instead of BERT's post-norm.
      norm_epsilon: epsilon of both LayerNormalizations.
      output_dropout: dropout on the attention output and the ffn output.
      attention_dropout: dropout on the attention probabilities.
      inner_dropout: dropout after the inner activation.
      attention_initializer: kernel initializer of the attention projections; `None` uses
        `kernel_initializer`.

    Call args:
      inputs: `data` `[batch, seq, hidden]`, or the RFC's list `[data, attention_mask]`.
      attention_mask: `[batch, seq]` padding mask (the cheapest: it is broadcast over
        queries and heads) or `[batch, seq, seq]` (from `SelfAttentionMask`); 1 = may
        attend. `None` attends everywhere.
      training: enables dropout.
      output_positions: int `[batch, K]`: compute only these positions as queries (they
        still attend to the whole sequence); the output is `[batch, K, hidden]`, row k the
        layer's output at position `output_positions[:, k]`. For a last layer whose other
        outputs nobody reads (pretraining reads [CLS] and the masked positions): the same
        values for a fraction of the cost. Not with `output_range`.
      packing: a `TokenPacking`: `data` is its packed `[tokens, hidden]` rows and the mask
        is the `[batch, seq]` padding mask; the layer computes those tokens only and returns
        them packed (or, with `output_positions`, `[batch, K, hidden]`).

    Returns:
      `[batch, seq or output_range or K, hidden]` (packed: `[tokens, hidden]`).
    """

    def __init__(self, num_attention_heads, inner_dim, inner_activation="gelu", output_range=None,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 kernel_regularizer=None, bias_regularizer=None, activity_regularizer=None,
                 kernel_constraint=None, bias_constraint=None, use_bias=True, norm_first=False,
                 norm_epsilon=1e-12, output_dropout=0.0, attention_dropout=0.0, inner_dropout=0.0,
                 attention_initializer=None, **kwargs):
        super().__init__(activity_regularizer=activity_regularizer, **kwargs)
        if output_range is not None and (not isinstance(output_range, int) or output_range < 1):
            raise ValueError(f"TransformerEncoder: output_range must be None or a positive int, "
                             f"got {output_range!r}")
        self.num_attention_heads = num_attention_heads
        self.inner_dim = inner_dim
        self.inner_activation = keras.activations.get(inner_activation)
        self.output_range = output_range
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        self.use_bias = use_bias
        self.norm_first = norm_first
        self.norm_epsilon = norm_epsilon
        self.output_dropout = output_dropout
        self.attention_dropout = attention_dropout
        self.inner_dropout = inner_dropout
        self.attention_initializer = (None if attention_initializer is None
                                      else keras.initializers.get(attention_initializer))

    def _dense_kwargs(self):
        """Constructor kwargs shared by the attention and feed-forward projections."""
        return dict(kernel_regularizer=self.kernel_regularizer,
                    bias_regularizer=self.bias_regularizer,
                    kernel_constraint=self.kernel_constraint,
                    bias_constraint=self.bias_constraint,
                    bias_initializer=clone_initializer(self.bias_initializer),
                    dtype=self.dtype_policy)

    def _attention_sublayer(self, hidden, name):
        """A `MultiHeadAttention` over `hidden`-wide inputs with this block's settings."""
        return MultiHeadAttention(
            num_heads=self.num_attention_heads,
            key_dim=hidden // self.num_attention_heads,
            dropout=self.attention_dropout,
            use_bias=self.use_bias,
            kernel_initializer=clone_initializer(
                self.attention_initializer or self.kernel_initializer),
            name=name, **self._dense_kwargs())

    def _build_dropouts(self):
        """The block's dropout sublayers, with its rates.

        Named like the other sublayers so the layer tree (summaries, Keras paths) does not
        depend on how many Dropout layers the process created before ("dropout_17").
        """
        policy = self.dtype_policy
        self.attention_output_dropout = Dropout(
            self.output_dropout, name="attention_output_dropout", dtype=policy)
        self.inner_dropout_layer = Dropout(
            self.inner_dropout, name="inner_dropout", dtype=policy)
        self.output_dropout_layer = Dropout(
            self.output_dropout, name="output_dropout", dtype=policy)

    def build(self, input_shape):
        data_shape = _data_shape(input_shape)  # (batch, seq, hidden)
        if len(data_shape) != 3 or data_shape[-1] is None:
            raise ValueError(f"TransformerEncoder '{self.name}': data must be [batch, seq, hidden] "
                             f"with a known hidden size, got shape {data_shape}")
        hidden = data_shape[-1]
        if hidden % self.num_attention_heads:
            raise ValueError(f"TransformerEncoder '{self.name}': hidden size {hidden} is not "
                             f"divisible by num_attention_heads={self.num_attention_heads}")
        self.attention_layer = self._attention_sublayer(hidden, "attention")
        self.attention_layer_norm = LayerNormalization(
            epsilon=self.norm_epsilon, name="attention_layer_norm", dtype=self.dtype_policy)
        self.intermediate_dense = keras.layers.Dense(
            self.inner_dim, activation=self._fast_activation(), name="intermediate",
            kernel_initializer=clone_initializer(self.kernel_initializer), **self._dense_kwargs())
        self.output_dense = keras.layers.Dense(
            hidden, name="output", kernel_initializer=clone_initializer(self.kernel_initializer),
            **self._dense_kwargs())
        self.output_layer_norm = LayerNormalization(
            epsilon=self.norm_epsilon, name="output_layer_norm", dtype=self.dtype_policy)
        self._build_dropouts()

        self.attention_layer.build(data_shape, data_shape)
        self.attention_layer_norm.build(data_shape)
        self.intermediate_dense.build(data_shape)
        self.output_dense.build((*data_shape[:-1], self.inner_dim))
        self.output_layer_norm.build(data_shape)
        self.built = True

    def _fast_activation(self):
        """`inner_activation`, or the same function with a cheaper gradient (exact GELU)."""
        if self.inner_activation is keras.activations.gelu:  # "gelu": the exact erf form
            return gelu
        return self.inner_activation

    def call(self, inputs, attention_mask=None, training=None, output_positions=None,
             packing=None):
        data, attention_mask = self._unpack(inputs, attention_mask)  # (batch, seq, hidden)
        if attention_mask is not None and len(attention_mask.shape) == 2:
            attention_mask = attention_mask[:, None, :]  # padding mask -> (batch, 1, seq)
        if packing is not None and (attention_mask is None or attention_mask.shape[1] != 1):
            raise ValueError(f"TransformerEncoder '{self.name}': packed data needs a [batch, seq] "
                             "padding mask")
        select = self._query_selector(output_positions, packing)  # None: every position
        # Only the selected positions are queries; keys/values stay whole.
        target = data if select is None else select(data)  # (batch, queries, hidden)
        if select is not None and attention_mask is not None and attention_mask.shape[1] != 1:
            attention_mask = select(attention_mask)  # (batch, queries, seq)
        if self.norm_first:
            source = self.attention_layer_norm(data)
            query = source if select is None else select(source)
        else:
            source, query = data, target
        attention = self.attention_layer(query=query, value=source, key=source,
                                         attention_mask=attention_mask, training=training,
                                         **({} if packing is None else {"packing": packing}))
        x = target + self.attention_output_dropout(attention, training=training)
        if not self.norm_first:
            x = self.attention_layer_norm(x)

        ffn_input = self.output_layer_norm(x) if self.norm_first else x
        # The FFN on [batch * range, hidden] rows: 2-D matmuls, which TensorFlow fuses with
        # the bias adds that follow (on rank 3 a reshape sits between them).
        shape = ops.shape(ffn_input)
        rows = ops.reshape(ffn_input, (-1, ffn_input.shape[-1]))
        inner = self.intermediate_dense(rows)  # (batch * range, inner_dim)
        inner = self.inner_dropout_layer(inner, training=training)
        ffn = ops.reshape(self.output_dense(inner), shape)
        ffn = self.output_dropout_layer(ffn, training=training)
        x = x + ffn
        if not self.norm_first:
            x = self.output_layer_norm(x)
        return x

    def _query_selector(self, output_positions, packing=None):
        """The function taking `[batch, seq, .]` (or packed `[tokens, .]`) to the query rows,
        or None for all of them."""
        if output_positions is not None:
            if self.output_range is not None:
                raise ValueError(f"TransformerEncoder '{self.name}': output_positions and "
                                 f"output_range={self.output_range} cannot both be set")
            if packing is not None:
                return lambda x: packing.gather(x, output_positions)
            return lambda x: gather_positions(x, output_positions)
        if packing is not None and self.output_range is not None:
            raise ValueError(f"TransformerEncoder '{self.name}': packed data cannot take "
                             f"output_range={self.output_range}")
        if self.output_range is not None:
            return lambda x: x[:, : self.output_range, :]
        return None

    def _unpack(self, inputs, attention_mask):
        """Accepts `data` with `attention_mask=` or the RFC's `[data, attention_mask]`."""
        if not isinstance(inputs, (list, tuple)):
            return inputs, attention_mask
        if attention_mask is not None or len(inputs) not in (1, 2):
            raise ValueError(f"TransformerEncoder '{self.name}': pass [data, attention_mask] or "
                             "data with attention_mask=..., not both")
        return inputs[0], (inputs[1] if len(inputs) == 2 else None)

    def compute_output_shape(self, input_shape):
        batch, seq, hidden = _data_shape(input_shape)
        if self.output_range is not None:
            seq = self.output_range if seq is None else min(seq, self.output_range)
        return (batch, seq, hidden)

    def get_config(self):
        config = super().get_config()
        serialize = keras.initializers.serialize
        config.update(
            num_attention_heads=self.num_attention_heads,
            inner_dim=self.inner_dim,
            inner_activation=keras.activations.serialize(self.inner_activation),
            output_range=self.output_range,
            kernel_initializer=serialize(self.kernel_initializer),
            bias_initializer=serialize(self.bias_initializer),
            kernel_regularizer=keras.regularizers.serialize(self.kernel_regularizer),
            bias_regularizer=keras.regularizers.serialize(self.bias_regularizer),
            kernel_constraint=keras.constraints.serialize(self.kernel_constraint),
            bias_constraint=keras.constraints.serialize(self.bias_constraint),
            use_bias=self.use_bias,
            norm_first=self.norm_first,
            norm_epsilon=self.norm_epsilon,
            output_dropout=self.output_dropout,
            attention_dropout=self.attention_dropout,
            inner_dropout=self.inner_dropout,
            attention_initializer=(None if self.attention_initializer is None
                                   else serialize(self.attention_initializer)),
        )
        return config
