"""Builds the 3D self-attention mask from a 2D padding mask."""

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
