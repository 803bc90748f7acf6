"""A decoder-only Transformer language model (GPT): predicts each next token."""

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
    TransformerDecoder,
    tied_projection,
)
from bert_trainer.layers.self_attention_mask import causal_mask


@keras.saving.register_keras_serializable(package="bert_trainer")
def gelu_approximate(x):
    """GELU's tanh approximation, GPT-2's activation (Hugging Face's "gelu_new").

    Args:
      x: float tensor, any shape.

    Returns:
      `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))`, same shape and dtype.
    """
    return keras.activations.gelu(x, approximate=True)


# inner_activation names taken besides Keras' own ("gelu" is the exact erf form).
_ACTIVATIONS = {"gelu_approximate": gelu_approximate, "gelu_new": gelu_approximate}


@keras.saving.register_keras_serializable(package="bert_trainer")
class CausalLM(keras.Model):
    """Token and position embeddings, causal Transformer blocks, a tied output projection.

    Pre-norm (GPT-2, `norm_first=True`):
        x = dropout(word(ids) + position)                 # (batch, t, hidden)
        x = transformer_layer_i(x)                        # x + sublayer(LN(x)), causal
        logits = final_layer_norm(x) @ word_table^T       # float32 (batch, t, vocab)
    Post-norm (BERT-style, `norm_first=False`): `x = dropout(LN(word + position))`, blocks
    `LN(x + sublayer(x))`, no final LayerNorm.

    The blocks are `TransformerDecoder(use_cross_attention=False)`: the one attention
    implementation, and its static key/value cache for generation (`init_cache`,
    `decode_step`). Row `t` of the logits predicts token `t + 1`.

    Public sublayers (named explicitly: their Keras paths are the checkpoint names, e.g.
    `transformer_layer_0/attention/query/kernel`): `word_embeddings` (OnDeviceEmbedding),
    `position_embedding` (PositionEmbedding), `embedding_layer_norm` (post-norm; None with
    `norm_first`), `transformer_layers` (`transformer_layer_{i}`), `final_layer_norm`
    (pre-norm; None without). No output bias.

    Args:
      vocab_size: rows of the word table (and logits' width).
      hidden_size: width of every position's vector.
      num_layers: Transformer blocks.
      num_attention_heads: heads; must divide `hidden_size`.
      inner_dim: width of the feed-forward network's first layer.
      inner_activation: its activation: "gelu" (exact), "gelu_approximate" or "gelu_new"
        (the tanh form GPT-2 uses), or any Keras activation name.
      max_sequence_length: rows of the position table: the longest input (prompt plus
        generated tokens).
      norm_first: pre-norm blocks and a final LayerNorm (GPT-2) instead of post-norm.
      norm_epsilon: epsilon of every LayerNorm.
      output_dropout: dropout on the embeddings and each sublayer's output.
      attention_dropout: dropout on the attention probabilities.
      initializer_range: stddev of the truncated-normal initializer of every kernel/table.
      **kwargs: `keras.Model` arguments (`name`, `dtype`: a dtype policy such as
        "mixed_bfloat16"; the logits stay float32).

    Call args:
      inputs: dict with `input_word_ids` int `[batch, t]` (t <= max_sequence_length) and
        optionally `input_mask` `[batch, t]` (1 real, 0 padding). Without a mask every token
        is real; with one, padding is attended to by no position and positions count the
        real tokens only (left or right padding gives each real token its unpadded logits).
      training: enables dropout.

    Returns:
      dict `logits`: float32 `[batch, t, vocab]`.
    """

    def __init__(self, vocab_size, hidden_size=256, num_layers=4, num_attention_heads=4,
                 inner_dim=1024, inner_activation="gelu", max_sequence_length=256,
                 norm_first=True, norm_epsilon=1e-5, output_dropout=0.1, attention_dropout=0.1,
                 initializer_range=0.02, **kwargs):
        kwargs.setdefault("name", "causal_lm")
        super().__init__(**kwargs)
        for arg, value in (("vocab_size", vocab_size), ("hidden_size", hidden_size),
                           ("num_layers", num_layers),
                           ("num_attention_heads", num_attention_heads),
                           ("inner_dim", inner_dim),
                           ("max_sequence_length", max_sequence_length)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"CausalLM: {arg} must be a positive int, got {value!r}")
        if hidden_size % num_attention_heads:
            raise ValueError(f"CausalLM: hidden_size={hidden_size} is not divisible by "
                             f"num_attention_heads={num_attention_heads}")
        self._vocab_size = vocab_size
        self._hidden_size = hidden_size
        self._num_layers = num_layers
        self.num_attention_heads = num_attention_heads
        self.inner_dim = inner_dim
        self.inner_activation = inner_activation
        self._max_sequence_length = max_sequence_length
        self._norm_first = norm_first
        self.norm_epsilon = norm_epsilon
        self.output_dropout = output_dropout
        self.attention_dropout = attention_dropout
        self.initializer_range = initializer_range
        if not isinstance(inner_activation, str):  # a callable or a serialized one
            inner_activation = keras.activations.serialize(
                keras.activations.get(inner_activation))
        self._build_layers(_ACTIVATIONS.get(inner_activation, inner_activation)
                           if isinstance(inner_activation, str) else inner_activation)
        self.built = True  # every layer is built above, with explicit shapes

    def _initializer(self):
        return keras.initializers.TruncatedNormal(stddev=self.initializer_range)

    def _build_layers(self, activation):
        hidden, dtype = self._hidden_size, self.dtype_policy
        self.word_embeddings = OnDeviceEmbedding(
            self._vocab_size, hidden, initializer=self._initializer(),
            name="word_embeddings", dtype=dtype)
        self.word_embeddings.build()
        self.position_embedding = PositionEmbedding(
            self._max_sequence_length, initializer=self._initializer(),
            name="position_embedding", dtype=dtype)
        self.position_embedding.build((None, None, hidden))
        self.embedding_layer_norm = None
        if not self._norm_first:
            self.embedding_layer_norm = LayerNormalization(
                epsilon=self.norm_epsilon, name="embedding_layer_norm", dtype=dtype)
            self.embedding_layer_norm.build((None, None, hidden))
        self.embedding_dropout = Dropout(self.output_dropout, name="embedding_dropout",
                                         dtype=dtype)
        self.transformer_layers = []
        for i in range(self._num_layers):
            layer = TransformerDecoder(
                num_attention_heads=self.num_attention_heads, inner_dim=self.inner_dim,
                inner_activation=activation, output_dropout=self.output_dropout,
                attention_dropout=self.attention_dropout, norm_first=self._norm_first,
                norm_epsilon=self.norm_epsilon, kernel_initializer=self._initializer(),
                use_cross_attention=False, name=f"transformer_layer_{i}", dtype=dtype)
            layer.build((None, None, hidden))
            self.transformer_layers.append(layer)
        self.final_layer_norm = None
        if self._norm_first:
            self.final_layer_norm = LayerNormalization(
                epsilon=self.norm_epsilon, name="final_layer_norm", dtype=dtype)
            self.final_layer_norm.build((None, None, hidden))

    # ------------------------------------------------------------------ sizes

    @property
    def vocab_size(self):
        return self._vocab_size

    @property
    def hidden_size(self):
        return self._hidden_size

    @property
    def num_layers(self):
        return self._num_layers

    @property
    def max_sequence_length(self):
        return self._max_sequence_length

    @property
    def norm_first(self):
        return self._norm_first

    # ------------------------------------------------------------------ forward passes

    def call(self, inputs, training=None):
        return {features.LOGITS: self.logits(self.hidden_states(inputs, training=training))}

    def hidden_states(self, inputs, training=None):
        """The last block's output, before the final LayerNorm and the output projection.

        Args:
          inputs, training: as `call`.

        Returns:
          `[batch, t, hidden]` in the compute dtype (`logits` of it is `call`'s output).
        """
        if features.INPUT_WORD_IDS not in inputs:
            raise ValueError(f"{self.name}: the features lack {features.INPUT_WORD_IDS!r}")
        ids = ops.cast(inputs[features.INPUT_WORD_IDS], "int32")  # (batch, t)
        length = ids.shape[1]
        if length is not None and length > self._max_sequence_length:
            raise ValueError(f"{self.name}: input_word_ids has length {length}, longer than "
                             f"max_sequence_length={self._max_sequence_length}")
        input_mask = inputs.get(features.INPUT_MASK)
        positions = mask = None
        if input_mask is not None:
            real = ops.cast(input_mask, "int32")  # (batch, t)
            # Each real token at its index among the real tokens (padding anywhere).
            positions = ops.maximum(ops.cumsum(real, axis=1) - 1, 0)
            mask = ops.logical_and(causal_mask(ops.shape(ids)[1]),
                                   ops.cast(real, "bool")[:, None, :])  # (batch, t, t)
        x = self._embed(ids, positions, training=training)
        for layer in self.transformer_layers:
            x = layer(x, self_attention_mask=mask, training=training)
        return x

    def init_cache(self, batch_size, max_length):
        """Empty key/value caches of every block, for `decode` / `decode_step`.

        Args:
          batch_size: rows (int or scalar tensor).
          max_length: positions the cache holds (int or scalar tensor; static for XLA).

        Returns:
          `{"layer_i": {"key", "value"}}`, zero tensors `[batch, heads, max_length,
          head_dim]` in the compute dtype (axis 0 is the batch).
        """
        if isinstance(max_length, int) and max_length < 1:
            raise ValueError(f"{self.name}: init_cache needs max_length >= 1, got {max_length}")
        return {f"layer_{i}": layer.init_cache(batch_size, max_length)
                for i, layer in enumerate(self.transformer_layers)}

    def decode(self, token_ids, index, cache, positions=None, key_mask=None, project=True,
               output_table=None):
        """Runs `t` new tokens at cache slots `index + [0, t)` over the cache (a prompt's
        prefill, or one step).

        Args:
          token_ids: int `[batch, t]`.
          index: int32 scalar, the cache slot of the first new token.
          cache: from `init_cache` or an earlier call.
          positions: optional int `[batch, t]` position of each token (None: its slot);
            for rows whose slots hold padding before their tokens (left padding).
          key_mask: optional bool `[batch, max_length]`, False for cache slots no token
            may attend to (padding); the causal limit (slot <= own slot) applies too.
          project: False returns the last block's output `[batch, t, hidden]` instead of
            the logits (a prefill that needs only the cache skips the vocabulary).
          output_table: optional `decoding_table()`, computed once before a decoding loop.

        Returns:
          `(logits [batch, t, vocab] float32, new_cache)`: given `call`'s tokens, slot by
          slot from 0, the logits equal `call`'s.
        """
        index = ops.cast(index, "int32")
        ids = ops.cast(token_ids, "int32")
        if positions is None:
            positions = index + ops.arange(ops.shape(ids)[1], dtype="int32")[None, :]
        mask = None
        if key_mask is not None:
            first = next(iter(cache.values()))["key"]  # (batch, heads, max_length, head_dim)
            mask = ops.logical_and(
                causal_mask(ops.shape(ids)[1], ops.shape(first)[2], offset=index),
                ops.cast(key_mask, "bool")[:, None, :])  # (batch, t, max_length)
        x = self._embed(ids, positions)
        new_cache = {}
        for i, layer in enumerate(self.transformer_layers):
            key = f"layer_{i}"
            x, new_cache[key] = layer(x, self_attention_mask=mask, cache=cache[key],
                                      decode_index=index)
        return (self.logits(x, output_table) if project else x), new_cache

    def decode_step(self, token_ids, index, cache, positions=None, key_mask=None,
                    output_table=None):
        """One generation step: the logits after `token_ids` at cache slot `index`.

        Args:
          token_ids: int `[batch]`.
          index: int32 scalar.
          cache: from `init_cache` or the previous step.
          positions: optional int `[batch]`, each token's position (None: `index`).
          key_mask: optional bool `[batch, max_length]`, as `decode`.
          output_table: optional `decoding_table()`, as `decode`.

        Returns:
          `(logits [batch, vocab] float32, new_cache)`; the logits equal `call`'s at `index`.
        """
        if positions is not None:
            positions = ops.cast(positions, "int32")[:, None]
        logits, cache = self.decode(ops.cast(token_ids, "int32")[:, None], index, cache,
                                    positions=positions, key_mask=key_mask,
                                    output_table=output_table)
        return logits[:, 0, :], cache

    def _embed(self, ids, positions=None, training=None):
        """`[batch, t]` ids (at `positions` `[batch or 1, t]`, None: 0..t-1) -> `[batch, t,
        hidden]`."""
        word = self.word_embeddings(ids)  # (batch, t, hidden)
        if positions is None:
            position = self.position_embedding(word)
        else:
            table = ops.cast(self.position_embedding.embeddings, word.dtype)
            position = ops.take(table, positions, axis=0)  # (batch or 1, t, hidden)
        x = word + ops.cast(position, word.dtype)
        if self.embedding_layer_norm is not None:
            x = self.embedding_layer_norm(x)
        return self.embedding_dropout(x, training=training)

    def logits(self, x, output_table=None):
        """The output: `x` `[batch, t, hidden]` from `hidden_states` (after the final
        LayerNorm, if any) projected on the word table: float32 `[batch, t, vocab]`.

        `output_table` (optional): `decoding_table()`, the table already transposed; the same
        logits, for a decoding loop that projects a few rows a step."""
        if self.final_layer_norm is not None:
            x = self.final_layer_norm(x)
        shape = ops.shape(x)
        rows = ops.reshape(ops.cast(x, self.compute_dtype), (-1, self._hidden_size))
        logits = tied_projection.project(rows, self.word_embeddings.embeddings, output_table)
        logits = ops.cast(logits, "float32")
        return ops.reshape(logits, (shape[0], shape[1], self._vocab_size))

    def decoding_table(self):
        """The word table transposed, `[hidden, vocab]` in the compute dtype, for `logits`,
        `decode` and `decode_step`'s `output_table`.

        A generation loop projects a few rows a step onto the whole vocabulary, faster from
        this copy (`layers.tied_projection`); the copy is made once per loop, not per step.
        """
        return tied_projection.decoding_table(self.word_embeddings.embeddings,
                                              self.compute_dtype)

    # ---------------------------------------------------- model FLOPs (throughput and MFU)

    @property
    def counts_flops(self) -> bool:
        """Whether `training_flops` can count (always: the model knows its sizes)."""
        return True

    def flops_per_example(self, seq_length):
        """Training FLOPs (forward + backward = 3 x forward) per sequence of `seq_length`
        tokens, the count of `bert_trainer.models.flops` for this model:

            per token:     L * 2 * (4*h*h + 2*h*f)    Q, K, V, attention output; FFN in, out
                           + 2*h*V                    the tied output projection
            per sequence:  L * 2 * (2*s*s*h)          scores and context over all s keys

        The causal mask hides half of the scores but the model computes them all, so they are
        counted whole (as nanoGPT's and PaLM's MFU do). Embedding lookups, softmax, LayerNorm
        and GELU are elementwise and left out.

        Args:
          seq_length: tokens per sequence, padding included (a number or a scalar tensor).

        Returns:
          FLOPs per sequence (a number, or a scalar tensor for a tensor argument).
        """
        s, h, f = seq_length, self._hidden_size, self.inner_dim
        per_token = self._num_layers * 2 * (4 * h * h + 2 * h * f) + 2 * h * self._vocab_size
        return 3 * (s * per_token + self._num_layers * 2 * (2 * s * s * h))

    def training_flops(self, inputs, outputs):
        """float32 scalar: the model FLOPs of a training call on the batch `inputs` (from its
        dynamic shape; every position is computed, so `outputs` is not needed)."""
        del outputs
        shape = ops.shape(inputs[features.INPUT_WORD_IDS])
        batch, length = ops.cast(shape[0], "float32"), ops.cast(shape[1], "float32")
        return batch * self.flops_per_example(length)

    def get_config(self):
        return {
            "name": self.name,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
            "vocab_size": self._vocab_size, "hidden_size": self._hidden_size,
            "num_layers": self._num_layers, "num_attention_heads": self.num_attention_heads,
            "inner_dim": self.inner_dim, "inner_activation": self.inner_activation,
            "max_sequence_length": self._max_sequence_length, "norm_first": self._norm_first,
            "norm_epsilon": self.norm_epsilon, "output_dropout": self.output_dropout,
            "attention_dropout": self.attention_dropout,
            "initializer_range": self.initializer_range,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        return cls(**config)


def build_causal_lm(**kwargs):
    """Builds a `CausalLM` from its constructor arguments, refusing unknown ones.

    The function gin configures (`bert_trainer.configurables.build_causal_lm`); it imports no
    gin itself.

    Args:
      **kwargs: `CausalLM`'s arguments (`vocab_size`, `hidden_size`, `num_layers`, ...,
        `name`, `dtype`).

    Returns:
      The model, built.

    Raises:
      UserError: an argument `CausalLM` does not take (a typo in a .gin file), no
        `vocab_size`, or bad sizes.
    """
    accepted = (set(inspect.signature(CausalLM.__init__).parameters)
                - {"self", "kwargs"}) | {"name", "dtype"}
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise UserError(f"build_causal_lm: CausalLM takes no argument {unknown[0]!r}; "
                        f"valid arguments: {', '.join(sorted(accepted))}")
    if "vocab_size" not in kwargs:
        raise UserError("build_causal_lm: vocab_size is required "
                        "(e.g. build_causal_lm.vocab_size = 30522)")
    try:
        return CausalLM(**kwargs)
    except ValueError as e:
        raise UserError(f"build_causal_lm: {e}") from None
