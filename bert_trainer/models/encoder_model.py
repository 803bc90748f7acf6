"""The base of every task model: an encoder plus heads, serializable and checkpointable."""

import math

import keras
from keras import ops

from bert_trainer import features
from bert_trainer import ops as bert_ops
from bert_trainer.encoders.bert_encoder import default_initializer
from bert_trainer.models.flops import ENCODER_SIZES, mean_per_sequence, training_flops_per_example


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
        encoder can pack (`call_packed`, no `output_range`), shapes may vary for free here
        (`bert_trainer.ops.token_packing_is_free`: the CPU outside XLA, not an export; with
        the fused kernels or TensorFlow's ops) and Keras' flash attention is off."""
        return (hasattr(self.encoder, "call_packed")
                and getattr(self.encoder, "output_range", None) is None
                and keras.backend.backend() == "tensorflow"
                and not keras.config.is_flash_attention_enabled()
                and bert_ops.token_packing_is_free())

    # ---------------------------------------------------- model FLOPs (throughput and MFU)

    @property
    def counts_flops(self) -> bool:
        """Whether `training_flops` can count: the encoder's config gives the RFC sizes."""
        return set(ENCODER_SIZES) <= set(self.encoder.get_config())

    def flops_per_example(self, seq_length, *, computed_tokens=None):
        """Training FLOPs (forward + backward) per sequence of `seq_length` tokens
        (`models.flops.training_flops_per_example` with this model's sizes).

        Args:
          seq_length: tokens per sequence, padding included (a number or a scalar tensor).
          computed_tokens: tokens per sequence the layers compute when the model packs the
            real ones; None: all of them.

        Returns:
          FLOPs per sequence (a number, or a scalar tensor for tensor arguments).
        """
        return training_flops_per_example(
            seq_length=seq_length, computed_tokens=computed_tokens, **self._flop_sizes())

    def training_flops(self, inputs, outputs):
        """float32 scalar: the model FLOPs a training call on the batch `inputs` (with
        `outputs`, what it returned) executes, from the batch's dynamic shapes. Call it where
        the model was called (the same trace): what it packs is decided there."""
        del outputs  # the heads compute every output here
        batch, seq_length = self._batch_shape(inputs)
        return batch * self.flops_per_example(
            seq_length, computed_tokens=mean_per_sequence(self.packed_tokens(inputs), batch))

    def _batch_shape(self, inputs):
        """(batch, seq_length) of `inputs` as float32 scalars."""
        shape = ops.shape(inputs[features.INPUT_WORD_IDS])
        return ops.cast(shape[0], "float32"), ops.cast(shape[1], "float32")

    def _flop_sizes(self, per_prediction_layer=None) -> dict:
        """The encoder's sizes and the kernel parameters of the per-sequence heads: every
        trainable kernel outside the encoder and `per_prediction_layer`."""
        config = self.encoder.get_config()
        inside = {id(v) for v in self.encoder.weights}
        if per_prediction_layer is not None:
            inside |= {id(v) for v in per_prediction_layer.weights}
        head_params = sum(math.prod(v.shape) for v in self.trainable_weights
                          if len(v.shape) >= 2 and id(v) not in inside)
        return dict(num_layers=config["num_layers"], hidden_size=config["hidden_size"],
                    inner_dim=config["inner_dim"], embedding_width=config.get("embedding_width"),
                    head_params=head_params)

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
