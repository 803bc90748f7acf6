"""One Transformer decoder block: causal self-attention, cross-attention, feed-forward."""

import keras
from keras import ops

from bert_trainer.layers.dropout import Dropout
from bert_trainer.layers.layer_normalization import LayerNormalization
from bert_trainer.layers.self_attention_mask import causal_mask
from bert_trainer.layers.transformer_encoder import TransformerEncoder, _data_shape

# Cache keys: the self-attention's keys and values, written at the decode index; the
# cross-attention's, projected once from the encoder output (optional).
KEY, VALUE, CROSS_KEY, CROSS_VALUE = "key", "value", "cross_key", "cross_value"


@keras.saving.register_keras_serializable(package="bert_trainer")
class TransformerDecoder(TransformerEncoder):
    """The Transformer decoder block of "Attention Is All You Need".

    Post-norm (BERT, `norm_first=False`):
        x = LN(x + dropout(causal_self_attention(x)))
        x = LN(x + dropout(cross_attention(x, encoder_output)))
        x = LN(x + dropout(ffn(x)))
    Pre-norm (`norm_first=True`): `x = x + dropout(sublayer(LN(x)))` for each of the three.
    `use_cross_attention=False` drops the middle one: the decoder-only (GPT) block.

    It is a `TransformerEncoder` (same arguments, feed-forward network, initializers and
    dropouts) whose attention is causal and which adds the cross-attention. Sublayers are
    named so that BERT's layer `i` maps onto decoder layer `i` (BERT2BERT warm start):
      self_attention: `bert_trainer.layers.MultiHeadAttention` (also `attention_layer`).
      self_attention_layer_norm: its LayerNormalization (also `attention_layer_norm`).
      cross_attention, cross_attention_layer_norm: over the encoder output (None without).
      intermediate_dense, output_dense, output_layer_norm: the feed-forward network.

    Incremental decoding keeps a cache per layer (`init_cache`), a dict of
      "key", "value": `[batch, heads, max_length, head_dim]` self-attention keys and values
        (heads before positions: the layout attention reads, so no copy per step);
      "cross_key", "cross_value" (optional): `[batch, heads, source, head_dim]`, the
        cross-attention's keys and values, projected once instead of at every step.
    Axis 0 is the batch in every entry (beam search tiles and gathers along it). A step
    writes its keys/values at `decode_index` and attends to positions `<= decode_index`,
    which gives the full causal pass's outputs position by position.

    Args:
      num_attention_heads, inner_dim, inner_activation, output_dropout, attention_dropout,
      inner_dropout, norm_first, norm_epsilon, kernel_initializer, bias_initializer,
      use_bias, attention_initializer, and the regularizers/constraints: as
        `TransformerEncoder` (output_range is not taken).
      use_cross_attention: whether the block attends to an encoder output.

    Call args:
      inputs: `[batch, target, hidden]`.
      encoder_output: `[batch, source, hidden]` (needed with cross-attention, unless the
        cache holds its projected keys/values).
      encoder_mask: `[batch, source]`, 1 = real token; None attends to every position.
      self_attention_mask: `[batch, target, target]` (or, with a cache,
        `[batch, target, max_length]`), 1 = may attend; None: causal. A given mask is used
        as it is (make it causal, e.g. with `CausalAttentionMask`).
      cache: a dict from `init_cache`; then `decode_index` (int32 scalar, the position of
        `inputs`' first row) is required.
      training: enables dropout.
      packing: a `TokenPacking` of the target slots (their real tokens, right-padded), with
        `inputs` its packed `[tokens, hidden]` rows: every dense layer, LayerNorm and the
        feed-forward network run on those rows only, attention unpacks around itself, and
        the output is packed too (no cache; the causal mask hides the padding after each
        row's tokens). Training on the CPU outside XLA, where shapes may vary.

    Returns:
      `[batch, target, hidden]`, or `(outputs, new_cache)` when `cache` is given.
    """

    def __init__(self, num_attention_heads, inner_dim, inner_activation="gelu",
                 output_dropout=0.0, attention_dropout=0.0, inner_dropout=0.0, norm_first=False,
                 norm_epsilon=1e-12, kernel_initializer="glorot_uniform",
                 bias_initializer="zeros", use_bias=True, use_cross_attention=True, **kwargs):
        if kwargs.get("output_range") is not None:
            raise ValueError("TransformerDecoder: output_range is not supported")
        kwargs.pop("output_range", None)
        super().__init__(
            num_attention_heads, inner_dim, inner_activation=inner_activation,
            kernel_initializer=kernel_initializer, bias_initializer=bias_initializer,
            use_bias=use_bias, norm_first=norm_first, norm_epsilon=norm_epsilon,
            output_dropout=output_dropout, attention_dropout=attention_dropout,
            inner_dropout=inner_dropout, **kwargs)
        self.use_cross_attention = use_cross_attention

    def share_weights_with(self, encoder_layer):
        """Uses `encoder_layer`'s self-attention, feed-forward network and layer norms as this
        block's own (the same variables: "BERTShare"); only the cross-attention is new.
        Call before the block is built.

        Args:
          encoder_layer: a built `TransformerEncoder` of the decoder's width.
        """
        if self.built:
            raise ValueError(f"TransformerDecoder '{self.name}': share weights before building")
        if not encoder_layer.built or encoder_layer.norm_first != self.norm_first:
            raise ValueError(f"TransformerDecoder '{self.name}': the shared encoder layer must "
                             "be built, with the same norm_first")
        self._shared_block = encoder_layer

    def build(self, input_shape):
        shared = getattr(self, "_shared_block", None)
        if shared is None:
            # The encoder's build makes the self-attention and the feed-forward network.
            super().build(input_shape)
        else:
            for name in ("attention_layer", "attention_layer_norm", "intermediate_dense",
                         "output_dense", "output_layer_norm"):
                setattr(self, name, getattr(shared, name))
            self._build_dropouts()  # the dropouts stay this block's own (its rates)
        data_shape = _data_shape(input_shape)
        hidden = data_shape[-1]
        self.cross_attention = None
        self.cross_attention_layer_norm = None
        if self.use_cross_attention:
            self.cross_attention = self._attention_sublayer(hidden, "cross_attention")
            self.cross_attention_layer_norm = LayerNormalization(
                epsilon=self.norm_epsilon, name="cross_attention_layer_norm",
                dtype=self.dtype_policy)
            self.cross_attention_dropout = Dropout(
                self.output_dropout, name="cross_attention_dropout", dtype=self.dtype_policy)
            # The encoder output is assumed as wide as the decoder (BERT2BERT, one hidden size).
            self.cross_attention.build(data_shape, data_shape)
            self.cross_attention_layer_norm.build(data_shape)
        self.built = True

    # The RFC's names for the self-attention sublayers (the encoder's attributes hold them).
    @property
    def self_attention(self):
        return self.attention_layer

    @property
    def self_attention_layer_norm(self):
        return self.attention_layer_norm

    def init_cache(self, batch_size, max_length, encoder_output=None):
        """An empty cache for decoding up to `max_length` positions.

        Args:
          batch_size: rows (int or scalar tensor).
          max_length: positions the cache holds (static int: the cache's shape is fixed).
          encoder_output: optional `[batch, source, hidden]`: its cross-attention keys and
            values are projected now and kept in the cache (steps then skip that projection).

        Returns:
          dict of tensors in the compute dtype (layout in the class docstring).
        """
        if not self.built:
            raise ValueError(f"TransformerDecoder '{self.name}': build (or call) the layer "
                             "before init_cache")
        heads = self.num_attention_heads
        head_dim = self.attention_layer.key_dim
        shape = (batch_size, heads, max_length, head_dim)
        cache = {KEY: ops.zeros(shape, self.compute_dtype),
                 VALUE: ops.zeros(shape, self.compute_dtype)}
        if encoder_output is not None and self.use_cross_attention:
            cross_key, cross_value = self.cross_attention.project_key_value(
                ops.cast(encoder_output, self.compute_dtype))
            cache.update({CROSS_KEY: cross_key, CROSS_VALUE: cross_value})
        return cache

    def call(self, inputs, encoder_output=None, encoder_mask=None, self_attention_mask=None,
             cache=None, decode_index=None, training=None, packing=None):
        x = inputs  # (batch, target, hidden), or packed (tokens, hidden)
        if len(x.shape) != (2 if packing is not None else 3):
            raise ValueError(f"TransformerDecoder '{self.name}': inputs must be [batch, target, "
                             f"hidden] (with packing: [tokens, hidden]), got shape "
                             f"{tuple(x.shape)}")
        if cache is not None and decode_index is None:
            raise ValueError(f"TransformerDecoder '{self.name}': a cache needs decode_index")
        if packing is not None and cache is not None:
            raise ValueError(f"TransformerDecoder '{self.name}': packed inputs take no cache")
        attention_kwargs = {} if packing is None else {"packing": packing}
        has_cross_cache = cache is not None and CROSS_KEY in cache
        if self.use_cross_attention and encoder_output is None and not has_cross_cache:
            raise ValueError(f"TransformerDecoder '{self.name}': cross-attention needs "
                             "encoder_output (or a cache made with it)")

        source = self.attention_layer_norm(x) if self.norm_first else x
        new_cache = None
        if cache is None:
            mask = self_attention_mask
            if mask is None:  # (1, target, target)
                mask = causal_mask(ops.shape(x)[1] if packing is None else packing.seq)
            attention = self.attention_layer(query=source, value=source, key=source,
                                             attention_mask=mask, training=training,
                                             **attention_kwargs)
        else:
            attention, new_cache = self._cached_self_attention(
                source, cache, decode_index, self_attention_mask, training)
        x = x + self.attention_output_dropout(attention, training=training)
        if not self.norm_first:
            x = self.attention_layer_norm(x)

        if self.use_cross_attention:
            x = self._cross_attention_block(x, encoder_output, encoder_mask, cache, training,
                                            attention_kwargs)

        x = self._feed_forward_block(x, training)
        return x if cache is None else (x, new_cache)

    def _cached_self_attention(self, source, cache, decode_index, self_attention_mask, training):
        """Self-attention of the new rows over the cache, with their keys/values written in."""
        mha = self.attention_layer
        q, k, v = mha.project_heads(source)  # (batch, heads, target, head_dim) each
        index = ops.cast(decode_index, "int32")
        zero = ops.zeros((), "int32")
        start = (zero, zero, index, zero)
        # A static-shape cache updated in place (XLA's dynamic-update-slice): no growth, so
        # a decoding loop keeps one shape across steps.
        key = ops.slice_update(cache[KEY], start, ops.cast(k, cache[KEY].dtype))
        value = ops.slice_update(cache[VALUE], start, ops.cast(v, cache[VALUE].dtype))
        mask = self_attention_mask
        if mask is None:
            # Unwritten slots (zeros) sit after the index: hidden with the future.
            mask = causal_mask(ops.shape(q)[2], ops.shape(key)[2], offset=index)
        attention = mha.attend(q, ops.cast(key, q.dtype), ops.cast(value, q.dtype), mask,
                               training)
        new_cache = dict(cache)
        new_cache.update({KEY: key, VALUE: value})
        return attention, new_cache

    def _cross_attention_block(self, x, encoder_output, encoder_mask, cache, training,
                               attention_kwargs=None):
        """`x` after the (residual, normalized) cross-attention over the encoder output."""
        query = self.cross_attention_layer_norm(x) if self.norm_first else x
        mask = None
        if encoder_mask is not None:
            if len(encoder_mask.shape) != 2:
                raise ValueError(f"TransformerDecoder '{self.name}': encoder_mask must be "
                                 f"[batch, source], got shape {tuple(encoder_mask.shape)}")
            mask = encoder_mask[:, None, :]  # (batch, 1, source): broadcast over queries
        if cache is not None and CROSS_KEY in cache:
            mha = self.cross_attention
            q = mha.project_query(query)
            attention = mha.attend(q, ops.cast(cache[CROSS_KEY], q.dtype),
                                   ops.cast(cache[CROSS_VALUE], q.dtype), mask, training)
        else:
            if encoder_output.shape[-1] != x.shape[-1]:
                raise ValueError(f"TransformerDecoder '{self.name}': encoder_output width "
                                 f"{encoder_output.shape[-1]} differs from the decoder's "
                                 f"{x.shape[-1]}")
            attention = self.cross_attention(query=query, value=encoder_output,
                                             key=encoder_output, attention_mask=mask,
                                             training=training, **(attention_kwargs or {}))
        x = x + self.cross_attention_dropout(attention, training=training)
        if not self.norm_first:
            x = self.cross_attention_layer_norm(x)
        return x

    def _feed_forward_block(self, x, training):
        """`x` after the (residual, normalized) feed-forward network, as in the encoder."""
        ffn_input = self.output_layer_norm(x) if self.norm_first else x
        # 2-D matmuls, which TensorFlow fuses with the bias adds that follow.
        shape = ops.shape(ffn_input)
        rows = ops.reshape(ffn_input, (-1, ffn_input.shape[-1]))
        inner = self.inner_dropout_layer(self.intermediate_dense(rows), training=training)
        ffn = ops.reshape(self.output_dense(inner), shape)
        x = x + self.output_dropout_layer(ffn, training=training)
        if not self.norm_first:
            x = self.output_layer_norm(x)
        return x

    def compute_output_shape(self, input_shape, *args, **kwargs):
        return tuple(_data_shape(input_shape))

    def get_config(self):
        config = super().get_config()
        config.pop("output_range", None)
        config.update(use_cross_attention=self.use_cross_attention)
        return config
