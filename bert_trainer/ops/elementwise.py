"""Dropout, exact GELU and LayerNorm: each the fused kernel or TensorFlow's ops (`switch`)."""

import math

import keras
from keras import ops

from bert_trainer.ops.switch import fused

_BITS = 16
_LEVELS = 1 << _BITS
_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def dropout(x, rate: float, seed_generator):
    """`x * keep / (1 - rate)` on TensorFlow, with a cheaper mask than Keras'.

    The fused kernel draws each element's keep bit from a hash of (seed, element index); its
    gradient is the same kernel on the upstream gradient: no mask is stored, and the rate is
    exact to 2^-32. TensorFlow's ops draw one 32-bit Philox output per two elements, each
    decided by its own 16 bits (a rate 16 bits hold within 0.1 %: `round(rate * 65536) /
    65536`, with the exact scale), else Keras' own dropout. The paths draw different masks
    from one seed.

    Args:
      x: float tensor.
      rate: the drop probability, in (0, 1).
      seed_generator: the layer's `keras.random.SeedGenerator`; one seed is drawn from it.

    Returns:
      `x` with dropout applied, same shape and dtype.
    """
    if fused(x.dtype):
        from bert_trainer import kernels  # noqa: PLC0415

        return kernels.dropout(x, rate, seed_generator.next())
    threshold = _threshold(rate)
    if threshold is None:
        return keras.random.dropout(x, rate, seed=seed_generator)
    return _dropout_16bit(x, threshold, seed_generator.next())


def _threshold(rate: float) -> int | None:
    """round(rate * 65536) if that is within 0.1 % of the rate and of 1 - rate, else None."""
    if not 0.0 < rate < 1.0:
        return None
    threshold = round(rate * _LEVELS)
    quantized = threshold / _LEVELS
    if abs(quantized - rate) > 1e-3 * min(rate, 1.0 - rate):
        return None
    return threshold


def _dropout_16bit(x, threshold: int, seed):
    import tensorflow as tf  # noqa: PLC0415 - the TensorFlow path only

    scale = 1.0 / (1.0 - threshold / _LEVELS)
    size = tf.size(x)
    words = tf.random.stateless_uniform(
        [(size + 1) // 2], tf.cast(seed, tf.int64), minval=None, maxval=None,
        dtype=tf.uint32)
    bits = tf.reshape(tf.bitcast(words, tf.uint16), [-1])[:size]  # two draws per word
    keep = tf.reshape(bits >= tf.constant(threshold, tf.uint16), tf.shape(x))
    mask = tf.where(keep, tf.constant(scale, x.dtype), tf.constant(0.0, x.dtype))
    return x * mask  # the gradient is upstream * mask


def gelu(x):
    """Exact GELU `x * Phi(x)`: one kernel each way, or TensorFlow's ops with a gradient
    `Phi(x) + x * phi(x)` that reuses the forward `Phi(x)` (see `layers.gelu`)."""
    if fused(x.dtype):
        from bert_trainer import kernels  # noqa: PLC0415

        return kernels.gelu(x)
    return _gelu(x)


@ops.custom_gradient
def _gelu(x):
    cdf = 0.5 * (1.0 + ops.erf(x * ops.cast(_SQRT_HALF, x.dtype)))  # Phi(x)

    def grad(*args, upstream=None):
        upstream = args[0] if upstream is None else upstream  # backends differ in the name
        pdf = ops.exp(-0.5 * ops.square(x)) * ops.cast(_INV_SQRT_2PI, x.dtype)  # phi(x)
        return upstream * (cdf + x * pdf)

    return x * cdf, grad


def layer_norm(x, gamma, beta, epsilon: float):
    """LayerNorm of the last axis: `(x - mean) / sqrt(var + epsilon) * gamma + beta`.

    One kernel each way, or TensorFlow's ops with the closed-form gradient
    `dx = inv * (g - mean(g) - xhat * mean(g * xhat))`, `g = dy * gamma` (see
    `layers.LayerNormalization`).

    Args:
      x: `[..., width]`, in the dtype it is computed in (float32 under a mixed policy).
      gamma, beta: `[width]` variables (read once here).
      epsilon: added to the variance.

    Returns:
      `[..., width]` in `x`'s dtype.
    """
    dtype = x.dtype
    if keras.backend.standardize_dtype(dtype) == "float32" and fused():
        from bert_trainer import kernels  # noqa: PLC0415

        return kernels.layer_norm(x, ops.cast(gamma, dtype), ops.cast(beta, dtype), epsilon)
    # ops.copy reads each variable once, outside the custom-gradient function: a variable
    # read inside it would have to be differentiated separately.
    gamma = ops.cast(ops.copy(gamma), dtype)
    beta = ops.cast(ops.copy(beta), dtype)
    return _layer_norm(x, gamma, beta, epsilon)


def _layer_norm(x, gamma, beta, epsilon):
    """Normalizes the last axis of `x` `[..., width]`; `gamma`, `beta` `[width]`."""

    @ops.custom_gradient
    def normalize(x, gamma, beta):
        mean = ops.mean(x, axis=-1, keepdims=True)  # (..., 1)
        centered = x - mean
        inv = ops.rsqrt(ops.mean(ops.square(centered), axis=-1, keepdims=True) + epsilon)
        normed = centered * inv  # xhat, (..., width)

        def grad(*args, upstream=None):
            upstream = args[0] if upstream is None else upstream  # backends differ in the name
            g = upstream * gamma
            dx = inv * (g - ops.mean(g, axis=-1, keepdims=True)
                        - normed * ops.mean(g * normed, axis=-1, keepdims=True))
            batch_axes = tuple(range(len(x.shape) - 1))
            dgamma = ops.sum(upstream * normed, axis=batch_axes)
            return dx, dgamma, ops.sum(upstream, axis=batch_axes)

        return normed * gamma + beta, grad

    return normalize(x, gamma, beta)
