"""The causal-LM benchmark's models: bert-train's CausalLM, keras-hub's GPT-2, the course's LSTM.

Every builder returns a keras.Model that takes token ids [batch, seq] int32 (0 = [PAD], on the
right) and whose `logits_of(model, ids, training)` is [batch, seq, vocab] float32: position t
scores the token at t + 1.

- `bert_train_causal_lm`: `bert_trainer.models.CausalLM` (pre-norm, tied output, no bias).
- `keras_hub_gpt2`: `keras_hub.models.GPT2CausalLM` on a `GPT2Backbone` of the same size: the
  backbone's `token_embedding` reversed is the output projection (tied, no bias), as GPT-2.
- `LstmLM`: the course's pre-Transformer language model: embedding -> LSTM layers -> a dense
  projection back to the embedding width -> the embedding table transposed (tied softmax).

`train_flops` is the model-FLOPs count of a causal training step (the MFU numerator).
"""

import keras
import tensorflow as tf

from bench.seq2seq_models import Size

__all__ = ["Size", "LstmLM", "bert_train_causal_lm", "keras_hub_gpt2",
           "logits_of", "train_flops", "num_params"]


def bert_train_causal_lm(vocab_size: int, size: Size, max_length: int,
                         dropout: float) -> keras.Model:
    """bert-train's CausalLM at `size` (built)."""
    from bert_trainer.models import CausalLM  # noqa: PLC0415

    model = CausalLM(vocab_size=vocab_size, hidden_size=size.hidden_size,
                     num_layers=size.num_layers, num_attention_heads=size.num_attention_heads,
                     inner_dim=size.inner_dim, max_sequence_length=max_length,
                     output_dropout=dropout, attention_dropout=dropout)
    model({"input_word_ids": tf.zeros([1, 2], tf.int32)})  # Builds the variables.
    return model


def keras_hub_gpt2(vocab_size: int, size: Size, max_length: int, dropout: float):
    """keras-hub's GPT2CausalLM (no preprocessor) on a GPT2Backbone of `size`.

    Its logits are `backbone.token_embedding(hidden, reverse=True)`: the tied projection.
    keras-hub's GPT-2 uses the tanh-approximated GELU; bert-train's CausalLM the exact one.
    """
    import keras_hub  # noqa: PLC0415 (a benchmark-only dependency)

    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=vocab_size, num_layers=size.num_layers,
        num_heads=size.num_attention_heads, hidden_dim=size.hidden_size,
        intermediate_dim=size.inner_dim, dropout=dropout, max_sequence_length=max_length)
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


@keras.saving.register_keras_serializable(package="bert_train_bench")
class LstmLM(keras.Model):
    """Embedding -> `num_layers` LSTMs of `units` -> dense to the embedding width -> tied softmax.

    Args:
      vocab_size: the vocabulary (one table, used for input and output).
      embedding_dim: width of the table (the Transformer's hidden size).
      units: LSTM width.
      num_layers: stacked LSTMs.
      dropout: on the embeddings and on each LSTM's output (training only).
    """

    def __init__(self, vocab_size: int, embedding_dim: int = 256, units: int = 512,
                 num_layers: int = 2, dropout: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.embedding_dim, self.units = vocab_size, embedding_dim, units
        self.num_layers, self.dropout_rate = num_layers, dropout
        self.embedding = keras.layers.Embedding(
            vocab_size, embedding_dim,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=0.02))
        self.dropout = keras.layers.Dropout(dropout)
        self.lstms = [keras.layers.LSTM(units, return_sequences=True) for _ in range(num_layers)]
        self.to_embedding = keras.layers.Dense(embedding_dim)
        self.output_bias = self.add_weight(shape=(vocab_size,), initializer="zeros",
                                           name="output_bias")

    def call(self, ids, training=None):
        x = self.dropout(self.embedding(ids), training=training)  # (batch, seq, embedding)
        for lstm in self.lstms:
            x = self.dropout(lstm(x, training=training), training=training)  # (batch, seq, units)
        x = self.to_embedding(x)  # (batch, seq, embedding)
        return tf.matmul(x, self.embedding.embeddings, transpose_b=True) + self.output_bias

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size,
                "embedding_dim": self.embedding_dim, "units": self.units,
                "num_layers": self.num_layers, "dropout": self.dropout_rate}


def logits_of(model: keras.Model, ids: tf.Tensor, training) -> tf.Tensor:
    """[batch, seq, vocab] float32 next-token logits of any of the benchmark's models."""
    if isinstance(model, LstmLM):
        return model(ids, training=training)
    if hasattr(model, "backbone"):  # keras-hub: its own input names and a padding mask.
        mask = tf.cast(tf.not_equal(ids, 0), tf.int32)
        return tf.cast(model({"token_ids": ids, "padding_mask": mask}, training=training),
                       tf.float32)
    mask = tf.cast(tf.not_equal(ids, 0), tf.int32)
    return model({"input_word_ids": ids, "input_mask": mask}, training=training)["logits"]


def num_params(model: keras.Model) -> int:
    """Trainable parameters (a tied table counted once)."""
    return int(sum(v.numpy().size for v in model.trainable_variables))


def train_flops(size: Size, vocab_size: int, batch_size: int, seq_length: int) -> float:
    """Model FLOPs of one causal-LM training step (forward + backward = 3 x forward).

    Per token: the layers' matmuls 2 * (4*h*h + 2*h*f) each and the tied output projection
    2*h*V; per sequence: attention scores and weighted values 2 * 2*s*s*h per layer (the full
    s x s, as the kernels compute it, masked or not). Elementwise work is left out, as for the
    other benchmarks' MFU (bert_trainer/models/flops.py).
    """
    h, f, s = size.hidden_size, size.inner_dim, seq_length
    per_sequence = (s * size.num_layers * 2 * (4 * h * h + 2 * h * f)
                    + size.num_layers * 2 * (2 * s * s * h) + s * 2 * h * vocab_size)
    return 3.0 * batch_size * per_sequence
