"""`GruEncoder`: the course's recurrent encoder, a source embedding and one GRU.

The encoder half of the course's GRU translators (`models.gru_translator`), built by
`build_encoder(kind="gru", ...)` like any encoder: the RFC's input and output dicts, a config
that `bert_train.json` records.
"""

import keras
from keras import ops

from bert_trainer import features


def positive_ints(owner: str, **values) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")


@keras.saving.register_keras_serializable(package="bert_trainer")
class GruEncoder(keras.Model):
    """A source embedding and one GRU over it.

    Args:
      vocab_size: rows of the embedding table (the joint vocabulary).
      embedding_width: its width (64 in the course).
      hidden_size: the GRU's units (64 in the course); the decoder's too.
      max_sequence_length: the longest source (and target) the task may use; a GRU has no
        position table, this is the limit the task checks lengths against.
      dropout_rate: dropout on the embeddings and on the states (0 in the course).
      **kwargs: `keras.Model` arguments (`name`, `dtype`).

    Call args:
      inputs: dict with `input_word_ids` and `input_mask` `[batch, s]` (other keys ignored).

    Returns:
      dict `sequence_output` `[batch, s, hidden_size]` (a padded step repeats the last real
      state) and `pooled_output` `[batch, hidden_size]` (the last state).
    """

    def __init__(self, vocab_size, embedding_width=64, hidden_size=64, max_sequence_length=512,
                 dropout_rate=0.0, **kwargs):
        kwargs.setdefault("name", "gru_encoder")
        super().__init__(**kwargs)
        positive_ints("GruEncoder", vocab_size=vocab_size, embedding_width=embedding_width,
                       hidden_size=hidden_size, max_sequence_length=max_sequence_length)
        if not 0 <= dropout_rate < 1:
            raise ValueError(f"GruEncoder: dropout_rate must be in [0, 1), got {dropout_rate!r}")
        self.vocab_size = vocab_size
        self.embedding_width = embedding_width
        self.hidden_size = hidden_size
        self.max_sequence_length = max_sequence_length
        self.dropout_rate = dropout_rate
        dtype = self.dtype_policy
        self.word_embeddings = keras.layers.Embedding(vocab_size, embedding_width,
                                                      name="word_embeddings", dtype=dtype)
        self.gru = keras.layers.GRU(hidden_size, return_sequences=True, name="gru", dtype=dtype)
        self.dropout = keras.layers.Dropout(dropout_rate, name="dropout", dtype=dtype)
        # Built here, outside any call: the variable paths (a checkpoint's names) are the
        # layers' own, whether the encoder runs alone or inside a translator.
        self.word_embeddings.build((None, None))
        self.gru.build((None, None, embedding_width))
        self.built = True

    def call(self, inputs, training=None):
        mask = ops.cast(inputs[features.INPUT_MASK], "bool")
        x = self.dropout(self.word_embeddings(inputs[features.INPUT_WORD_IDS]), training=training)
        states = self.dropout(self.gru(x, mask=mask, training=training), training=training)
        return {features.SEQUENCE_OUTPUT: states, features.POOLED_OUTPUT: states[:, -1]}

    def get_config(self):
        return {"name": self.name, "dtype": keras.dtype_policies.serialize(self.dtype_policy),
                "vocab_size": self.vocab_size, "embedding_width": self.embedding_width,
                "hidden_size": self.hidden_size,
                "max_sequence_length": self.max_sequence_length,
                "dropout_rate": self.dropout_rate}
