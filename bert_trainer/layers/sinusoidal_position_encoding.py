"""The fixed sine/cosine position encoding of "Attention Is All You Need"."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="bert_trainer")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """PE(pos, 2i) = sin(pos / w^(2i/D)), PE(pos, 2i+1) = cos(pos / w^(2i/D)), w = max_wavelength.

    Sine and cosine are interleaved (even columns sine, odd columns cosine) as in the
    paper. There are no weights, so any sequence length works.

    Args:
      max_wavelength: the base `w` of the geometric progression of wavelengths.

    Call args:
      inputs: `[batch, seq, D]`; only its shape is used.

    Returns:
      `[batch, seq, D]` encodings in the layer's compute dtype (computed in float32).
    """

    def __init__(self, max_wavelength=10000.0, **kwargs):
        super().__init__(**kwargs)
        self.max_wavelength = max_wavelength

    def call(self, inputs):
        shape = ops.shape(inputs)
        width = inputs.shape[-1]
        positions = ops.cast(ops.arange(shape[1]), "float32")  # (seq,)
        columns = ops.arange(width)
        # Columns 2i and 2i+1 share the exponent 2i/D.
        exponents = ops.cast(2 * (columns // 2), "float32") / float(width)  # (D,)
        inverse_wavelengths = ops.power(float(self.max_wavelength), -exponents)  # (D,)
        angles = positions[:, None] * inverse_wavelengths[None, :]  # (seq, D)
        encoding = ops.where(columns % 2 == 0, ops.sin(angles), ops.cos(angles))
        encoding = ops.cast(encoding, self.compute_dtype)
        return ops.broadcast_to(encoding[None], shape)  # (batch, seq, D)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(max_wavelength=self.max_wavelength)
        return config
