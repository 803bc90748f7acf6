"""The mapping between `BertEncoder` weights and the reference (Google BERT) names.

The mapping pairs each reference name of `bert_trainer.interop.formats` (google-research/bert
names) with a Keras variable. Keras' MultiHeadAttention keeps per-head kernels,
query/key/value `[hidden, heads, head_dim]` and output `[heads, head_dim, hidden]`, which are
the reference `[hidden, hidden]` kernels reshaped (heads are contiguous column blocks in both),
so loading is a reshape; only Google's NSP `output_weights` `[2, hidden]` is transposed.
Heads are passed in by the caller (this module imports none) and read by attribute:
MaskedLM `dense`, `layer_norm`, `bias`; the NSP ClassificationHead `dense`.
Reading a checkpoint of any format into an encoder is `resolve.py` (`from_pretrained`).
"""

import keras
import numpy as np

from bert_trainer.encoders.bert_encoder import BertEncoder
from bert_trainer.errors import UserError
from bert_trainer.interop import formats


def encoder_arguments(config: formats.BertConfig) -> dict:
    """The `BertEncoder` arguments (JSON-ready, as `get_config()` gives them) of `config`."""
    initializer = keras.initializers.TruncatedNormal(stddev=config.initializer_range)
    return dict(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        num_layers=config.num_layers, num_attention_heads=config.num_attention_heads,
        max_sequence_length=config.max_sequence_length, type_vocab_size=config.type_vocab_size,
        inner_dim=config.inner_dim, inner_activation=config.inner_activation,
        output_dropout=config.output_dropout, attention_dropout=config.attention_dropout,
        initializer=keras.initializers.serialize(initializer), norm_epsilon=config.norm_epsilon)


def encoder_from_config(config: formats.BertConfig, **overrides) -> BertEncoder:
    """A freshly initialized `BertEncoder` with the architecture of `config`."""
    return BertEncoder(**{**encoder_arguments(config), **overrides})


def bert_config(encoder: BertEncoder) -> formats.BertConfig:
    """The `BertConfig` of an encoder; UserError if the standard BERT layout cannot hold it."""
    if encoder.embedding_projection is not None or encoder.position_embedding_type != "learned":
        raise UserError(f"{encoder.name}: factorized embeddings or sinusoidal positions have no "
                        "Hugging Face / Google BERT equivalent; export a plain BERT encoder")
    if getattr(encoder, "norm_first", False):
        raise UserError(f"{encoder.name}: pre-norm layers (norm_first=True) have no Hugging Face "
                        "/ Google BERT equivalent (BertModel is post-norm); use `bert-train "
                        "export` for a SavedModel, or pretrain with norm_first=False")
    activation = keras.activations.serialize(encoder.inner_activation)
    if activation not in formats.SUPPORTED_ACTIVATIONS:
        raise UserError(f"{encoder.name}: inner_activation {activation!r} has no Hugging Face "
                        f"equivalent; use one of {formats.SUPPORTED_ACTIVATIONS}")
    return formats.BertConfig(
        vocab_size=encoder.vocab_size, hidden_size=encoder.hidden_size,
        num_layers=encoder.num_layers, num_attention_heads=encoder.num_attention_heads,
        inner_dim=encoder.inner_dim, max_sequence_length=encoder.max_sequence_length,
        type_vocab_size=encoder.type_vocab_size, inner_activation=activation,
        output_dropout=encoder.output_dropout, attention_dropout=encoder.attention_dropout,
        initializer_range=float(getattr(encoder.initializer, "stddev", 0.02)),
        norm_epsilon=encoder.norm_epsilon)


def variable_map(encoder: BertEncoder, *, masked_lm=None, next_sentence=None) -> dict:
    """Reference name → (Keras variable, transpose?) for the encoder and the given heads."""
    def dense(prefix, layer):
        return {prefix + "kernel": (layer.kernel, False), prefix + "bias": (layer.bias, False)}

    def norm(prefix, layer):
        return {prefix + "gamma": (layer.gamma, False), prefix + "beta": (layer.beta, False)}

    e = "bert/embeddings/"
    names = {e + "word_embeddings": (encoder.word_embeddings.embeddings, False),
             e + "position_embeddings": (encoder.position_embedding.embeddings, False),
             e + "token_type_embeddings": (encoder.type_embeddings.embeddings, False),
             **norm(e + "LayerNorm/", encoder.embeddings_layer_norm)}
    for i, layer in enumerate(encoder.transformer_layers):
        p, attention = formats.layer_prefix(i), layer.attention_layer
        names.update({**dense(p + "attention/self/query/", attention.query_dense),
                      **dense(p + "attention/self/key/", attention.key_dense),
                      **dense(p + "attention/self/value/", attention.value_dense),
                      **dense(p + "attention/output/dense/", attention.output_dense),
                      **norm(p + "attention/output/LayerNorm/", layer.attention_layer_norm),
                      **dense(p + "intermediate/dense/", layer.intermediate_dense),
                      **dense(p + "output/dense/", layer.output_dense),
                      **norm(p + "output/LayerNorm/", layer.output_layer_norm)})
    names.update(dense("bert/pooler/dense/", encoder.pooler_transform))
    if masked_lm is not None:
        names.update({**dense("cls/predictions/transform/dense/", masked_lm.dense),
                      **norm("cls/predictions/transform/LayerNorm/", masked_lm.layer_norm),
                      "cls/predictions/output_bias": (masked_lm.bias, False)})
    if next_sentence is not None:
        names.update({"cls/seq_relationship/output_weights": (next_sentence.dense.kernel, True),
                      "cls/seq_relationship/output_bias": (next_sentence.dense.bias, False)})
    return names


def load_reference_weights(encoder: BertEncoder, weights: dict[str, np.ndarray], *,
                           masked_lm=None, next_sentence=None) -> list[str]:
    """Assigns reference-named arrays (validated against the same config) to the variables.

    Returns:
      The paths of the variables assigned; those absent from `weights` keep their values.
    """
    loaded = []
    for name, (variable, transpose) in variable_map(
            encoder, masked_lm=masked_lm, next_sentence=next_sentence).items():
        if name not in weights:
            continue
        array = weights[name].T if transpose else weights[name]
        if array.size != np.prod(variable.shape):
            raise UserError(f"{name} has shape {array.shape} but {variable.path} needs "
                            f"{tuple(variable.shape)}; the checkpoint is of another size")
        variable.assign(np.reshape(array, variable.shape).astype(variable.dtype))
        loaded.append(variable.path)
    return loaded


def reference_weights(encoder: BertEncoder, *, masked_lm=None,
                      next_sentence=None) -> dict[str, np.ndarray]:
    """The encoder's (and heads') weights as float32 arrays under reference names."""
    config = bert_config(encoder)
    shapes = {n: s for g in formats.GROUPS for n, s in formats.reference_shapes(config, g).items()}
    weights = {}
    for name, (variable, transpose) in variable_map(
            encoder, masked_lm=masked_lm, next_sentence=next_sentence).items():
        array = np.asarray(keras.ops.convert_to_numpy(variable), np.float32)
        shape = shapes[name][::-1] if transpose else shapes[name]
        array = array.reshape(shape)
        weights[name] = np.ascontiguousarray(array.T if transpose else array)
    return weights
