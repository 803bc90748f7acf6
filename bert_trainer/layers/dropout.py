"""Keras' Dropout with a cheaper random mask on TensorFlow (`bert_trainer.ops.dropout`)."""

import keras

from bert_trainer import ops as bert_ops


@keras.saving.register_keras_serializable(package="bert_trainer")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` (same arguments, seed generator and config), with a cheaper mask.

    Where the fused CPU kernels run (`bert_trainer.ops`), one kernel draws each element's
    keep bit from a hash of (seed, element index) and applies it, and the gradient is the
    same kernel on the upstream gradient: no mask is stored, and the rate is exact to 2^-32.

    Elsewhere (GPU, XLA, kernels off): Keras' TensorFlow dropout draws one float32 uniform
    per element (a 32-bit Philox output) and keeps the element when it is >= rate. Here one
    32-bit Philox output decides two elements, each by its own 16 bits: half the random
    numbers, which are most of dropout's cost on CPU (benchmarks/README.md). An element is
    kept when its 16 bits are
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
        return bert_ops.dropout(inputs, self.rate, self.seed_generator)
