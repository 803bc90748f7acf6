"""BERT's pretraining model: masked LM (tied to the word embeddings) + next sentence."""

import dataclasses

import keras
from keras import ops

from bert_trainer import features
from bert_trainer import ops as bert_ops
from bert_trainer.features import MLM_LOGITS, MLM_ROW_LOGITS, MLM_ROWS, NEXT_SENTENCE_LOGITS
from bert_trainer.heads import ClassificationHead
from bert_trainer.layers import MaskedLM
from bert_trainer.layers.initializers import clone_initializer
from bert_trainer.layers.positions import gather_positions
from bert_trainer.models.encoder_model import EncoderModel
from bert_trainer.models.flops import mean_per_sequence, training_flops_per_example

# In training with `Execution.skip_unweighted_predictions`, the masked LM computes the weighted
# predictions padded with unweighted ones to a multiple of this many rows, so that few
# distinct shapes occur.
PREDICTION_ROW_MULTIPLE = 16


@dataclasses.dataclass(frozen=True)
class Execution:
    """How a `BertPretrainer` computes, not what: switches that save time or FLOPs. They are
    not constructor arguments and not in `get_config()` (a checkpoint or config never records
    them); the pretraining task sets them from `PretrainingConfig` (`BertPretrainer.execution`).

    Attributes:
      sparse_last_layer: compute the encoder's last layer only at [CLS] and the masked
        positions (`BertEncoder.call_at_positions`), the only outputs pretraining reads:
        the same logits for fewer FLOPs (13 % fewer per step for mini at seq 128, P 20).
        Ignored for an encoder without that method or with `output_range` set.
      pack_tokens: with the sparse last layer, run the encoder on the real tokens only,
        not the padding (`BertEncoder.call_at_positions(pack=True)`): the same values (the
        dropout masks are another draw of the same distribution), and the dense layers'
        FLOPs shrink by the padding fraction (about 5 % of BERT's pretraining tokens). Only
        where shapes may vary for free (the CPU, outside XLA), for an encoder that packs
        (`packed_tokens`), and without Keras' flash attention.
      skip_unweighted_predictions: in training, when the inputs hold `masked_lm_weights`,
        compute the masked LM only at the predictions of nonzero weight (padded with
        unweighted ones to a multiple of `PREDICTION_ROW_MULTIPLE` rows) and return those
        rows (`mlm_row_logits`, `mlm_rows`) instead of `mlm_logits`: the vocabulary
        projection is about 30 % of a mini pretraining step's FLOPs, and 5-10 % of the P
        slots are padding (a 128-token sequence has 19 predictions for P = 20). Exact: a
        zero-weight prediction adds nothing to the loss or the gradients. Only where shapes
        may vary for free (the CPU, outside XLA). Off by default: the outputs then always
        have the documented `mlm_logits`.
      mlm_projection_in_compute_dtype: `MaskedLM(projection_in_compute_dtype=...)`: under a
        mixed policy, the tied vocabulary projection runs in bfloat16/float16 too.
    """

    sparse_last_layer: bool = True
    pack_tokens: bool = True
    skip_unweighted_predictions: bool = False
    mlm_projection_in_compute_dtype: bool = False


