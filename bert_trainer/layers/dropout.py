"""Keras' Dropout with a cheaper random mask on TensorFlow: a fused kernel, or 16 random bits."""

import keras

from bert_trainer import kernels

_BITS = 16
_LEVELS = 1 << _BITS


@keras.saving.register_keras_serializable(package="bert_trainer")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` (same arguments, seed generator and config), with a cheaper mask.

    Where the fused CPU kernels run (`bert_trainer.kernels`), one kernel draws each
    element's keep bit from a hash of (seed, element index) and applies it, and the gradient
    is the same kernel on the upstream gradient: no mask is stored, and the rate is exact
    to 2^-32.

    Elsewhere (GPU, XLA, kernels off): Keras' TensorFlow dropout draws one float32 uniform
    per element (a 32-bit Philox output) and keeps the element when it is >= rate. Here one
    32-bit Philox output decides two elements, each by its own 16 bits: half the random
    numbers, which are most of dropout's cost on CPU (measured: 1.4x on a [32, 4, 128, 128]
    attention dropout, forward and backward). An element is kept when its 16 bits are
    >= round(rate * 65536), so the rate is `round(rate * 65536) / 65536` (0.1 -> 0.100006)
    and the kept elements are scaled by 1 / (1 - that rate): the expectation is exact in
    float32 (in bfloat16 the scale rounds, as in Keras' dropout).

    On TensorFlow's path, a rate that 16 bits cannot hold within 0.1 % (of the rate and of
    the keep probability: below about 0.008 or above 0.992) uses Keras' own dropout, as do
    other backends and `noise_shape`. The two paths draw different masks from one seed, so a
    run that switches path (XLA on or off, kernels on or off) changes its dropout stream; so
    does packing the tokens (`BertPretrainer(pack_tokens=...)`), which numbers the elements
    differently.
    """

    def call(self, inputs, training=False):
        if (not training or not 0.0 < self.rate < 1.0 or self.noise_shape is not None
                or keras.backend.backend() != "tensorflow"):
            return super().call(inputs, training=training)
        if kernels.active(inputs.dtype):
            return kernels.dropout(inputs, self.rate, self.seed_generator.next())
        threshold = _threshold(self.rate)
        if threshold is None:
            return super().call(inputs, training=training)
        return _dropout_16bit(inputs, threshold, self.seed_generator.next())

    def kernel_rate_and_seed(self, training):
        """(rate, seed) for a fused kernel that applies this dropout as `call` would on the
        kernel path (`bert_trainer.kernels`), drawing the seed `call` would: rate 0 and no
        seed where `call` passes its input through; None where `call` would take another
        path (`noise_shape`, a rate of 1). Only where the kernels run (`kernels.active`)."""
        if not training or self.rate == 0.0:
            return 0.0, None
        if not 0.0 < self.rate < 1.0 or self.noise_shape is not None:
            return None
        return self.rate, self.seed_generator.next()


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
