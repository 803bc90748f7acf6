"""BERT's pretraining model: masked LM (tied to the word embeddings) + next sentence."""

import keras
from keras import ops

from bert_trainer import features
from bert_trainer import ops as bert_ops
from bert_trainer.heads import ClassificationHead
from bert_trainer.layers import MaskedLM
from bert_trainer.layers.initializers import clone_initializer
from bert_trainer.layers.positions import gather_positions
from bert_trainer.models.encoder_model import EncoderModel
from bert_trainer.models.output_names import (
    MLM_LOGITS,
    MLM_ROW_LOGITS,
    MLM_ROWS,
    NEXT_SENTENCE_LOGITS,
)


@keras.saving.register_keras_serializable(package="bert_trainer")
class BertPretrainer(EncoderModel):
    """encoder -> MaskedLM at the masked positions, and next-sentence logits on pooled.

    Public sublayers: `encoder`, `masked_lm` (`MaskedLM`, its projection tied to
    `encoder.get_embedding_table()`), `next_sentence` (`ClassificationHead` with 2 logits,
    no dropout as in google-research/bert; `None` when `num_next_sentence_labels=0`).

    Args:
      encoder: the encoder to pretrain.
      mlm_activation: activation of the MLM transform ("gelu" in BERT).
      num_next_sentence_labels: 2 for BERT's next-sentence task, 0 for MLM only.
      initializer: heads' initializer (default: the encoder's).
      sparse_last_layer: compute the encoder's last layer only at [CLS] and the masked
        positions (`BertEncoder.call_at_positions`), the only outputs pretraining reads:
        the same logits for fewer FLOPs (13 % fewer per step for mini at seq 128, P 20).
        Ignored for an encoder without that method or with `output_range` set.
      mlm_projection_in_compute_dtype: `MaskedLM(projection_in_compute_dtype=...)`: under a
        mixed policy, the tied vocabulary projection runs in bfloat16/float16 too.
      pack_tokens: with the sparse last layer, run the encoder on the real tokens only,
        not the padding (`BertEncoder.call_at_positions(pack=True)`): the same values (the
        dropout masks are another draw of the same distribution), and the dense layers'
        FLOPs shrink by the padding fraction (about 5 % of BERT's pretraining tokens). Only
        where shapes may vary for free (the CPU, outside XLA), for an encoder that packs
        (`packed_tokens`), and without Keras' flash attention.
      skip_unweighted_predictions: in training, when the inputs hold `masked_lm_weights`,
        compute the masked LM only at the predictions of nonzero weight (padded with
        unweighted ones to a multiple of `features.PREDICTION_ROW_MULTIPLE` rows) and
        return those rows: the vocabulary projection is about 30 % of a mini pretraining
        step's FLOPs, and 5-10 % of the P slots are padding (a 128-token sequence has 19
        predictions for P = 20). Exact: a zero-weight prediction adds nothing to the loss
        or the gradients. Only where shapes may vary for free (the CPU, outside XLA); on
        GPUs and TPUs and under XLA every slot is computed.

    Call args:
      inputs: dict with the encoder inputs and `masked_lm_positions` int `[batch, P]`;
        optionally `masked_lm_weights` `[batch, P]` (see `skip_unweighted_predictions`).
      training: enables dropout.

    Returns:
      dict with `mlm_logits` float32 `[batch, P, vocab]` or, when only the weighted
      predictions were computed, `mlm_row_logits` float32 `[rows, vocab]` and `mlm_rows`
      int32 `[rows]` (row r holds slot `mlm_rows[r]` of the flattened `[batch * P]`
      predictions); and, unless MLM only, `next_sentence_logits` float32
      `[batch, num_next_sentence_labels]`.
    """

    def __init__(self, encoder, mlm_activation="gelu", num_next_sentence_labels=2,
                 initializer=None, sparse_last_layer=True, mlm_projection_in_compute_dtype=False,
                 skip_unweighted_predictions=True, pack_tokens=True, **kwargs):
        super().__init__(encoder, initializer=initializer, **kwargs)
        if not isinstance(num_next_sentence_labels, int) or num_next_sentence_labels < 0:
            raise ValueError(f"BertPretrainer: num_next_sentence_labels must be an int >= 0, got "
                             f"{num_next_sentence_labels!r}")
        self.mlm_activation = keras.activations.get(mlm_activation)
        self.num_next_sentence_labels = num_next_sentence_labels
        self.sparse_last_layer = bool(sparse_last_layer)
        self.skip_unweighted_predictions = bool(skip_unweighted_predictions)
        self.pack_tokens = bool(pack_tokens)
        hidden = encoder.hidden_size
        self.masked_lm = MaskedLM(
            embedding_table=encoder.get_embedding_table(), activation=self.mlm_activation,
            initializer=clone_initializer(self.initializer), name="masked_lm",
            projection_in_compute_dtype=mlm_projection_in_compute_dtype, dtype=self.dtype_policy)
        self.masked_lm.build((None, None, hidden))
        self.next_sentence = None
        if num_next_sentence_labels:
            self.next_sentence = ClassificationHead(
                num_next_sentence_labels, dropout_rate=0.0,
                initializer=clone_initializer(self.initializer), name="next_sentence",
                dtype=self.dtype_policy)
            self.next_sentence.build((None, hidden))
        self.built = True  # every head is built above

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
        return (self.skip_unweighted_predictions and keras.backend.backend() == "tensorflow"
                and bert_ops.dynamic_shapes_are_free())

    def packs_tokens(self) -> bool:
        """Whether a call traced here, now, runs the encoder on the real tokens only (asked,
        the sparse last layer runs, and the shapes may vary: the CPU, outside XLA)."""
        return (self.pack_tokens and self.sparse_last_layer_active
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
        return (self.sparse_last_layer and hasattr(self.encoder, "call_at_positions")
                and getattr(self.encoder, "output_range", None) is None)

    def get_config(self):
        config = super().get_config()
        config.update(mlm_activation=keras.activations.serialize(self.mlm_activation),
                      num_next_sentence_labels=self.num_next_sentence_labels,
                      sparse_last_layer=self.sparse_last_layer,
                      mlm_projection_in_compute_dtype=self.masked_lm.projection_in_compute_dtype,
                      skip_unweighted_predictions=self.skip_unweighted_predictions,
                      pack_tokens=self.pack_tokens)
        return config


def weighted_rows(weights):
    """int32 `[rows]`: the flat slots (`batch index * P + k`) of the nonzero `weights`
    `[batch, P]` in order, then zero-weight slots up to
    `features.computed_prediction_rows(count, batch * P)` rows."""
    import tensorflow as tf  # noqa: PLC0415 - the TensorFlow path only

    flat = tf.reshape(weights, [-1])
    weighted = tf.cast(tf.not_equal(flat, 0), tf.int32)
    total = tf.size(flat)
    multiple = features.PREDICTION_ROW_MULTIPLE
    count = tf.minimum(total, (tf.reduce_sum(weighted) + multiple - 1) // multiple * multiple)
    order = tf.argsort(1 - weighted, stable=True)  # weighted slots first, each group in order
    return tf.cast(order[:count], tf.int32)
