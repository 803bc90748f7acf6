"""The seq2seq benchmark's models: the course's RNNs, keras-hub's Transformer and bert-train's.

Each builder returns a keras.Model whose `call(batch, training)` takes the benchmark's batch
dict (`seq2seq_data.batch`) and returns logits [batch, target_len, vocab] (teacher forcing).

- `gru_translator`: the course's encoder-decoder as bert-train ships it
  (`bert_trainer.models.GruTranslator`, `configs/translate/gru*.gin`): embedding 64, GRU 64,
  the encoder's last state starts the decoder; with `attention=True`, Bahdanau's additive
  attention over the encoder states, queried by the decoder GRU's outputs, its context joined
  to the GRU output before the projection. Decoded by the product's `translate` (greedy).
- `keras_hub_transformer`: the keras.io English-Spanish example's structure
  (TokenAndPositionEmbedding -> TransformerEncoder; TokenAndPositionEmbedding ->
  TransformerDecoder -> Dropout -> Dense), with as many layers, heads and widths as ours.
- `bert_train_transformer`: `bert_trainer.models.Seq2SeqTransformer` on a `BertEncoder`.
"""

import dataclasses

import keras
import tensorflow as tf

from bert_trainer import features


@dataclasses.dataclass(frozen=True)
class Size:
    """A Transformer size shared by both halves."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    inner_dim: int

    @classmethod
    def parse(cls, text: str) -> "Size":
        """From "L/H/A/F", e.g. "4/256/4/1024"."""
        return cls(*(int(x) for x in text.split("/")))

    def __str__(self) -> str:
        return (f"L{self.num_layers}/H{self.hidden_size}/A{self.num_attention_heads}/"
                f"F{self.inner_dim}")


def gru_translator(vocab_size: int, max_length: int, attention: bool = False,
                   embedding_dim: int = 64, units: int = 64) -> keras.Model:
    """bert-train's `GruTranslator` at the course's sizes (64 and 64).

    Args:
      vocab_size: the joint vocabulary (separate source and target embedding tables).
      max_length: the longest source and target.
      attention: add Bahdanau attention.
      embedding_dim, units: the embedding width and the GRU's units.
    """
    from bert_trainer.encoders import GruEncoder  # noqa: PLC0415
    from bert_trainer.models import GruTranslator  # noqa: PLC0415

    encoder = GruEncoder(vocab_size=vocab_size, embedding_width=embedding_dim,
                         hidden_size=units, max_sequence_length=max_length)
    return GruTranslator(encoder, attention=attention, max_target_length=max_length)


def keras_hub_transformer(vocab_size: int, size: Size, max_length: int,
                          dropout: float) -> keras.Model:
    """The keras.io English-Spanish Transformer with `size` layers and widths (GELU, LN 1e-12).

    Args:
      vocab_size: the joint vocabulary (separate source and target tables, as in keras.io).
      size: layers of each half, hidden width, heads, feed-forward width.
      max_length: rows of the position tables.
      dropout: of every sublayer and before the output projection.
    """
    import keras_hub  # noqa: PLC0415 (only the workers that build it import it)

    layer_args = dict(intermediate_dim=size.inner_dim, num_heads=size.num_attention_heads,
                      dropout=dropout, activation="gelu", layer_norm_epsilon=1e-12)
    source = keras.Input((None,), dtype="int32", name=features.INPUT_WORD_IDS)
    target = keras.Input((None,), dtype="int32", name=features.DECODER_INPUT_IDS)
    x = keras_hub.layers.TokenAndPositionEmbedding(
        vocab_size, max_length, size.hidden_size, mask_zero=True)(source)
    for _ in range(size.num_layers):
        x = keras_hub.layers.TransformerEncoder(**layer_args)(x)
    y = keras_hub.layers.TokenAndPositionEmbedding(
        vocab_size, max_length, size.hidden_size, mask_zero=True)(target)
    for _ in range(size.num_layers):
        y = keras_hub.layers.TransformerDecoder(**layer_args)(y, x)
    y = keras.layers.Dropout(dropout)(y)
    logits = keras.layers.Dense(vocab_size)(y)
    model = keras.Model([source, target], logits, name="keras_hub_seq2seq")

    class Wrapped(keras.Model):  # Takes the benchmark's batch dict like the others.
        def __init__(self):
            super().__init__(name="keras_hub_transformer")
            self.inner = model

        def call(self, batch, training=None):
            return self.inner([batch[features.INPUT_WORD_IDS],
                               batch[features.DECODER_INPUT_IDS]], training=training)

    return Wrapped()


def bert_train_transformer(vocab_size: int, size: Size, max_length: int,
                           dropout: float) -> keras.Model:
    """bert-train's Seq2SeqTransformer (shared embeddings, tied projection, learned positions)."""
    from bert_trainer.encoders import BertEncoder  # noqa: PLC0415
    from bert_trainer.models import Seq2SeqTransformer  # noqa: PLC0415

    encoder = BertEncoder(
        vocab_size=vocab_size, hidden_size=size.hidden_size, num_layers=size.num_layers,
        num_attention_heads=size.num_attention_heads, inner_dim=size.inner_dim,
        max_sequence_length=max_length, type_vocab_size=2, output_dropout=dropout,
        attention_dropout=dropout)
    return Seq2SeqTransformer(encoder, max_target_length=max_length)


def bert2bert(minilm_dir: str, max_length: int, warm_start: bool) -> tuple[keras.Model, dict]:
    """Seq2SeqTransformer of the checkpoint's size; its weights from it when `warm_start`.

    Returns:
      (model, report): report lists the loaded and freshly initialized variables (empty lists
      from scratch).
    """
    from bert_trainer.interop import resolve_checkpoint  # noqa: PLC0415
    from bert_trainer.interop.bert2bert import warm_start_seq2seq  # noqa: PLC0415
    from bert_trainer.models import Seq2SeqTransformer  # noqa: PLC0415

    checkpoint = resolve_checkpoint(minilm_dir)
    model = Seq2SeqTransformer(checkpoint.build_encoder(), max_target_length=max_length)
    # Built first: the warm start loads into existing variables.
    names = (*features.ENCODER_INPUTS, features.DECODER_INPUT_IDS)
    model({k: tf.zeros([1, 4], tf.int32) for k in names})
    if not warm_start:
        return model, {"loaded": [], "initialized": []}
    return model, warm_start_seq2seq(model, checkpoint)


def logits_of(model: keras.Model, batch: dict, training) -> tf.Tensor:
    """float32 logits whatever the model returns (a tensor or bert-train's {"logits"})."""
    # bert-train's models, given target ids, return the real tokens' rows: these are scored
    # on every position.
    batch = {k: v for k, v in batch.items() if k != features.TARGET_IDS}
    out = model(batch, training=training)
    if isinstance(out, dict):
        out = out[features.LOGITS]
    return tf.cast(out, tf.float32)
