"""The Keras layer library BERT-style encoders are made of (keras-nlp Transformer Encoder RFC).

Layers import `keras` and `bert_trainer.ops` (the ops that have a fused CPU kernel, each
choosing it or TensorFlow's ops), never training code; every one is registered for serialization
under the package name "bert_trainer". `packing.TokenPacking` (not a layer) carries the packed
rows of the real tokens through a layer stack.
"""

from bert_trainer.layers.dropout import Dropout
from bert_trainer.layers.gelu import gelu
from bert_trainer.layers.layer_normalization import LayerNormalization
from bert_trainer.layers.masked_lm import MaskedLM
from bert_trainer.layers.multi_head_attention import MultiHeadAttention
from bert_trainer.layers.on_device_embedding import OnDeviceEmbedding
from bert_trainer.layers.position_embedding import PositionEmbedding
from bert_trainer.layers.self_attention_mask import CausalAttentionMask, SelfAttentionMask
from bert_trainer.layers.sinusoidal_position_encoding import SinusoidalPositionEncoding
from bert_trainer.layers.transformer_decoder import TransformerDecoder
from bert_trainer.layers.transformer_encoder import TransformerEncoder

__all__ = [
    "CausalAttentionMask",
    "Dropout",
    "LayerNormalization",
    "MaskedLM",
    "MultiHeadAttention",
    "OnDeviceEmbedding",
    "PositionEmbedding",
    "SelfAttentionMask",
    "SinusoidalPositionEncoding",
    "TransformerDecoder",
    "TransformerEncoder",
    "gelu",
]
