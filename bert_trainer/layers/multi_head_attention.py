"""Multi-head attention with Keras' weights and a lean path for BERT's self-attention."""

import math

import keras
from keras import ops

from bert_trainer import ops as bert_ops
from bert_trainer.layers.dropout import Dropout

# Added to the scores of masked keys: large enough that exp() underflows to 0, small enough
# to stay finite in the compute dtype (float16 tops out at 65504).
_MASK_VALUE = {"float16": -3.0e4}
_DEFAULT_MASK_VALUE = -1.0e9


@keras.saving.register_keras_serializable(package="bert_trainer")
class MultiHeadAttention(keras.layers.MultiHeadAttention):
    """`keras.layers.MultiHeadAttention` with the same weights, computed with fewer ops.

    The variables, their shapes and the sublayers are Keras' own (the checkpoint converters
    map weights onto them): `query_dense`, `key_dense`, `value_dense` have kernel
    `[hidden, heads, head_dim]` and bias `[heads, head_dim]`; `output_dense` has kernel
    `[heads, head_dim, out]` and bias `[out]`. Only the computation differs, on the path BERT
    takes (rank-3 inputs, default attention axes, no gate, sliding window, causal mask, Keras
    masks, flash attention or returned scores; anything else runs Keras' own `call`):

    - Self-attention (`query`, `key` and `value` the same tensor) projects Q, K and V with one
      `[hidden, 3 * heads * head_dim]` matmul; the three kernels are concatenated at call
      time, so they stay three variables. With `key is value`, K and V share one matmul.
    - `1/sqrt(head_dim)` is folded into the query kernel and bias (a `[hidden, hidden]`
      multiply instead of one over every query vector).
    - The mask becomes an additive bias of `0` or `-1e9` broadcast over heads (and over
      queries for a `[batch, 1, seq]` padding mask): one add instead of Keras' two selects
      over `[batch, heads, seq, seq]`. A query whose keys are all masked therefore attends
      uniformly, as in google-research/bert, where Keras would output zeros. Where the
      fused CPU kernels run, the add, the softmax and the dropout are one kernel.
    - The output projection is one 2-D matmul followed by its bias add, which TensorFlow
      fuses into one kernel (Keras' einsum adds the bias after a reshape).

    Args:
      num_heads, key_dim, **kwargs: as `keras.layers.MultiHeadAttention`.

    Call args:
      query: `[batch, target, query_width]`.
      value: `[batch, source, value_width]`.
      key: `[batch, source, key_width]`; `None` uses `value`.
      attention_mask: `[batch, target, source]` or `[batch, 1, source]`; nonzero/True =
        may attend.
      training: enables dropout on the attention probabilities.
      query_mask, value_mask, key_mask, return_attention_scores, use_causal_mask: as Keras
        (any of them selects Keras' own computation).

    Returns:
      `[batch, target, out]` (and the scores, if `return_attention_scores`).
    """

    def __init__(self, num_heads, key_dim, **kwargs):
        super().__init__(num_heads, key_dim, **kwargs)
        # Options only Keras' general computation implements.
        self._lean = (kwargs.get("attention_axes") is None and not kwargs.get("use_gate")
                      and kwargs.get("sliding_window") is None
                      and kwargs.get("value_dim") in (None, key_dim)
                      and not kwargs.get("flash_attention"))

    def _build_attention(self, rank):
        super()._build_attention(rank)
        # The probabilities' dropout: the same rate and seed, with the cheaper mask. Keras'
        # own is untracked so the layer holds one dropout (its private tracker, Keras 3).
        keras_dropout = self._dropout_layer
        self._dropout_layer = Dropout(rate=self._dropout, dtype=self.dtype_policy, seed=self.seed)
        tracker = getattr(self, "_tracker", None)
        if tracker is not None:
            tracker.untrack(keras_dropout)

    def call(self, query, value, key=None, query_mask=None, value_mask=None, key_mask=None,
             attention_mask=None, return_attention_scores=False, training=None,
             use_causal_mask=False, packing=None):
        key = value if key is None else key
        lean = (self._lean and not return_attention_scores and not use_causal_mask
                and query_mask is None and value_mask is None and key_mask is None
                and not keras.config.is_flash_attention_enabled())
        if packing is not None:
            dense = self.output_dense
            # Key and value packed [tokens, width] (the query packed or not), or only the query
            # packed over whole [batch, seq, width] keys and values (cross-attention).
            ranks = (len(query.shape), len(key.shape), len(value.shape))
            if (not lean or ranks[1] != ranks[2] or ranks[1] not in (2, 3)
                    or (ranks[1] == 3 and ranks[0] != 2)
                    or len(dense.kernel.shape) != 3 or getattr(dense, "quantization_mode", None)):
                raise ValueError(f"MultiHeadAttention '{self.name}': packed inputs take none "
                                 "of the options of Keras' general computation")
            if attention_mask is None and ranks[1] == 2:  # unkept key slots must be hidden
                raise ValueError(f"MultiHeadAttention '{self.name}': packed inputs need the "
                                 "padding mask")
            return self._lean_call(query, key, value, attention_mask, training, packing)
        if not (lean and len(query.shape) == 3 and len(value.shape) == 3):
            return super().call(
                query, value, key=key, query_mask=query_mask, value_mask=value_mask,
                key_mask=key_mask, attention_mask=attention_mask,
                return_attention_scores=return_attention_scores, training=training,
                use_causal_mask=use_causal_mask)
        return self._lean_call(query, key, value, attention_mask, training)

    def _lean_call(self, query, key, value, attention_mask, training, packing=None):
        """The lean computation; with `packing`, the rank-2 ones of query, key and value are
        its packed `[tokens, width]` rows, unpacked around the attention itself."""
        q, k, v = self._project(query, key, value, packing)  # (batch, heads, seq, dim) each
        query_packing = packing if len(query.shape) == 2 else None
        return self._attend(q, k, v, attention_mask, training, query_packing)

    def _attend(self, q, k, v, attention_mask, training, packing=None):
        """Attention of projected heads (`q` pre-scaled), through the output projection."""
        scores = ops.matmul(q, ops.swapaxes(k, -1, -2))  # (batch, heads, target, source)
        probs = self._probabilities(scores, attention_mask, training)
        context = ops.matmul(probs, v)  # (batch, heads, target, head_dim)
        return self._output_projection(context, packing)  # (batch, target, out)

    # --- The lean path in pieces, for callers that keep projected keys and values (the
    # key/value cache of incremental decoding): the same computation as `call`, split where
    # the cache sits.

    def project_heads(self, query, key=None, value=None):
        """Projects Q (pre-scaled by `1/sqrt(head_dim)`), K and V as the lean call does.

        Args:
          query: `[batch, target, width]`.
          key, value: `[batch, source, width]`; `None` uses `query` (self-attention: one
            fused matmul for the three).

        Returns:
          `(q, k, v)`, each `[batch, heads, seq, head_dim]` in the compute dtype.
        """
        self._check_lean()
        key = query if key is None else key
        value = key if value is None else value
        return tuple(self._project(query, key, value))

    def project_query(self, query):
        """Q of `query` `[batch, target, width]`, pre-scaled: `[batch, heads, target, head_dim]`."""
        self._check_lean()
        (q,) = self._fused_projection(query, [self.query_dense], [1.0 / math.sqrt(self.key_dim)])
        return q

    def project_key_value(self, source):
        """K and V of `source` `[batch, source, width]` in one matmul: two
        `[batch, heads, source, head_dim]` tensors (computed once, attended to many times)."""
        self._check_lean()
        return tuple(self._fused_projection(source, [self.key_dense, self.value_dense], [1, 1]))

    def attend(self, q, k, v, attention_mask=None, training=None):
        """Attention of projected heads, as the lean call computes it after projecting.

        Args:
          q: `[batch, heads, target, head_dim]` from `project_query`/`project_heads`.
          k, v: `[batch, heads, source, head_dim]`.
          attention_mask: `[batch or 1, target or 1, source]`; nonzero = may attend.
          training: enables dropout on the probabilities.

        Returns:
          `[batch, target, out]`.
        """
        self._check_lean()
        return self._attend(q, k, v, attention_mask, training)

    def _check_lean(self):
        if not self._lean:
            raise ValueError(f"MultiHeadAttention '{self.name}': projected heads need the lean "
                             "path (no attention_axes, gate, sliding window, value_dim or "
                             "flash attention)")

    def _probabilities(self, scores, attention_mask, training):
        """dropout(softmax(scores + mask bias)), with the dropout sublayer's rate, seed and
        mask (`bert_trainer.ops.attention_probabilities`: one fused kernel where it runs)."""
        bias = None
        if attention_mask is not None:
            bias = self._mask_bias(attention_mask, scores.dtype)  # (batch, target|1, source)
        return bert_ops.attention_probabilities(scores, bias, self._dropout_layer, training)

    def _output_projection(self, context, packing=None):
        """`output_dense` of `[batch, heads, target, head_dim]` as one 2-D matmul and bias add
        (TensorFlow fuses the pair).

        The einsum of Keras' `output_dense` is a reshape, a matmul and a reshape, with the
        bias added after the last reshape: TensorFlow cannot fuse that add into the matmul.
        A multi-axis `output_shape` or a quantized layer takes Keras' own call. The heads
        are moved next to each other (and packed) by `bert_trainer.ops.merge_heads`.
        """
        dense = self.output_dense
        if len(dense.kernel.shape) != 3 or getattr(dense, "quantization_mode", None):
            return dense(ops.transpose(context, (0, 2, 1, 3)))
        width = self.num_heads * self.key_dim
        shape = ops.shape(context)  # (batch, heads, target, head_dim)
        rows = bert_ops.merge_heads(context, packing)  # (batch * target | tokens, width)
        kernel = ops.cast(dense.kernel, self.compute_dtype)  # (heads, head_dim, out)
        y = ops.matmul(rows, ops.reshape(kernel, (width, -1)))  # (batch * target | tokens, out)
        if dense.bias is not None:
            y = ops.add(y, ops.cast(dense.bias, self.compute_dtype))
        # The output width is spelled out: with an empty batch (a replica's share of the last
        # eval batch) a -1 cannot be inferred from 0 elements.
        out = dense.kernel.shape[-1]
        return y if packing is not None else ops.reshape(y, (shape[0], shape[2], out))

    def _project(self, query, key, value, packing=None):
        """Q (pre-scaled), K and V, each `[batch, heads, seq, head_dim]`."""
        scale = 1.0 / math.sqrt(self.key_dim)
        if query is key and key is value:
            return self._fused_projection(
                query, [self.query_dense, self.key_dense, self.value_dense], [scale, 1, 1],
                packing)
        (q,) = self._fused_projection(query, [self.query_dense], [scale],
                                      packing if len(query.shape) == 2 else None)
        if len(key.shape) != 2:
            packing = None  # keys and values [batch, seq, width]: a packed query only
        if key is value:
            k, v = self._fused_projection(key, [self.key_dense, self.value_dense], [1, 1],
                                          packing)
        else:
            (k,) = self._fused_projection(key, [self.key_dense], [1], packing)
            (v,) = self._fused_projection(value, [self.value_dense], [1], packing)
        return q, k, v

    def _fused_projection(self, x, layers, scales, packing=None):
        """Projects `x` by the concatenated kernels of `layers` in one matmul.

        Args:
          x: `[batch, seq, width]`, or with `packing` its packed `[tokens, width]`.
          layers: EinsumDense sublayers with kernel `[width, heads, dim]`, bias `[heads, dim]`.
          scales: a Python factor per layer, folded into its kernel and bias.
          packing: a `TokenPacking` of `x`: the projection runs on the tokens, then is
            unpacked to `[batch, seq, .]`.

        Returns:
          One `[batch, heads, seq, dim]` tensor per layer.
        """
        dtype = self.compute_dtype

        def scaled(weight, factor):
            weight = ops.cast(weight, dtype)
            return weight if factor == 1 else weight * ops.cast(factor, dtype)

        width = x.shape[-1]
        kernel = ops.concatenate(
            [scaled(layer.kernel, f) for layer, f in zip(layers, scales, strict=True)], axis=1)
        heads = self.num_heads
        y = ops.matmul(x, ops.reshape(kernel, (width, -1)))  # (batch, seq, n * heads * dim)
        if self.use_bias:
            bias = ops.concatenate(
                [scaled(layer.bias, f) for layer, f in zip(layers, scales, strict=True)], axis=0)
            # ops.add of a vector: TensorFlow's BiasAdd, whose gradient is a fast row sum.
            y = ops.add(y, ops.reshape(bias, (-1,)))
        return bert_ops.split_heads(y, len(layers), heads, packing)  # (+ unpack)

    def _mask_bias(self, attention_mask, dtype):
        """`[batch, target|1, source]` mask -> additive bias of that shape."""
        masked_value = _MASK_VALUE.get(keras.backend.standardize_dtype(dtype),
                                       _DEFAULT_MASK_VALUE)
        allowed = ops.cast(attention_mask, "bool")
        return ops.where(allowed, ops.zeros((), dtype), ops.full((), masked_value, dtype))
