"""ALBERT: BERT with factorized embeddings and one Transformer layer shared by all depths."""

import keras

from bert_trainer.encoders.bert_encoder import BertEncoder
from bert_trainer.errors import UserError
from bert_trainer.layers import TransformerEncoder


@keras.saving.register_keras_serializable(package="bert_trainer")
class AlbertEncoder(BertEncoder):
    """The ALBERT encoder ("ALBERT: A Lite BERT", Lan et al. 2019).

    Same inputs, outputs and public sublayers as `BertEncoder`, with two differences:
    the embeddings are `embedding_width` wide and projected to `hidden_size`
    (`embedding_projection`), and `transformer_layers` holds ONE `TransformerEncoder`
    repeated `num_layers` times, so the parameter count does not depend on `num_layers`.

    Args:
      vocab_size, hidden_size, num_layers, num_attention_heads, max_sequence_length,
      type_vocab_size, inner_dim, inner_activation, output_dropout, attention_dropout,
      initializer, position_embedding_type, norm_epsilon, norm_first, dtype: as in
      `BertEncoder`.
      embedding_width: width of the embedding tables (ALBERT-base: 128).

    `output_range` is not supported: the shared layer serves every depth.
    """

    def __init__(self, vocab_size, embedding_width=128, hidden_size=768, num_layers=12,
                 num_attention_heads=12, max_sequence_length=512, type_vocab_size=16,
                 inner_dim=3072, inner_activation="gelu", output_dropout=0.1,
                 attention_dropout=0.1, initializer=None, position_embedding_type="learned",
                 norm_epsilon=1e-12, norm_first=False, dtype=None, output_range=None, **kwargs):
        if output_range is not None:
            raise UserError(f"AlbertEncoder: output_range={output_range} is not supported (one "
                            "layer is shared by every depth); leave it None")
        super().__init__(
            vocab_size, hidden_size=hidden_size, num_layers=num_layers,
            num_attention_heads=num_attention_heads, max_sequence_length=max_sequence_length,
            type_vocab_size=type_vocab_size, inner_dim=inner_dim,
            inner_activation=inner_activation, output_dropout=output_dropout,
            attention_dropout=attention_dropout, initializer=initializer,
            embedding_width=embedding_width, position_embedding_type=position_embedding_type,
            norm_epsilon=norm_epsilon, norm_first=norm_first, dtype=dtype, **kwargs)

    def _make_transformer_layers(self, layer_kwargs, num_layers, output_range):
        """The same layer object at every depth: its weights are shared."""
        shared = TransformerEncoder(**layer_kwargs, name="shared_transformer_layer")
        return [shared] * num_layers
