"""The base of every task model: an encoder plus heads, serializable and checkpointable."""

import keras
from keras import ops

from bert_trainer import features
from bert_trainer import ops as bert_ops
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

    def encode(self, inputs, training=None, *, pooled_only=False):
        """Runs the encoder on the encoder's three entries of a feature dict.

        Where packing costs nothing extra (`packs_tokens`), an encoder that can computes the
        real tokens only: the same values wherever the padding mask lets a head look. With
        `pooled_only` (a head that reads `pooled_output` alone) its last layer then computes
        [CLS] only, and the other outputs are not returned.
        """
        missing = [key for key in features.ENCODER_INPUTS if key not in inputs]
        if missing:
            raise ValueError(f"{self.name}: the features lack {missing}")
        encoder_inputs = {key: inputs[key] for key in features.ENCODER_INPUTS}
        if not self.packs_tokens():
            return self.encoder(encoder_inputs, training=training)
        if pooled_only:
            none = ops.zeros((ops.shape(inputs[features.INPUT_MASK])[0], 0), "int32")
            pooled = self.encoder.call_at_positions(encoder_inputs, none, training=training,
                                                    pack=True)[features.POOLED_OUTPUT]
            return {features.POOLED_OUTPUT: pooled}
        return self.encoder.call_packed(encoder_inputs, training=training)

    def packed_tokens(self, inputs):
        """int32 scalar: the tokens per layer a call traced here, now, computes on `inputs`
        when it packs them (`packs_tokens()`), else None (every slot). Counted for the
        throughput's FLOPs."""
        if not self.packs_tokens():
            return None
        mask = inputs[features.INPUT_MASK]
        return self.encoder.packed_tokens({key: inputs[key] for key in features.ENCODER_INPUTS},
                                          ops.zeros((ops.shape(mask)[0], 0), "int32"))

    def packs_tokens(self) -> bool:
        """Whether a call traced here, now, runs the encoder on the real tokens only: the
        encoder can pack (`call_packed`, no `output_range`), packing costs nothing extra here
        (`bert_trainer.ops.token_packing_is_free`: the fused CPU kernels run) and Keras'
        flash attention is off."""
        return (hasattr(self.encoder, "call_packed")
                and getattr(self.encoder, "output_range", None) is None
                and keras.backend.backend() == "tensorflow"
                and not keras.config.is_flash_attention_enabled()
                and bert_ops.token_packing_is_free())

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
