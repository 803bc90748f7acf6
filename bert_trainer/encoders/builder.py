"""`build_encoder`: one entry point that turns RFC keyword arguments into an encoder.

It is the function gin configures (see `bert_trainer.configurables`); it imports no gin
itself, so it works from plain Python too.
"""

import inspect

from bert_trainer.encoders.albert_encoder import AlbertEncoder
from bert_trainer.encoders.bert_encoder import BertEncoder
from bert_trainer.encoders.gru_encoder import GruEncoder
from bert_trainer.errors import UserError

ENCODER_CLASSES = {"bert": BertEncoder, "albert": AlbertEncoder, "gru": GruEncoder}


def build_encoder(kind="bert", **rfc_kwargs):
    """Builds an encoder of `kind` from the RFC's arguments.

    Args:
      kind: "bert" (`BertEncoder`), "albert" (`AlbertEncoder`) or "gru" (`GruEncoder`, the
        course's recurrent translators' encoder: `embedding_width`, `hidden_size`).
      **rfc_kwargs: the encoder's constructor arguments (`vocab_size`, `hidden_size`,
        `num_layers`, `num_attention_heads`, `inner_dim`, ...).

    Returns:
      The encoder, a `keras.Model`.

    Raises:
      UserError: unknown `kind`, or an argument the encoder does not take (a typo in a
        .gin file), or bad sizes.
    """
    if kind not in ENCODER_CLASSES:
        raise UserError(f"build_encoder: kind={kind!r} is unknown; "
                        f"use one of {sorted(ENCODER_CLASSES)}")
    cls = ENCODER_CLASSES[kind]
    accepted = (set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}) | {"name"}
    unknown = sorted(set(rfc_kwargs) - accepted)
    if unknown:
        raise UserError(f"build_encoder: {cls.__name__} takes no argument {unknown[0]!r}; "
                        f"valid arguments: {', '.join(sorted(accepted))}")
    if "vocab_size" not in rfc_kwargs:
        raise UserError("build_encoder: vocab_size is required "
                        "(e.g. build_encoder.vocab_size = 30522)")
    return cls(**rfc_kwargs)