@keras.saving.register_keras_serializable(package="bert_trainer")
class BertPretrainer(EncoderModel):
    """encoder -> MaskedLM at the masked positions, and next-sentence logits on pooled.

    Public sublayers: `encoder`, `masked_lm` (`MaskedLM`, its projection tied to
    `encoder.get_embedding_table()`), `next_sentence` (`ClassificationHead` with 2 logits,
    no dropout as in google-research/bert; `None` when `num_next_sentence_labels=0`).

    How it computes (sparse last layer, token packing, ...) is its `execution` (`Execution`),
    set after construction; the defaults give the documented outputs for fewer FLOPs.

    Args:
      encoder: the encoder to pretrain.
      mlm_activation: activation of the MLM transform ("gelu" in BERT).
      num_next_sentence_labels: 2 for BERT's next-sentence task, 0 for MLM only.
      initializer: heads' initializer (default: the encoder's).

    Call args:
      inputs: dict with the encoder inputs and `masked_lm_positions` int `[batch, P]`;
        optionally `masked_lm_weights` `[batch, P]` (read with
        `Execution.skip_unweighted_predictions`).
      training: enables dropout.

    Returns:
      dict with `mlm_logits` float32 `[batch, P, vocab]` or, when only the weighted
      predictions were computed (`Execution.skip_unweighted_predictions`), `mlm_row_logits`
      float32 `[rows, vocab]` and `mlm_rows` int32 `[rows]` (row r holds slot `mlm_rows[r]`
      of the flattened `[batch * P]` predictions); and, unless MLM only,
      `next_sentence_logits` float32 `[batch, num_next_sentence_labels]`.
    """

    def __init__(self, encoder, mlm_activation="gelu", num_next_sentence_labels=2,
                 initializer=None, **kwargs):
        super().__init__(encoder, initializer=initializer, **kwargs)
        if not isinstance(num_next_sentence_labels, int) or num_next_sentence_labels < 0:
            raise ValueError(f"BertPretrainer: num_next_sentence_labels must be an int >= 0, got "
                             f"{num_next_sentence_labels!r}")
        self.mlm_activation = keras.activations.get(mlm_activation)
        self.num_next_sentence_labels = num_next_sentence_labels
        hidden = encoder.hidden_size
        self.masked_lm = MaskedLM(
            embedding_table=encoder.get_embedding_table(), activation=self.mlm_activation,
            initializer=clone_initializer(self.initializer), name="masked_lm",
            dtype=self.dtype_policy)
        self.masked_lm.build((None, None, hidden))
        self.next_sentence = None
        if num_next_sentence_labels:
            self.next_sentence = ClassificationHead(
                num_next_sentence_labels, dropout_rate=0.0,
                initializer=clone_initializer(self.initializer), name="next_sentence",
                dtype=self.dtype_policy)
            self.next_sentence.build((None, hidden))
        self.execution = Execution()
        self.built = True  # every head is built above

    @property
    def execution(self) -> Execution:
        """How this model computes (`Execution`); set it before the first call is traced."""
        return self._execution

    @execution.setter
    def execution(self, value: Execution) -> None:
        if not isinstance(value, Execution):
            raise TypeError(f"BertPretrainer.execution must be an Execution, got {value!r}")
        self._execution = value
        self.masked_lm.projection_in_compute_dtype = value.mlm_projection_in_compute_dtype

    def call(self, inputs, training=None):
        if features.MASKED_LM_POSITIONS not in inputs:
            raise ValueError(f"{self.name}: the features lack {features.MASKED_LM_POSITIONS!r}")
        positions = inputs[features.MASKED_LM_POSITIONS]
        if self.sparse_last_layer_active:
            # Nothing reads the last layer's other positions: compute only these and [CLS].
            encoded = self.encoder.call_at_positions(
                {key: inputs[key] for key in features.ENCODER_INPUTS}, positions,
                training=training, **({"pack": True} if self.packs_tokens() else {}))
            predicted = encoded[features.SEQUENCE_OUTPUT]  # (batch, P, hidden)
        else:
            encoded = self.encode(inputs, training=training)
            predicted = gather_positions(encoded[features.SEQUENCE_OUTPUT], positions)
        weights = inputs.get(features.MASKED_LM_WEIGHTS)
        if training and weights is not None and self.skips_unweighted_predictions():
            rows = weighted_rows(weights)  # (rows,)
            hidden = predicted.shape[-1]
            x = ops.take(ops.reshape(predicted, (-1, hidden)), rows, axis=0)
            # expand_dims/squeeze, not x[None]/logits[0]: a slice's gradient is a zero-filled
            # copy of the whole input ([1, rows, vocab], ~70 MB for mini); a reshape's is free.
            logits = self.masked_lm(ops.expand_dims(x, 0))  # (1, rows, vocab)
            outputs = {MLM_ROW_LOGITS: ops.squeeze(logits, 0), MLM_ROWS: rows}
        else:
            outputs = {MLM_LOGITS: self.masked_lm(predicted)}
        if self.next_sentence is not None:
            outputs[NEXT_SENTENCE_LOGITS] = self.next_sentence(
                encoded[features.POOLED_OUTPUT], training=training)
        return outputs

    def skips_unweighted_predictions(self) -> bool:
        """Whether a training call traced here, now, computes only the weighted predictions
        (asked, and the shapes may vary: the CPU, outside XLA)."""
        return (self.execution.skip_unweighted_predictions
                and keras.backend.backend() == "tensorflow"
                and bert_ops.dynamic_shapes_are_free())

    def packs_tokens(self) -> bool:
        """Whether a call traced here, now, runs the encoder on the real tokens only (asked,
        the sparse last layer runs, and the shapes may vary: the CPU, outside XLA)."""
        return (self.execution.pack_tokens and self.sparse_last_layer_active
                and hasattr(self.encoder, "packed_tokens")
                and keras.backend.backend() == "tensorflow"
                and not keras.config.is_flash_attention_enabled()
                and bert_ops.dynamic_shapes_are_free())

    def packed_tokens(self, inputs):
        """int32 scalar: the tokens per layer a call traced here, now, computes on `inputs`
        when it packs them (`packs_tokens()`), else None (every slot)."""
        if not self.packs_tokens():
            return None
        return self.encoder.packed_tokens(
            {key: inputs[key] for key in features.ENCODER_INPUTS},
            inputs[features.MASKED_LM_POSITIONS])

    @property
    def sparse_last_layer_active(self) -> bool:
        """Whether the last layer runs at [CLS] + masked positions only (asked and possible)."""
        return (self.execution.sparse_last_layer and hasattr(self.encoder, "call_at_positions")
                and getattr(self.encoder, "output_range", None) is None)

    def flops_per_example(self, seq_length, num_predictions=0, *, computed_predictions=None,
                          computed_tokens=None):
        """Training FLOPs (forward + backward) per sequence (`EncoderModel.flops_per_example`),
        with the masked LM on `num_predictions` positions (`computed_predictions` of them
        when it skips the unweighted ones) and the last layer as it runs (sparse or not)."""
        sparse = self.sparse_last_layer_active
        return training_flops_per_example(
            seq_length=seq_length, num_predictions=num_predictions,
            vocab_size=self.encoder.get_config()["vocab_size"],
            last_layer_rows=1 + num_predictions if sparse else None,
            computed_predictions=computed_predictions, computed_tokens=computed_tokens,
            **self._flop_sizes(per_prediction_layer=self.masked_lm))

    def training_flops(self, inputs, outputs):
        """float32 scalar: the FLOPs a training call executed (`EncoderModel.training_flops`):
        the masked LM on the rows it computed (`outputs`), the layers on the tokens it packed."""
        batch, seq_length = self._batch_shape(inputs)
        predictions = ops.cast(ops.shape(inputs[features.MASKED_LM_POSITIONS])[1], "float32")
        rows = ops.shape(outputs[MLM_ROWS])[0] if MLM_ROWS in outputs else None
        return batch * self.flops_per_example(
            seq_length, predictions, computed_predictions=mean_per_sequence(rows, batch),
            computed_tokens=mean_per_sequence(self.packed_tokens(inputs), batch))

    def get_config(self):
        config = super().get_config()
        config.update(mlm_activation=keras.activations.serialize(self.mlm_activation),
                      num_next_sentence_labels=self.num_next_sentence_labels)
        return config

    @classmethod
    def from_config(cls, config):
        # Configs written before `execution` existed carry its switches as arguments.
        config = dict(config)
        switches = {f.name: config.pop(f.name) for f in dataclasses.fields(Execution)
                    if f.name in config}
        model = super().from_config(config)
        model.execution = Execution(**switches)
        return model


def computed_prediction_rows(num_weighted: int, total: int) -> int:
    """Rows the masked LM computes in training, skipping unweighted predictions, for a batch
    with `num_weighted` weighted predictions out of `total` (batch x P): `num_weighted`
    rounded up to a multiple of `PREDICTION_ROW_MULTIPLE`, at most `total`."""
    multiple = PREDICTION_ROW_MULTIPLE
    return min(total, -(-num_weighted // multiple) * multiple)


def weighted_rows(weights):
    """int32 `[rows]`: the flat slots (`batch index * P + k`) of the nonzero `weights`
    `[batch, P]` in order, then zero-weight slots up to
    `computed_prediction_rows(count, batch * P)` rows."""
    import tensorflow as tf  # noqa: PLC0415 - the TensorFlow path only

    flat = tf.reshape(weights, [-1])
    weighted = tf.cast(tf.not_equal(flat, 0), tf.int32)
    total = tf.size(flat)
    multiple = PREDICTION_ROW_MULTIPLE
    count = tf.minimum(total, (tf.reduce_sum(weighted) + multiple - 1) // multiple * multiple)
    order = tf.argsort(1 - weighted, stable=True)  # weighted slots first, each group in order
    return tf.cast(order[:count], tf.int32)
