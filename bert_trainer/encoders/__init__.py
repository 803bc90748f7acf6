"""Encoder networks: `BertEncoder`, `AlbertEncoder` and the `build_encoder` entry point."""

from bert_trainer.encoders.albert_encoder import AlbertEncoder
from bert_trainer.encoders.bert_encoder import BertEncoder
from bert_trainer.encoders.builder import build_encoder

__all__ = ["AlbertEncoder", "BertEncoder", "build_encoder", "from_pretrained"]
# Imported last: it builds the classes above.
from bert_trainer.encoders.pretrained import from_pretrained  # noqa: E402
