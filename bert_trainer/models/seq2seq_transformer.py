"""An encoder-decoder Transformer: a BERT encoder, a causal decoder stack, tied output."""

import keras
from keras import ops

from bert_trainer import features
from bert_trainer.layers import (
    Dropout,
    LayerNormalization,
    OnDeviceEmbedding,
    PositionEmbedding,
    SinusoidalPositionEncoding,
    TransformerDecoder,
    tied_projection,
)
from bert_trainer.layers.initializers import clone_initializer
from bert_trainer.layers.packing import TokenPacking
from bert_trainer.models.encoder_model import EncoderModel

POSITION_ENCODINGS = ("learned", "sinusoidal")
# Outputs of a call given `target_ids`: the logits of the real target tokens only.
TARGET_LOGITS = "target_logits"  # float32 [n, vocab], row k for token (row, position) k
TARGET_LABELS = "target_labels"  # int32 [n], the target ids of those tokens
TARGET_ROWS = "target_rows"  # int32 [n], the example (batch row) of each token


@keras.saving.register_keras_serializable(package="bert_trainer")
class Seq2SeqTransformer(EncoderModel):
    """`encoder` (a `BertEncoder`) reads the source; a stack of `TransformerDecoder` blocks
    reads the target left to right, attending to the encoder output.

    target = dropout(LN(word(decoder_input_ids) + position))   # (batch, t, width)
    x = target_embedding_projection(target)                    # to hidden, if factorized
    x = decoder_layers[i](x, encoder_output, encoder_mask)     # for each layer
    logits = output_transform(x) @ word_table^T + output_bias  # float32 (batch, t, vocab)

    The decoder has the encoder's sizes (hidden, heads, inner_dim, activation, dropouts,
    norm epsilon, initializer): BERT's layer `i` maps onto decoder layer `i`, which is what a
    BERT2BERT warm start (`bert_trainer.interop.bert2bert`) copies. The target has no token
    types: that warm start folds BERT's type-0 embedding into the decoder's position table.

    Public sublayers: `encoder`, `target_embeddings` (the encoder's `word_embeddings` when
    shared), `target_position_embedding`, `target_embeddings_layer_norm`,
    `target_embedding_projection` (None unless the shared table is factorized),
    `decoder_layers`, `output_transform` (None unless factorized), `output_projection`
    (its `bias`: `output_bias`).

    Args:
      encoder: a `BertEncoder` (any size; `output_range` must be None).
      num_decoder_layers: decoder blocks; None: the encoder's `num_layers`.
      share_embeddings: the target side uses the encoder's word-embedding table (one joint
        vocabulary); False: a table of its own, `[vocab_size, hidden]`.
      position_encoding: "learned" (a `[max_target_length, width]` table) or "sinusoidal".
      max_target_length: longest target; None: the encoder's `max_sequence_length`.
      share_encoder_decoder: decoder block `i` uses encoder layer `i`'s self-attention,
        feed-forward network and layer norms (Rothe et al. 2020, "BERTShare"); the
        cross-attention stays separate. Needs `num_decoder_layers <= num_layers`.
      initializer: of the decoder's new weights; None: the encoder's.
      **kwargs: `keras.Model` arguments (`name`, `dtype`; the policy defaults to the encoder's).

    Call args:
      inputs: dict with the encoder inputs (`input_word_ids`, `input_mask`,
        `input_type_ids`) and `decoder_input_ids` `[batch, t]` int (teacher forcing).
      training: enables dropout.

      The inputs may also hold `target_ids` `[batch, t]` (0 = padding): then only the
        real target tokens are projected on the vocabulary (the projection and the loss
        over it are most of a small model's step; padding and the tokens after [SEP] need
        neither), and the outputs are `TARGET_LOGITS`, `TARGET_LABELS`, `TARGET_ROWS`
        instead of `logits`.

    Returns:
      dict `logits`: float32 `[batch, t, vocab]`, row `j` predicting target token `j + 1`;
      or, given `target_ids`, the target tokens' rows (see above).
    """

    def __init__(self, encoder, num_decoder_layers=None, share_embeddings=True,
                 position_encoding="learned", max_target_length=None,
                 share_encoder_decoder=False, initializer=None, **kwargs):
        super().__init__(encoder, initializer=initializer, **kwargs)
        num_decoder_layers = num_decoder_layers or encoder.num_layers
        max_target_length = max_target_length or encoder.max_sequence_length
        self._check_args(encoder, num_decoder_layers, position_encoding, max_target_length,
                         share_encoder_decoder)
        self.num_decoder_layers = num_decoder_layers
        self.share_embeddings = share_embeddings
        self.position_encoding = position_encoding
        self._max_target_length = max_target_length
        self.share_encoder_decoder = share_encoder_decoder
        hidden = encoder.hidden_size
        dtype = self.dtype_policy
        self._make_target_embeddings(encoder, hidden, dtype)
        self.decoder_layers = []
        for i in range(num_decoder_layers):
            layer = TransformerDecoder(
                num_attention_heads=encoder.num_attention_heads, inner_dim=encoder.inner_dim,
                inner_activation=encoder.inner_activation, output_dropout=encoder.output_dropout,
                attention_dropout=encoder.attention_dropout, norm_epsilon=encoder.norm_epsilon,
                kernel_initializer=clone_initializer(self.initializer),
                name=f"decoder_layer_{i}", dtype=dtype)
            if share_encoder_decoder:
                layer.share_weights_with(encoder.transformer_layers[i])
            layer.build((None, None, hidden))
            self.decoder_layers.append(layer)
        width = self.target_embeddings.embedding_width
        self.output_transform = None
        if width != hidden:  # factorized shared table: back to its width before the tie
            self.output_transform = keras.layers.Dense(
                width, kernel_initializer=clone_initializer(self.initializer),
                name="output_transform", dtype=dtype)
            self.output_transform.build((None, hidden))
        self.output_projection = _TiedOutputProjection(name="output_projection", dtype=dtype)
        self.output_projection.build((None, None, width), encoder.vocab_size)
        self.built = True  # every layer is built above

    @staticmethod
    def _check_args(encoder, num_decoder_layers, position_encoding, max_target_length,
                    share_encoder_decoder):
        for name in ("hidden_size", "num_layers", "transformer_layers", "word_embeddings"):
            if not hasattr(encoder, name):
                raise ValueError(f"Seq2SeqTransformer: encoder must be a BertEncoder (it lacks "
                                 f"{name!r})")
        if getattr(encoder, "output_range", None) is not None:
            raise ValueError("Seq2SeqTransformer: the encoder's output_range must be None (the "
                             "decoder attends to every source position)")
        if getattr(encoder, "norm_first", False):
            raise ValueError("Seq2SeqTransformer: the encoder is pre-norm (norm_first=True) but "
                             "the decoder blocks are post-norm and warm start from its layers; "
                             "use an encoder with norm_first=False")
        if position_encoding not in POSITION_ENCODINGS:
            raise ValueError(f"Seq2SeqTransformer: position_encoding={position_encoding!r} is "
                             f"unknown; use one of {POSITION_ENCODINGS}")
        for name, value in (("num_decoder_layers", num_decoder_layers),
                            ("max_target_length", max_target_length)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Seq2SeqTransformer: {name} must be a positive int, "
                                 f"got {value!r}")
        if share_encoder_decoder and num_decoder_layers > encoder.num_layers:
            raise ValueError(f"Seq2SeqTransformer: share_encoder_decoder needs num_decoder_layers"
                             f" <= the encoder's {encoder.num_layers}, got {num_decoder_layers}")

    def _make_target_embeddings(self, encoder, hidden, dtype):
        """The target word table, positions, LayerNorm, dropout (and projection)."""
        self.target_embedding_projection = None
        if self.share_embeddings:
            self.target_embeddings = encoder.word_embeddings
            # A factorized table is projected to hidden by the encoder's own projection.
            self.target_embedding_projection = encoder.embedding_projection
        else:
            self.target_embeddings = OnDeviceEmbedding(
                encoder.vocab_size, hidden, initializer=clone_initializer(self.initializer),
                name="target_embeddings", dtype=dtype)
            self.target_embeddings.build()
        width = self.target_embeddings.embedding_width
        if self.position_encoding == "learned":
            self.target_position_embedding = PositionEmbedding(
                self._max_target_length, initializer=clone_initializer(self.initializer),
                name="target_position_embedding", dtype=dtype)
            self.target_position_embedding.build((None, None, width))
        else:
            self.target_position_embedding = SinusoidalPositionEncoding(
                name="target_position_embedding", dtype=dtype)
        self.target_embeddings_layer_norm = LayerNormalization(
            epsilon=encoder.norm_epsilon, name="target_embeddings_layer_norm", dtype=dtype)
        self.target_embeddings_layer_norm.build((None, None, width))
        self.target_embeddings_dropout = Dropout(
            encoder.output_dropout, name="target_embeddings_dropout", dtype=dtype)

    @property
    def vocab_size(self):
        return self.encoder.vocab_size

    @property
    def max_target_length(self):
        return self._max_target_length

    # ------------------------------------------------------------------ forward passes

    def encode(self, inputs, training=None, **kwargs):
        """The source side.

        Args:
          inputs: dict with the encoder inputs (other keys are ignored).
          training: enables dropout.

        Returns:
          `(encoder_output [batch, s, hidden], encoder_mask [batch, s])`.
        """
        if kwargs:  # EncoderModel's own options make no sense for a decoder's memory
            raise TypeError(f"{self.name}.encode takes no {sorted(kwargs)}")
        outputs = super().encode(inputs, training=training)
        return outputs[features.SEQUENCE_OUTPUT], inputs[features.INPUT_MASK]

    def call(self, inputs, training=None):
        if features.DECODER_INPUT_IDS not in inputs:
            raise ValueError(f"{self.name}: the features lack {features.DECODER_INPUT_IDS!r}")
        encoder_output, encoder_mask = self.encode(inputs, training=training)
        decoder_input_ids = inputs[features.DECODER_INPUT_IDS]
        targets = inputs.get(features.TARGET_IDS)
        if targets is None:
            return {features.LOGITS: self.decode(decoder_input_ids, encoder_output,
                                                 encoder_mask, training=training)}
        where = ops.stack(ops.nonzero(targets), axis=1)  # (n, 2): the real target tokens
        if self.packs_tokens():  # the decoder computes the real target tokens only
            rows = self._decode_packed(decoder_input_ids, targets, encoder_output,
                                       encoder_mask, training)  # (n, hidden), in `where` order
        else:
            x = self.decode(decoder_input_ids, encoder_output, encoder_mask, training=training,
                            project=False)
            rows = _gather_rows(x, where)  # (n, hidden)
        return {TARGET_LOGITS: self.logits(rows[None])[0],
                TARGET_LABELS: ops.cast(_gather_rows(targets, where), "int32"),
                TARGET_ROWS: ops.cast(where[:, 0], "int32")}

    def decode(self, decoder_input_ids, encoder_output, encoder_mask, training=None,
               project=True):
        """The decoder over a whole target prefix, without a cache (teacher forcing, and the
        uncached decoding baseline, which must not pay for the encoder again).

        Args:
          decoder_input_ids: int `[batch, t]`.
          encoder_output, encoder_mask: from `encode`.
          training: enables dropout.
          project: False returns the last block's output `[batch, t, hidden]` instead.

        Returns:
          float32 logits `[batch, t, vocab]`.
        """
        length = decoder_input_ids.shape[1]
        if (self.position_encoding == "learned" and length is not None
                and length > self._max_target_length):
            raise ValueError(f"{self.name}: decoder_input_ids has length {length}, longer than "
                             f"max_target_length={self._max_target_length}")
        x = self._embed_targets(decoder_input_ids, training=training)
        for layer in self.decoder_layers:
            x = layer(x, encoder_output=encoder_output, encoder_mask=encoder_mask,
                      training=training)
        return self.logits(x) if project else x

    def _decode_packed(self, decoder_input_ids, targets, encoder_output, encoder_mask,
                       training):
        """The last decoder block's output at the real target tokens, `[n, hidden]` in
        row-major order, with every block computed on those rows only (`TokenPacking`).

        Targets are right-padded and a decoder input is real where its target is, so the
        causal mask already hides the padding from every real token: the rows equal the
        unpacked decoder's (`decode(..., project=False)`) at those slots. About a third of
        the slots of length-bucketed translation batches are padding.
        """
        packing = TokenPacking(ops.not_equal(targets, 0))
        x = packing.pack(self._embed_targets(decoder_input_ids, training=training))
        for layer in self.decoder_layers:
            x = layer(x, encoder_output=encoder_output, encoder_mask=encoder_mask,
                      training=training, packing=packing)
        return x

    def init_cache(self, batch_size, max_length, encoder_output=None):
        """Empty key/value caches of every decoder layer for `decode_step`.

        Args:
          batch_size: rows (int or scalar tensor).
          max_length: positions to decode (static int, at most `max_target_length` for
            learned positions).
          encoder_output: optional `[batch, s, hidden]`: each layer's cross-attention keys
            and values are projected once, here, and kept in the cache, so steps skip them
            (`decode_step` then reads only the mask of its `encoder_output`).

        Returns:
          `{"layer_i": {"key", "value"[, "cross_key", "cross_value"]}}`, batch-major
          tensors in the compute dtype (`TransformerDecoder.init_cache`).
        """
        if self.position_encoding == "learned" and max_length > self._max_target_length:
            raise ValueError(f"{self.name}: max_length={max_length} exceeds "
                             f"max_target_length={self._max_target_length}")
        return {f"layer_{i}": layer.init_cache(batch_size, max_length, encoder_output)
                for i, layer in enumerate(self.decoder_layers)}

    def decode_step(self, token_ids, index, cache, encoder_output, encoder_mask,
                    output_table=None):
        """One decoding step: the logits after `token_ids` at position `index`.

        Args:
          token_ids: int `[batch]`, the tokens at position `index`.
          index: int32 scalar.
          cache: from `init_cache` or the previous step.
          encoder_output, encoder_mask: from `encode` (the output may be None if the cache
            holds the cross-attention keys and values).
          output_table: optional `decoding_table()`, computed once before the loop.

        Returns:
          `(logits [batch, vocab] float32, new_cache)`; the logits equal `call`'s at `index`.
        """
        index = ops.cast(index, "int32")
        x = self._embed_targets(ops.cast(token_ids, "int32")[:, None], index=index)
        new_cache = {}
        for i, layer in enumerate(self.decoder_layers):
            key = f"layer_{i}"
            x, new_cache[key] = layer(x, encoder_output=encoder_output,
                                      encoder_mask=encoder_mask, cache=cache[key],
                                      decode_index=index)
        return self.logits(x, output_table)[:, 0, :], new_cache

    def _embed_targets(self, ids, index=None, training=None):
        """Target embeddings: `[batch, t]` ids at positions `index + [0, t)` (None: from 0)
        -> `[batch, t, hidden]`."""
        word = self.target_embeddings(ids)  # (batch, t, width)
        if index is None:
            positions = self.target_position_embedding(word)
        else:
            positions = self._positions_at(index, ops.shape(ids)[1], word)
        x = self.target_embeddings_layer_norm(word + ops.cast(positions, word.dtype))
        x = self.target_embeddings_dropout(x, training=training)
        if self.target_embedding_projection is not None:
            x = self.target_embedding_projection(x)
        return x

    def _positions_at(self, index, length, word):
        """Position encodings `[1, length, width]` of positions `index + [0, length)`."""
        positions = index + ops.arange(length, dtype="int32")
        if self.position_encoding == "learned":
            table = self.target_position_embedding.embeddings
        else:  # the table up to max_target_length; a step reads `length` rows of it
            shape = (1, self._max_target_length, word.shape[-1])
            table = self.target_position_embedding(ops.zeros(shape, word.dtype))[0]
        return ops.take(ops.cast(table, word.dtype), positions, axis=0)[None]

    def logits(self, x, output_table=None):
        """float32 logits `[batch, t, vocab]`: `x` `[batch, t, hidden]` (from
        `decode(..., project=False)`) projected on the target embedding table.

        `output_table` (optional): `decoding_table()`; the same logits, for a decoding loop."""
        if self.output_transform is not None:
            x = self.output_transform(x)  # (batch, t, width)
        return self.output_projection(x, self.target_embeddings.embeddings, output_table)

    def decoding_table(self):
        """The target embedding table transposed, `[width, vocab]` in the compute dtype: the
        `output_table` of `decode_step` and `logits`, made once per decoding loop (a step
        projects a few rows on the whole vocabulary, faster from this copy:
        `layers.tied_projection`)."""
        return tied_projection.decoding_table(self.target_embeddings.embeddings,
                                              self.compute_dtype)

    @property
    def output_bias(self):
        """The `[vocab]` bias of the output projection."""
        return self.output_projection.bias

    def training_flops(self, inputs, outputs):
        """float32 scalar: model FLOPs of a training call (forward + backward): the encoder
        over the source, the decoder blocks and output projection over the target."""
        del outputs
        batch, source = self._batch_shape(inputs)
        target = ops.cast(ops.shape(inputs[features.DECODER_INPUT_IDS])[1], "float32")
        h, f = self.encoder.hidden_size, self.encoder.inner_dim
        width = self.target_embeddings.embedding_width
        encoder = self.flops_per_example(source) - 3 * 2 * self._flop_sizes()["head_params"]
        # Per target token and block: Q/K/V/output (4h^2), cross Q/output (2h^2), FFN (2hf);
        # cross K/V per source token; attention scores and context over t and s keys.
        block = (target * (6 * h * h + 2 * h * f) + source * 2 * h * h
                 + 2 * target * (target + source) * h)
        decoder = self.num_decoder_layers * 2 * block + target * 2 * width * self.vocab_size
        return batch * (encoder + 3 * decoder)

    def get_config(self):
        config = super().get_config()
        config.update(num_decoder_layers=self.num_decoder_layers,
                      share_embeddings=self.share_embeddings,
                      position_encoding=self.position_encoding,
                      max_target_length=self._max_target_length,
                      share_encoder_decoder=self.share_encoder_decoder)
        return config


