"""Builds 3D self-attention masks: from a 2D padding mask, and the causal (left-to-right) one."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="bert_trainer")
class SelfAttentionMask(keras.layers.Layer):
    """`mask[b, i, j] = to_mask[b, j]`: every query position may attend to the real tokens.

    Callable as the RFC writes it, `SelfAttentionMask()([from_tensor, to_mask])`, or as
    `SelfAttentionMask()(from_tensor, to_mask)`.

    Call args:
      inputs: `from_tensor`, `[batch, from_seq, ...]` (only its shape is used), or the
        list `[from_tensor, to_mask]`.
      to_mask: `[batch, to_seq]` int or bool, 1 for real tokens and 0 for padding.

    Returns:
      `[batch, from_seq, to_seq]` float mask (1 = may attend) in the compute dtype.
    """

    def call(self, inputs, to_mask=None):
        if to_mask is None:
            if not isinstance(inputs, (list, tuple)) or len(inputs) != 2:
                raise ValueError("SelfAttentionMask: pass [from_tensor, to_mask] or "
                                 "(from_tensor, to_mask=...)")
            inputs, to_mask = inputs
        if len(to_mask.shape) != 2:
            raise ValueError(f"SelfAttentionMask: to_mask must be [batch, to_seq], got rank "
                             f"{len(to_mask.shape)} (shape {tuple(to_mask.shape)})")
        shape = ops.shape(inputs)
        to_mask = ops.cast(to_mask, self.compute_dtype)[:, None, :]  # (batch, 1, to_seq)
        ones = ops.ones((shape[0], shape[1], 1), dtype=self.compute_dtype)  # (batch, from_seq, 1)
        return ones * to_mask  # (batch, from_seq, to_seq)

    def compute_output_shape(self, inputs_shape, to_mask_shape=None):
        if to_mask_shape is None:
            inputs_shape, to_mask_shape = inputs_shape
        return (inputs_shape[0], inputs_shape[1], to_mask_shape[1])


def causal_mask(query_length, key_length=None, offset=0):
    """bool `[1, query_length, key_length]`: query `i` (at position `offset + i`) may attend
    to key `j` iff `j <= offset + i`.

    The leading 1 broadcasts over the batch (attention adds it as a bias of that shape, so
    no `[batch, seq, seq]` tensor is made).

    Args:
      query_length: number of queries (int or scalar tensor).
      key_length: number of keys; `None` uses `query_length`.
      offset: position of the first query (scalar, may be a tensor): the decode index when
        the queries are new tokens attending to a key/value cache.

    Returns:
      The mask, True = may attend.
    """
    key_length = query_length if key_length is None else key_length
    positions = ops.cast(offset, "int32") + ops.arange(query_length, dtype="int32")
    allowed = ops.arange(key_length, dtype="int32")[None, :] <= positions[:, None]
    return allowed[None]  # (1, query, key)


@keras.saving.register_keras_serializable(package="bert_trainer")
class CausalAttentionMask(keras.layers.Layer):
    """`mask[b, i, j] = (j <= i) and to_mask[b, j]`: each position attends to itself and the
    positions before it (a decoder's self-attention), optionally also hiding padding.

    Call args:
      inputs: `[batch, seq, ...]`; only its shape is used.
      to_mask: optional `[batch, seq]` int or bool, 1 for real tokens.

    Returns:
      `[batch, seq, seq]` float mask (1 = may attend) in the compute dtype.
    """

    def call(self, inputs, to_mask=None):
        shape = ops.shape(inputs)
        allowed = ops.cast(causal_mask(shape[1]), self.compute_dtype)  # (1, seq, seq)
        if to_mask is None:
            return ops.broadcast_to(allowed, (shape[0], shape[1], shape[1]))
        if len(to_mask.shape) != 2:
            raise ValueError(f"CausalAttentionMask: to_mask must be [batch, seq], got rank "
                             f"{len(to_mask.shape)} (shape {tuple(to_mask.shape)})")
        return allowed * ops.cast(to_mask, self.compute_dtype)[:, None, :]

    def compute_output_shape(self, inputs_shape, to_mask_shape=None):
        return (inputs_shape[0], inputs_shape[1], inputs_shape[1])
