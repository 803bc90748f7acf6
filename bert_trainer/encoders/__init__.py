"""Encoder networks: `BertEncoder`, `AlbertEncoder`, `GruEncoder` (the course's recurrent
translators') and the `build_encoder` entry point.

Published weights (`from_pretrained`) are read by `bert_trainer.interop`, which builds on this
package; nothing here imports it.
"""

from bert_trainer.encoders.albert_encoder import AlbertEncoder
from bert_trainer.encoders.bert_encoder import BertEncoder
from bert_trainer.encoders.builder import build_encoder
from bert_trainer.encoders.gru_encoder import GruEncoder

__all__ = ["AlbertEncoder", "BertEncoder", "GruEncoder", "build_encoder"]
