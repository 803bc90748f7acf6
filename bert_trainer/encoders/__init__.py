"""Encoder networks: `BertEncoder`, `AlbertEncoder` and the `build_encoder` entry point.

Published weights (`from_pretrained`) are read by `bert_trainer.interop`, which builds on this
package; nothing here imports it.
"""

from bert_trainer.encoders.albert_encoder import AlbertEncoder
from bert_trainer.encoders.bert_encoder import BertEncoder
from bert_trainer.encoders.builder import build_encoder

__all__ = ["AlbertEncoder", "BertEncoder", "build_encoder"]
