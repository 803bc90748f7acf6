"""BERT's bi-directional Transformer encoder as a functional Keras model."""

import difflib
import inspect

import keras
from keras import ops

from bert_trainer import features
from bert_trainer.errors import UserError
from bert_trainer.layers import (
    Dropout,
    LayerNormalization,
    OnDeviceEmbedding,
    PositionEmbedding,
    SinusoidalPositionEncoding,
    TransformerEncoder,
)
from bert_trainer.layers.initializers import clone_initializer
from bert_trainer.layers.packing import TokenPacking
from bert_trainer.layers.positions import flat_slots

POSITION_EMBEDDING_TYPES = ("learned", "sinusoidal")
# The keras.Model arguments a functional model honours; it drops any other keyword silently,
# so a misspelt `inner_dim` would build the default size without a word.
KERAS_KWARGS = ("name", "trainable")


def default_initializer():
    """BERT's initializer: truncated normal with stddev 0.02."""
    return keras.initializers.TruncatedNormal(stddev=0.02)


def _check_args(name, *, position_embedding_type, **sizes):
    """Raises a UserError naming the argument for bad sizes or an unknown position type."""
    for arg, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UserError(f"{name}: {arg} must be a positive int, got {value!r}")
    if sizes["hidden_size"] % sizes["num_attention_heads"]:
        raise UserError(f"{name}: hidden_size={sizes['hidden_size']} is not divisible by "
                        f"num_attention_heads={sizes['num_attention_heads']}")
    if position_embedding_type not in POSITION_EMBEDDING_TYPES:
        raise UserError(f"{name}: position_embedding_type={position_embedding_type!r} is "
                        f"unknown; use one of {POSITION_EMBEDDING_TYPES}")


