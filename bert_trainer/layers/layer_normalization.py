"""LayerNormalization with Keras' variables and a hand-written gradient."""

import keras
from keras import ops

from bert_trainer import ops as bert_ops


@keras.saving.register_keras_serializable(package="bert_trainer")
class LayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` with the same arguments, variables and config.

    For the case every BERT LayerNorm is (last axis, with `gamma` and `beta`, no RMS
    scaling) it computes `y = (x - mean) / sqrt(var + epsilon) * gamma + beta` with a
    hand-written gradient; other configurations run Keras' own computation. The gradient
    of the normalization is the closed form
        dx = inv * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * gamma,
    which reuses the forward `xhat` and `inv`; automatic differentiation of the moments
    instead builds broadcasts and tiles of each intermediate. Without XLA each elementwise
    op is a pass over `[batch, seq, hidden]`. Where the fused CPU kernels run
    (`bert_trainer.ops.layer_norm`), the
    forward and the backward are one kernel each. Like Keras, it computes in float32 under a
    mixed policy.

    Args:
      **kwargs: as `keras.layers.LayerNormalization`.

    Call args:
      inputs: `[..., width]`.

    Returns:
      Normalized `[..., width]` in the compute dtype.
    """

    def call(self, inputs):
        rank = len(inputs.shape)
        last_axis = self.axis in (-1, rank - 1, [-1], [rank - 1])
        if not (last_axis and self.center and self.scale) or self.rms_scaling:
            return super().call(inputs)
        dtype = keras.backend.result_type(inputs.dtype, "float32")  # float32 for half types
        outputs = bert_ops.layer_norm(ops.cast(inputs, dtype), self.gamma, self.beta,
                                      self.epsilon)
        return ops.cast(outputs, self.compute_dtype)
