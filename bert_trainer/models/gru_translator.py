"""The course's recurrent translators: a GRU encoder-decoder, with or without Bahdanau attention.

    states = GRU(source_embedding(input_word_ids), mask=input_mask)     # (batch, s, units)
    outputs = GRU(target_embedding(decoder_input_ids), initial_state=states[:, -1])
    outputs = tanh_dense([attention(outputs, states), outputs])          # with attention only
    logits = output_projection(outputs)                                  # float32 (batch, t, vocab)

The encoder's last state starts the decoder (a masked step carries the state forward, so
`states[:, -1]` is the state after the last real token of a right-padded row). Attention is
Keras's `AdditiveAttention` (Bahdanau's score) over the encoder states, queried by the decoder
GRU's outputs, as TensorFlow's NMT tutorial does: teacher forcing stays one parallel pass.
Source and target have embedding tables of their own over one joint vocabulary.

The encoder half is `encoders.GruEncoder` (`build_encoder.kind = "gru"`, an encoder as the
rest of bert-train sees one); `GruTranslator` wraps it
with the decoder and speaks `generation.seq2seq`'s decoding protocol (`encode`, `init_cache`,
`decode_step`): the cache is the decoder's state, and with attention the encoder states ride
along as a constant entry, so greedy and beam search, BLEU, export and serving are the
Transformer's. Configs: `configs/translate/gru.gin`, `configs/translate/gru_attention.gin`.
"""

import keras
from keras import ops

from bert_trainer import features
from bert_trainer.encoders.gru_encoder import GruEncoder, positive_ints
from bert_trainer.models.seq2seq_transformer import TARGET_LABELS, TARGET_LOGITS, TARGET_ROWS

# The decoding cache's constant entry (`generation.seq2seq`: read by every step, never
# written, tiled to the beams once): here, the encoder states attention reads.
_MEMORY = "cross_key"