def _check_kwargs(cls, kwargs):
    """TypeError naming the first keyword argument neither `cls` nor keras.Model takes."""
    unknown = sorted(set(kwargs) - set(KERAS_KWARGS))
    if unknown:
        valid = [p for p in inspect.signature(cls.__init__).parameters
                 if p not in ("self", "kwargs")] + list(KERAS_KWARGS)
        close = difflib.get_close_matches(unknown[0], valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TypeError(f"{cls.__name__}() got an unexpected keyword argument "
                        f"{unknown[0]!r}{hint}")


@keras.saving.register_keras_serializable(package="bert_trainer")
class BertEncoder(keras.Model):
    """The BERT encoder: embeddings, `num_layers` Transformer blocks and the pooler.

    embeddings = dropout(LN(word + position + type))   # (batch, seq, embedding_width)
    x = embedding_projection(embeddings)                # (batch, seq, hidden), if factorized
    x = transformer_layers[i](x, input_mask)            # for i in range(num_layers)
    x = final_layer_norm(x)                             # pre-norm (norm_first) only
    pooled = pooler_transform(x[:, 0])                  # tanh dense on the first token

    Inputs: the RFC's list `[input_word_ids, input_mask, input_type_ids]` or a dict with
    those keys (extra keys, e.g. labels, are ignored); each int `[batch, seq]`.
    Outputs: dict `sequence_output` `[batch, seq, hidden]` (`[batch, output_range, hidden]`
    if set), `pooled_output` `[batch, hidden]`, `encoder_outputs` (list, one
    `[batch, seq, hidden]` per layer; the last one is `sequence_output`).

    Public sublayers (the checkpoint converters map weights onto them): `word_embeddings`,
    `position_embedding`, `type_embeddings`, `embeddings_layer_norm`,
    `embedding_projection` (None unless factorized), `transformer_layers`,
    `final_layer_norm` (None unless `norm_first`), `pooler_transform`.

    Args:
      vocab_size: size of the token vocabulary.
      hidden_size: width of the Transformer layers.
      num_layers: number of Transformer layers.
      num_attention_heads: heads per layer; must divide `hidden_size`.
      max_sequence_length: longest input sequence (rows of the position table).
      type_vocab_size: number of token types (segments).
      inner_dim: width of the feed-forward networks.
      inner_activation: their activation ("gelu" is the exact erf GELU).
      output_dropout: dropout on embeddings and on each layer's sublayer outputs.
      attention_dropout: dropout on the attention probabilities.
      initializer: initializer of every weight (default truncated normal, stddev 0.02).
      output_range: if set, the last layer computes only positions `[0, output_range)`.
      embedding_width: width of the embedding tables; if it differs from `hidden_size`
        the embeddings are factorized and projected (`embedding_projection`).
      position_embedding_type: "learned" (BERT) or "sinusoidal" (fixed, no weights).
      norm_epsilon: epsilon of every LayerNormalization.
      norm_first: pre-norm Transformer layers (`x + sublayer(LN(x))`) and a final LayerNorm
        after the last one, instead of BERT's post-norm (`LN(x + sublayer(x))`): the
        layout of GPT-2 and of Cramming's budget BERT, which trains stably at larger
        learning rates. Hugging Face and Google BERT checkpoints cannot hold it.
      dtype: dtype policy of every sublayer, e.g. "mixed_bfloat16".
    """

    def __init__(self, vocab_size, hidden_size=768, num_layers=12, num_attention_heads=12,
                 max_sequence_length=512, type_vocab_size=16, inner_dim=3072,
                 inner_activation="gelu", output_dropout=0.1, attention_dropout=0.1,
                 initializer=None, output_range=None, embedding_width=None,
                 position_embedding_type="learned", norm_epsilon=1e-12, norm_first=False,
                 dtype=None, **kwargs):
        _check_kwargs(type(self), kwargs)
        _check_args(type(self).__name__, position_embedding_type=position_embedding_type,
                    vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers,
                    num_attention_heads=num_attention_heads, inner_dim=inner_dim,
                    max_sequence_length=max_sequence_length, type_vocab_size=type_vocab_size)
        if not isinstance(norm_first, bool):
            raise UserError(f"{type(self).__name__}: norm_first must be True or False, got "
                            f"{norm_first!r}")
        initializer = keras.initializers.get(initializer or default_initializer())

        # === Layers ===
        self._make_embedding_layers(
            vocab_size, embedding_width or hidden_size, hidden_size, max_sequence_length,
            type_vocab_size, position_embedding_type, norm_epsilon, initializer, dtype,
            output_dropout)
        layer_kwargs = dict(
            num_attention_heads=num_attention_heads, inner_dim=inner_dim,
            inner_activation=inner_activation, output_dropout=output_dropout,
            attention_dropout=attention_dropout, kernel_initializer=initializer,
            norm_epsilon=norm_epsilon, norm_first=norm_first, dtype=dtype)
        self.transformer_layers = self._make_transformer_layers(
            layer_kwargs, num_layers, output_range)
        # Pre-norm layers add to an un-normalized residual stream: normalize it once at the end.
        self.final_layer_norm = (LayerNormalization(epsilon=norm_epsilon,
                                                    name="final_layer_norm", dtype=dtype)
                                 if norm_first else None)
        self.pooler_transform = keras.layers.Dense(
            hidden_size, activation="tanh", kernel_initializer=clone_initializer(initializer),
            name="pooler_transform", dtype=dtype)

        # === Functional model ===
        inputs = [keras.Input(shape=(None,), dtype="int32", name=key)
                  for key in features.ENCODER_INPUTS]
        outputs = self._forward(*inputs)
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        if dtype is not None:
            # Functional.__init__ drops `dtype`; the model's policy must match its layers'
            # (get_config records it, and it sets the autocast scope of a call).
            self.dtype_policy = dtype

        # === Config ===
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.num_attention_heads = num_attention_heads
        self.max_sequence_length = max_sequence_length
        self.type_vocab_size = type_vocab_size
        self.inner_dim = inner_dim
        self.inner_activation = keras.activations.get(inner_activation)
        self.output_dropout = output_dropout
        self.attention_dropout = attention_dropout
        self.initializer = initializer
        self.output_range = output_range
        self.embedding_width = embedding_width
        self.position_embedding_type = position_embedding_type
        self.norm_epsilon = norm_epsilon
        self.norm_first = norm_first

    def _make_embedding_layers(self, vocab_size, width, hidden_size, max_sequence_length,
                               type_vocab_size, position_embedding_type, norm_epsilon,
                               initializer, dtype, output_dropout):
        """Creates the word/position/type tables, their LayerNorm and the projection."""
        self.word_embeddings = OnDeviceEmbedding(
            vocab_size, width, initializer=clone_initializer(initializer),
            name="word_embeddings", dtype=dtype)
        if position_embedding_type == "learned":
            self.position_embedding = PositionEmbedding(
                max_sequence_length, initializer=clone_initializer(initializer),
                name="position_embedding", dtype=dtype)
        else:
            self.position_embedding = SinusoidalPositionEncoding(
                name="position_embedding", dtype=dtype)
        # One-hot: a 2-row table is faster as a matmul than as a gather on TPUs.
        self.type_embeddings = OnDeviceEmbedding(
            type_vocab_size, width, initializer=clone_initializer(initializer),
            use_one_hot=True, name="type_embeddings", dtype=dtype)
        self.embeddings_layer_norm = LayerNormalization(
            epsilon=norm_epsilon, name="embeddings_layer_norm", dtype=dtype)
        self.embeddings_add = keras.layers.Add(name="embeddings_add", dtype=dtype)
        self.embeddings_dropout = Dropout(
            output_dropout, name="embeddings_dropout", dtype=dtype)
        self.embedding_projection = None
        if width != hidden_size:
            self.embedding_projection = keras.layers.Dense(
                hidden_size, kernel_initializer=clone_initializer(initializer),
                name="embedding_projection", dtype=dtype)

    def _make_transformer_layers(self, layer_kwargs, num_layers, output_range):
        """One independent `TransformerEncoder` per layer; only the last is range-limited."""
        return [
            TransformerEncoder(
                **layer_kwargs, name=f"transformer_layer_{i}",
                output_range=output_range if i == num_layers - 1 else None)
            for i in range(num_layers)
        ]

    def _forward(self, word_ids, mask, type_ids, *, training=None, output_positions=None,
                 pack=False):
        """The forward pass from the three int inputs to the output dict.

        Run once on symbolic inputs to build the functional model, and eagerly (in a
        traced call) by `call_at_positions`, whose `output_positions` go to the last layer.
        With `pack`, the layers compute only the real tokens and the output positions
        (`TokenPacking`); their outputs, packed, are not returned (`encoder_outputs` holds the
        last layer's only). Without `output_positions` the last layer's output is unpacked to
        `[batch, seq, hidden]`, zeros at the padding.
        """
        word = self.word_embeddings(word_ids)  # (batch, seq, width)
        embeddings = self.embeddings_add(
            [word, self.position_embedding(word), self.type_embeddings(type_ids)])
        embeddings = self.embeddings_layer_norm(embeddings)
        x = self.embeddings_dropout(embeddings, training=training)
        if self.embedding_projection is not None:
            x = self.embedding_projection(x)  # (batch, seq, hidden)
        # The [batch, seq] padding mask goes to every layer as it is: attention turns it into
        # an additive bias broadcast over heads and queries, cheaper than materializing the
        # [batch, seq, seq] mask of SelfAttentionMask (same result).
        encoder_outputs = []
        last = len(self.transformer_layers) - 1
        packing = None
        if pack:
            asked = output_positions if output_positions is not None else _with_cls(
                ops.zeros((ops.shape(mask)[0], 0), "int32"))
            packing = TokenPacking(_kept_slots(mask, asked))
            x = packing.pack(x)  # (tokens, hidden)
        for i, layer in enumerate(self.transformer_layers):
            extra = {} if packing is None else {"packing": packing}
            if i == last and output_positions is not None:
                x = layer([x, mask], training=training, output_positions=output_positions,
                          **extra)
            else:
                x = layer([x, mask], training=training, **extra)
            if i == last and self.final_layer_norm is not None:
                x = self.final_layer_norm(x)  # before unpacking: the padding stays zero
            if packing is not None and i == last and output_positions is None:
                x = packing.unpack(x)  # (batch, seq, hidden), zeros at the padding
            if packing is None or i == last:
                encoder_outputs.append(x)
        pooled = self.pooler_transform(x[:, 0, :])  # (batch, hidden)
        return {features.SEQUENCE_OUTPUT: x, features.POOLED_OUTPUT: pooled,
                features.ENCODER_OUTPUTS: encoder_outputs}

    def call_at_positions(self, inputs, positions, training=None, pack=False):
        """The encoder with its last layer computed only at `positions` (and [CLS]).

        The values are the full call's at those positions, for a fraction of the last
        layer's cost: its queries, feed-forward network and LayerNorms run on `1 + P` rows
        instead of `seq` (its keys and values still cover the whole sequence). BERT
        pretraining reads nothing else: [CLS] for next-sentence prediction, the masked
        positions for the masked LM. For mini at seq 128 and P = 20 that saves 13 % of a
        pretraining step's FLOPs.

        Args:
          inputs: as for calling the encoder (list or dict of the three int inputs).
          positions: int `[batch, P]`, each in `[0, seq)`.
          training: enables dropout.
          pack: compute the layers on the real tokens (and `positions`) only, not the
            padding (`TokenPacking`): the same outputs for fewer FLOPs (in training, the
            dropout masks are drawn over the packed rows: another stream of the same
            distribution). Shapes then vary with the batch: for the CPU outside XLA.

        Returns:
          dict `sequence_output` `[batch, P, hidden]` (row k at `positions[:, k]`) and
          `pooled_output` `[batch, hidden]` (the pooler on [CLS], as in the full call).
        """
        if self.output_range is not None:
            raise ValueError(f"{self.name}: call_at_positions needs output_range=None "
                             f"(it is {self.output_range})")
        word_ids, mask, type_ids = self._standardize_inputs_or_raise(inputs)
        outputs = self._forward(word_ids, mask, type_ids, training=training,
                                output_positions=_with_cls(positions), pack=pack)
        x = outputs[features.SEQUENCE_OUTPUT]  # (batch, 1 + P, hidden); row 0 is [CLS]
        return {features.SEQUENCE_OUTPUT: x[:, 1:, :],
                features.POOLED_OUTPUT: outputs[features.POOLED_OUTPUT]}

    def call_packed(self, inputs, training=None):
        """The full call's outputs, its layers computed on the real tokens only (`TokenPacking`).

        `sequence_output` equals the full call's at the real tokens and is zero at the padding,
        which a caller must not read (heads that mask the padding, or ignore its labels, may).
        Shapes vary with the batch: for the CPU outside XLA.

        Args:
          inputs: as for calling the encoder.
          training: enables dropout (its masks are drawn over the packed rows).

        Returns:
          dict `sequence_output` `[batch, seq, hidden]` and `pooled_output` `[batch, hidden]`.
        """
        if self.output_range is not None:
            raise ValueError(f"{self.name}: call_packed needs output_range=None "
                             f"(it is {self.output_range})")
        word_ids, mask, type_ids = self._standardize_inputs_or_raise(inputs)
        outputs = self._forward(word_ids, mask, type_ids, training=training, pack=True)
        return {features.SEQUENCE_OUTPUT: outputs[features.SEQUENCE_OUTPUT],
                features.POOLED_OUTPUT: outputs[features.POOLED_OUTPUT]}

    def packed_tokens(self, inputs, positions):
        """int32 scalar: the tokens `call_at_positions(inputs, positions, pack=True)` computes
        in each layer: the real ones, and [CLS] and `positions` where they fall outside them."""
        _, mask, _ = self._standardize_inputs_or_raise(inputs)
        return ops.sum(ops.cast(_kept_slots(mask, _with_cls(positions)), "int32"))

    def __call__(self, inputs, *args, **kwargs):
        return super().__call__(self._standardize_inputs_or_raise(inputs), *args, **kwargs)

    def _standardize_inputs_or_raise(self, inputs):
        """The three inputs as a list, checked for presence, rank, dtype and length."""
        if isinstance(inputs, dict):
            missing = [key for key in features.ENCODER_INPUTS if key not in inputs]
            if missing:
                raise ValueError(f"{self.name}: input dict lacks {missing}; it needs the keys "
                                 f"{list(features.ENCODER_INPUTS)}")
            inputs = [inputs[key] for key in features.ENCODER_INPUTS]
        if not isinstance(inputs, (list, tuple)) or len(inputs) != 3:
            raise ValueError(f"{self.name}: pass [input_word_ids, input_mask, input_type_ids] "
                             "or a dict with those keys")
        for key, tensor in zip(features.ENCODER_INPUTS, inputs, strict=True):
            shape = tuple(getattr(tensor, "shape", ()))
            dtype = keras.backend.standardize_dtype(getattr(tensor, "dtype", type(tensor)))
            if len(shape) != 2:
                raise ValueError(f"{self.name}: {key} must be [batch, seq], got rank {len(shape)} "
                                 f"(shape {shape})")
            if "int" not in dtype:
                raise ValueError(f"{self.name}: {key} must be an integer tensor, got {dtype}")
            if (self.position_embedding_type == "learned" and shape[1] is not None
                    and shape[1] > self.max_sequence_length):
                raise ValueError(f"{self.name}: {key} has sequence length {shape[1]}, longer than "
                                 f"max_sequence_length={self.max_sequence_length}")
        return list(inputs)

    def get_embedding_table(self):
        """The `[vocab_size, embedding_width]` word-embedding variable (tie the MLM head to it)."""
        return self.word_embeddings.embeddings

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_layers": self.num_layers,
            "num_attention_heads": self.num_attention_heads,
            "max_sequence_length": self.max_sequence_length,
            "type_vocab_size": self.type_vocab_size,
            "inner_dim": self.inner_dim,
            "inner_activation": keras.activations.serialize(self.inner_activation),
            "output_dropout": self.output_dropout,
            "attention_dropout": self.attention_dropout,
            "initializer": keras.initializers.serialize(self.initializer),
            "output_range": self.output_range,
            "embedding_width": self.embedding_width,
            "position_embedding_type": self.position_embedding_type,
            "norm_epsilon": self.norm_epsilon,
            "norm_first": self.norm_first,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def _with_cls(positions):
    """int32 `[batch, 1 + K]`: position 0 ([CLS]) then `positions`."""
    positions = ops.cast(positions, "int32")
    return ops.concatenate([ops.zeros((ops.shape(positions)[0], 1), "int32"), positions], axis=1)


def _kept_slots(mask, positions):
    """bool `[batch, seq]`: the real tokens (`mask` nonzero), every slot in `positions` (int
    `[batch, K]`), which the last layer reads even where the mask is 0, and every slot of a
    sequence without real tokens (its queries attend to all of them, as unpacked)."""
    shape = ops.shape(mask)
    real = ops.not_equal(mask, 0)
    empty = ops.logical_not(ops.any(real, axis=1, keepdims=True))  # (batch, 1)
    slots = flat_slots(positions, shape[1])
    asked = ops.scatter(ops.expand_dims(slots, -1), ops.ones_like(slots), (shape[0] * shape[1],))
    asked = ops.reshape(ops.greater(asked, 0), (shape[0], shape[1]))
    return ops.logical_or(ops.logical_or(real, asked), empty)
