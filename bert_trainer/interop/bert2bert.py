"""BERT2BERT: warm-start both halves of a `Seq2SeqTransformer` from one BERT checkpoint.

Rothe, Narayan & Severyn (2020), "Leveraging Pre-trained Checkpoints for Sequence Generation
Tasks": the encoder is BERT; the decoder's self-attention, feed-forward network, layer norms
and embeddings start as copies of the same BERT layers (decoder layer `i` <- BERT layer `i`);
the cross-attention, which BERT lacks, starts fresh. With "BERTShare" the decoder blocks use
the encoder layers' variables themselves (`Seq2SeqTransformer(share_encoder_decoder=True)`), so
only the embeddings are copied.
"""

import numpy as np
from absl import logging

from bert_trainer.errors import UserError
from bert_trainer.interop.resolve import ResolvedCheckpoint, resolve_checkpoint

# (decoder block attribute, BERT encoder layer attribute): the sublayers copied one to one.
_BLOCK_PAIRS = (
    ("self_attention", "attention_layer"),
    ("self_attention_layer_norm", "attention_layer_norm"),
    ("intermediate_dense", "intermediate_dense"),
    ("output_dense", "output_dense"),
    ("output_layer_norm", "output_layer_norm"),
)


def warm_start_seq2seq(model, checkpoint, *, share=None) -> dict:
    """Loads a BERT checkpoint into a `Seq2SeqTransformer`'s encoder and decoder.

    The encoder is loaded by the checkpoint's own loader (every format `resolve_checkpoint`
    reads: bert-train, Hugging Face, Google TF1). Then, from the loaded encoder: decoder
    block `i`'s self-attention (query/key/value/output), its layer norm, the feed-forward
    network and the output layer norm <- encoder layer `i`; the target word table <- the word
    table (the same variable when `share_embeddings`); the learned target positions <- BERT's
    positions plus its type-0 embedding (the decoder has no token types, so the sum BERT adds
    to every token of segment A is folded in); the target embedding LayerNorm <- BERT's.
    The cross-attention, its layer norm and the output bias keep their initial values.

    Args:
      model: a built `Seq2SeqTransformer` whose encoder fits the checkpoint.
      checkpoint: a `ResolvedCheckpoint`, or a path to resolve.
      share: None: as the model was built; True / False: require the model to share (or not)
        its encoder and decoder blocks ("BERTShare", `share_encoder_decoder`).

    Returns:
      `{"loaded": [variable paths set from the checkpoint], "initialized": [the others]}`,
      both over `model.weights` (also logged).

    Raises:
      UserError: the checkpoint does not fit the encoder (from its loader), or more decoder
        layers than the encoder has.
      ValueError: `share` contradicts the model.
    """
    if not isinstance(checkpoint, ResolvedCheckpoint):
        checkpoint = resolve_checkpoint(checkpoint, flag="--init_checkpoint")
    shares = bool(model.share_encoder_decoder)
    if share is not None and bool(share) != shares:
        raise ValueError(f"warm_start_seq2seq: share={share} but the model was built with "
                         f"share_encoder_decoder={shares}; build it with "
                         f"share_encoder_decoder={bool(share)}")
    encoder = model.encoder
    if len(model.decoder_layers) > len(encoder.transformer_layers):
        raise UserError(f"warm start from {checkpoint.path}: the decoder has "
                        f"{len(model.decoder_layers)} layers but the checkpoint's encoder "
                        f"{len(encoder.transformer_layers)}; set num_decoder_layers <= "
                        f"{len(encoder.transformer_layers)}")
    encoder_result = checkpoint.load(encoder=encoder)
    loaded = set(encoder_result["loaded"])

    copied = []
    for block, layer in zip(model.decoder_layers, encoder.transformer_layers, strict=False):
        for block_name, layer_name in _BLOCK_PAIRS:
            copied += _copy_layer(getattr(layer, layer_name), getattr(block, block_name))
    copied += _copy_embeddings(model, encoder)
    copied_ids = {id(target) for target, source in copied if source.path in loaded}
    # A copy of a variable the checkpoint lacked is not "loaded" (a fresh pooler, say).
    paths = list(dict.fromkeys(v.path for v in model.weights))
    loaded_ids = copied_ids | {id(v) for v in model.weights if v.path in loaded}
    by_path = {v.path: v for v in model.weights}
    result = {"loaded": [p for p in paths if id(by_path[p]) in loaded_ids],
              "initialized": [p for p in paths if id(by_path[p]) not in loaded_ids]}
    logging.info("BERT2BERT warm start from %s (%s): %d variables loaded, %d initialized: %s",
                 checkpoint.path, checkpoint.format, len(result["loaded"]),
                 len(result["initialized"]), ", ".join(result["initialized"]))
    return result


def _copy_layer(source_layer, target_layer):
    """Assigns `source_layer`'s weights to `target_layer`'s, in order (same variables: no-op).

    Returns:
      [(target variable, source variable)] for every pair, shared ones included.
    """
    sources, targets = source_layer.weights, target_layer.weights
    if [tuple(v.shape) for v in sources] != [tuple(v.shape) for v in targets]:
        raise UserError(f"warm start: {target_layer.path} does not fit {source_layer.path} "
                        f"({[tuple(v.shape) for v in targets]} vs "
                        f"{[tuple(v.shape) for v in sources]}); size the decoder as the encoder")
    for target, source in zip(targets, sources, strict=True):
        if target is not source:
            target.assign(source.value)
    return list(zip(targets, sources, strict=True))


def _copy_embeddings(model, encoder):
    """The target word table, positions and LayerNorm from the encoder's embeddings, where
    their shapes fit (a separate table of another width keeps its initial values).

    Returns:
      [(target variable, source variable)] copied or shared.
    """
    pairs = []
    word, table = model.target_embeddings.embeddings, encoder.word_embeddings.embeddings
    if tuple(word.shape) == tuple(table.shape):
        if word is not table:
            word.assign(table.value)
        pairs.append((word, table))
    pairs += _copy_if_fits(model.target_embeddings_layer_norm, encoder.embeddings_layer_norm)
    positions = getattr(model.target_position_embedding, "embeddings", None)
    source = getattr(encoder.position_embedding, "embeddings", None)
    if (positions is not None and source is not None
            and positions.shape[-1] == source.shape[-1]):
        rows = min(positions.shape[0], source.shape[0])
        type_zero = np.asarray(encoder.type_embeddings.embeddings)[0]
        value = np.array(positions.numpy())
        value[:rows] = np.asarray(source)[:rows] + type_zero
        positions.assign(value)
        # Rows past BERT's table (a longer max_target_length) stay as initialized.
        if rows == positions.shape[0]:
            pairs.append((positions, source))
    return pairs


def _copy_if_fits(target_layer, source_layer):
    """`_copy_layer` when the shapes agree, else nothing."""
    if ([tuple(v.shape) for v in target_layer.weights]
            != [tuple(v.shape) for v in source_layer.weights]):
        return []
    return _copy_layer(source_layer, target_layer)
