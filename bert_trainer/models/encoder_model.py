"""The base of every task model: an encoder plus heads, serializable and checkpointable."""

import keras

from bert_trainer import features
from bert_trainer.encoders.bert_encoder import default_initializer


class EncoderModel(keras.Model):
    """A subclassed `keras.Model` holding `encoder`; subclasses add heads and `call`.

    Heads are built in `__init__` (the encoder's `hidden_size` gives their shapes), so a
    fresh model has all its variables: `tf.train.Checkpoint(model=...)` can restore into
    it before the first call, and `.keras` loading finds every weight.

    Args:
      encoder: a `BertEncoder` / `AlbertEncoder` (anything with `hidden_size`,
        `dtype_policy` and the RFC's input/output dicts).
      initializer: initializer of the heads; `None` takes the encoder's (truncated
        normal, stddev 0.02, for BERT).
      **kwargs: `keras.Model` arguments (`name`, ...); the dtype policy defaults to the
        encoder's, so heads follow the encoder's precision.
    """

    def __init__(self, encoder, initializer=None, **kwargs):
        kwargs.setdefault("dtype", encoder.dtype_policy)
        super().__init__(**kwargs)
        self.encoder = encoder
        self.initializer = keras.initializers.get(
            initializer or getattr(encoder, "initializer", None) or default_initializer())

    def encode(self, inputs, training=None):
        """Runs the encoder on the encoder's three entries of a feature dict."""
        missing = [key for key in features.ENCODER_INPUTS if key not in inputs]
        if missing:
            raise ValueError(f"{self.name}: the features lack {missing}")
        return self.encoder({key: inputs[key] for key in features.ENCODER_INPUTS},
                            training=training)

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
            "encoder": keras.saving.serialize_keras_object(self.encoder),
            "initializer": keras.initializers.serialize(self.initializer),
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["encoder"] = keras.saving.deserialize_keras_object(config["encoder"])
        return cls(**config)