def _gather_rows(x, where):
    """`x[where[k, 0], where[k, 1]]` for each k: `[b, t, ...]`, int `[n, 2]` -> `[n, ...]`."""
    width = ops.shape(x)[1]
    flat = ops.reshape(x, (-1, *x.shape[2:]))
    return ops.take(flat, where[:, 0] * ops.cast(width, where.dtype) + where[:, 1], axis=0)


class _TiedOutputProjection(keras.layers.Layer):
    """`x @ table^T + bias` in float32: the output projection tied to an embedding table.

    A layer of its own so the bias has a stable variable path (`output_projection/bias`),
    whatever the model's name. Made by `Seq2SeqTransformer` only (not serialized alone).
    """

    def build(self, input_shape, vocab_size=None):
        self.bias = self.add_weight(name="bias", shape=(vocab_size,), initializer="zeros")
        self.built = True

    def call(self, x, table, output_table=None):
        shape = ops.shape(x)
        # 2-D, then a bias add in float32 (BiasAdd: TensorFlow fuses it into the matmul).
        rows = ops.reshape(ops.cast(x, self.compute_dtype), (-1, x.shape[-1]))
        logits = tied_projection.project(rows, table, output_table)  # (batch * t, vocab)
        logits = ops.add(ops.cast(logits, "float32"), ops.cast(self.bias, "float32"))
        return ops.reshape(logits, (shape[0], shape[1], -1))