@keras.saving.register_keras_serializable(package="bert_trainer")
class GruTranslator(keras.Model):
    """`encoder` (a `GruEncoder`) reads the source; a GRU of the same width decodes the target
    from the encoder's last state (see the module docstring).

    Public sublayers: `encoder`, `target_embeddings`, `decoder_gru`, `attention` and
    `attention_combine` (None without attention), `output_projection`.

    Args:
      encoder: a `GruEncoder`.
      attention: Bahdanau (additive) attention over the encoder states.
      max_target_length: longest target the task trains on; None: the encoder's
        `max_sequence_length`.
      **kwargs: `keras.Model` arguments (the dtype policy defaults to the encoder's).

    Call args:
      inputs: dict with `input_word_ids`, `input_mask` and `decoder_input_ids` `[batch, t]`
        (teacher forcing); with `target_ids` (0 = padding) only the real target tokens are
        projected on the vocabulary.

    Returns:
      dict `logits` float32 `[batch, t, vocab]`, row `j` predicting target token `j + 1`; or,
      given `target_ids`, `target_logits` `[n, vocab]`, `target_labels` and `target_rows`
      `[n]` of the real target tokens (as `Seq2SeqTransformer`).
    """

    def __init__(self, encoder, attention=False, max_target_length=None, **kwargs):
        kwargs.setdefault("dtype", encoder.dtype_policy)
        kwargs.setdefault("name", "gru_translator")
        super().__init__(**kwargs)
        if not isinstance(encoder, GruEncoder):
            raise ValueError(f"GruTranslator: encoder must be a GruEncoder, got "
                             f"{type(encoder).__name__}")
        max_target_length = max_target_length or encoder.max_sequence_length
        positive_ints("GruTranslator", max_target_length=max_target_length)
        self.encoder = encoder
        self.use_attention = bool(attention)
        self._max_target_length = max_target_length
        units, dtype = encoder.hidden_size, self.dtype_policy
        self.target_embeddings = keras.layers.Embedding(
            encoder.vocab_size, encoder.embedding_width, name="target_embeddings", dtype=dtype)
        self.decoder_gru = keras.layers.GRU(units, return_sequences=True, return_state=True,
                                            name="decoder_gru", dtype=dtype)
        self.attention = self.attention_combine = None
        if self.use_attention:
            self.attention = keras.layers.AdditiveAttention(name="attention", dtype=dtype)
            self.attention_combine = keras.layers.Dense(units, activation="tanh",
                                                        name="attention_combine", dtype=dtype)
        self.dropout = keras.layers.Dropout(encoder.dropout_rate, name="dropout", dtype=dtype)
        self.output_projection = keras.layers.Dense(encoder.vocab_size, name="output_projection",
                                                    dtype=dtype)
        self.target_embeddings.build((None, None))  # built here: stable variable paths
        self.decoder_gru.build((None, None, encoder.embedding_width))
        if self.use_attention:
            self.attention.build([(None, None, units), (None, None, units)])
            self.attention_combine.build((None, None, 2 * units))
        self.output_projection.build((None, units))
        self.built = True

    @property
    def vocab_size(self):
        return self.encoder.vocab_size

    @property
    def max_target_length(self):
        return self._max_target_length

    def encode(self, inputs, training=None):
        """`(encoder states [batch, s, units], source mask [batch, s])`."""
        outputs = self.encoder(inputs, training=training)
        return outputs[features.SEQUENCE_OUTPUT], inputs[features.INPUT_MASK]

    def _attend(self, outputs, states, mask):
        """The decoder outputs `[batch, t, units]`, joined with their attention context."""
        if self.attention is None:
            return outputs
        context = self.attention([outputs, states], mask=[None, ops.cast(mask, "bool")])
        return self.attention_combine(ops.concatenate([context, outputs], axis=-1))

    def call(self, inputs, training=None):
        if features.DECODER_INPUT_IDS not in inputs:
            raise ValueError(f"{self.name}: the features lack {features.DECODER_INPUT_IDS!r}")
        states, mask = self.encode(inputs, training=training)
        ids = inputs[features.DECODER_INPUT_IDS]
        x = self.dropout(self.target_embeddings(ids), training=training)
        outputs, _ = self.decoder_gru(x, initial_state=states[:, -1],
                                      mask=ops.not_equal(ids, 0), training=training)
        hidden = self.dropout(self._attend(outputs, states, mask), training=training)
        targets = inputs.get(features.TARGET_IDS)
        if targets is None:
            return {features.LOGITS: ops.cast(self.output_projection(hidden), "float32")}
        where = ops.stack(ops.nonzero(targets), axis=1)  # (n, 2): the real target tokens
        width = ops.cast(ops.shape(targets)[1], where.dtype)
        flat = where[:, 0] * width + where[:, 1]
        rows = ops.take(ops.reshape(hidden, (-1, hidden.shape[-1])), flat, axis=0)
        labels = ops.take(ops.reshape(targets, (-1,)), flat, axis=0)
        return {TARGET_LOGITS: ops.cast(self.output_projection(rows), "float32"),
                TARGET_LABELS: ops.cast(labels, "int32"),
                TARGET_ROWS: ops.cast(where[:, 0], "int32")}

    def init_cache(self, batch_size, max_length, encoder_output=None):
        """The decoding cache: `{"state": the encoder's last state}` (and the encoder states,
        with attention). `batch_size` and `max_length` are not needed by a GRU.

        Raises:
          ValueError: no `encoder_output` (the decoder starts from its last state).
        """
        del batch_size, max_length
        if encoder_output is None:
            raise ValueError(f"{self.name}.init_cache needs encoder_output: the decoder starts "
                             "from the encoder's last state")
        cache = {"state": encoder_output[:, -1]}
        if self.attention is not None:
            cache[_MEMORY] = encoder_output
        return cache

    def decode_step(self, token_ids, index, cache, encoder_output, encoder_mask):
        """One decoding step: `(logits [batch, vocab] float32, new cache)`, equal to `call`'s
        logits at position `index` for the same target prefix."""
        del index  # the state holds the position
        x = self.target_embeddings(ops.cast(token_ids, "int32"))  # (batch, width)
        output, state = self.decoder_gru.cell(x, cache["state"], training=False)
        memory = cache.get(_MEMORY, encoder_output)
        hidden = self._attend(output[:, None], memory, encoder_mask)[:, 0]
        new_cache = {**cache, "state": state}
        return ops.cast(self.output_projection(hidden), "float32"), new_cache

    def get_config(self):
        return {"name": self.name, "dtype": keras.dtype_policies.serialize(self.dtype_policy),
                "encoder": keras.saving.serialize_keras_object(self.encoder),
                "attention": self.use_attention, "max_target_length": self._max_target_length}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["encoder"] = keras.saving.deserialize_keras_object(config["encoder"])
        return cls(**config)
