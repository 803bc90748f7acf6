"""The exact (erf) GELU with a hand-written gradient that reuses the forward pass."""

import keras

from bert_trainer import ops as bert_ops


@keras.saving.register_keras_serializable(package="bert_trainer")
def gelu(x):
    """`x * Phi(x)` with `Phi` the standard normal CDF: `keras.activations.gelu(x)` (exact).

    The same values as Keras' exact GELU; only the backward pass differs. Automatic
    differentiation of `0.5 * x * erfc(-x / sqrt(2))` re-derives `erfc` and its pieces
    elementwise; here the gradient `Phi(x) + x * phi(x)` reuses the forward `Phi(x)` and adds
    one `exp`. Without XLA every elementwise op is a pass over the `[batch, seq, inner_dim]`
    activations (the largest in the encoder), so fewer ops is less memory traffic. Where the
    fused CPU kernels run (`bert_trainer.ops.gelu`), the forward and the backward are one
    kernel each.

    Args:
      x: float tensor, any shape.

    Returns:
      `gelu(x)`, same shape and dtype.
    """
    return bert_ops.gelu(x)
