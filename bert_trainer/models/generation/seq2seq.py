"""Translation with an encoder-decoder model: encode once, then greedy or beam search.

The model needs the sequence-to-sequence API of `Seq2SeqTransformer`:

    encode(inputs) -> (encoder_output [b, s, h], encoder_mask [b, s])
    init_cache(batch_size, max_length) -> nest of batch-major tensors
    decode_step(token_ids [b], index, cache, encoder_output, encoder_mask[, output_table])
        -> (logits [b, vocab] float32, new_cache)
    vocab_size, max_target_length (None: no limit)

and, optionally, `decoding_table()`: the output table, made once per call and given to every
step as `output_table` (`layers.tied_projection`). For `use_cache=False` only, either
`decode(decoder_input_ids [b, t], encoder_output, encoder_mask, project=False) -> hidden
[b, t, h]` with `logits(hidden[, output_table]) -> [b, t, vocab]` (the last position alone is
projected, as with the cache), or the teacher-forcing `call` (which then encodes the source
again every step and projects every position).
"""

import inspect

import tensorflow as tf

from bert_trainer import features
from bert_trainer.models.generation import compiled_loops, decoding

# With XLA, source widths are padded up to a multiple of this: a run compiles once per bucket.
# Finer than a prompt's bucket (`compiled_loops.WIDTH_BUCKET`): every padded source column costs the
# encoder and each step's cross-attention, at every beam.
SOURCE_BUCKET = 8
_OUTPUT = "encoder_output"
_MASK = "encoder_mask"


def _check(model, beam_size, max_decode_length):
    limit = getattr(model, "max_target_length", None)
    if isinstance(max_decode_length, int) and limit is not None and max_decode_length > limit:
        raise ValueError(f"max_decode_length={max_decode_length} exceeds the model's "
                         f"max_target_length={limit}: lower it or build the model longer")
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be an int >= 1, got {beam_size!r}")


def _init_cache(model, batch, max_decode_length, encoder_output):
    """The model's empty cache; with the encoder output where init_cache takes it, so that the
    cross-attention keys and values are projected once instead of every step."""
    if "encoder_output" in inspect.signature(model.init_cache).parameters:
        return model.init_cache(batch, max_decode_length, encoder_output=encoder_output), True
    return model.init_cache(batch, max_decode_length), False


# Cache entries that decode_step reads but never writes (the cross-attention keys and values
# projected from the encoder output): per-row constants, kept out of the loop state.
_CONSTANT_ENTRIES = frozenset({"cross_key", "cross_value"})


def _split_cache(cache):
    """(written, constant): the cache's nested dicts split by entry name, same nesting."""
    written, constant = {}, {}
    for name, value in cache.items():
        if isinstance(value, dict):
            written[name], constant[name] = _split_cache(value)
        elif name in _CONSTANT_ENTRIES:
            constant[name] = value
        else:
            written[name] = value
    return written, constant


def _merge_cache(written, constant):
    """The cache `_split_cache` split, whole again."""
    merged = dict(written)
    for name, value in constant.items():
        merged[name] = _merge_cache(written.get(name, {}), value) if isinstance(
            value, dict) else value
    return merged


def _projection(model) -> dict:
    """`{"output_table": model.decoding_table()}`, or {} for a model without one: the keyword
    arguments of the loop's projections."""
    if callable(getattr(model, "decoding_table", None)):
        return {"output_table": model.decoding_table()}
    return {}


def cached_step(model, max_decode_length, encoder_output, encoder_mask):
    """step_fn, initial state and constants decoding one token a step with the model's cache.

    The loop state holds only what each step writes (the self-attention keys and values);
    the encoder mask and output and the cross-attention keys and values projected once from
    it are constants, which beam search tiles once instead of gathering every step.

    Args:
      model: the sequence-to-sequence model.
      max_decode_length: Python int, positions the cache holds.
      encoder_output: [b, s, h] from `model.encode`.
      encoder_mask: [b, s] from `model.encode`.

    Returns:
      (step_fn(ids, index, state, constants), initial_state, constants) for `decoding`.
    """
    batch = tf.shape(encoder_output)[0]
    cache, projected = _init_cache(model, batch, max_decode_length, encoder_output)
    written, constant = _split_cache(cache)
    constants = {"cache": constant, _MASK: encoder_mask}
    if not projected:
        constants[_OUTPUT] = encoder_output

    projection = _projection(model)  # once, outside the loop (not a constant: never tiled)

    def step_fn(ids, index, state, constants):
        cache = _merge_cache(state["cache"], constants["cache"])
        logits, cache = model.decode_step(ids, index, cache, constants.get(_OUTPUT),
                                          constants[_MASK], **projection)
        return logits, {"cache": _split_cache(cache)[0]}
    return step_fn, {"cache": written}, constants


def uncached_step(model, max_decode_length, encoder_output, encoder_mask, encoder_inputs):
    """step_fn, initial state and constants running the whole decoder on the prefix each step.

    The baseline the cache is measured against (and a check of it): the same logits, with
    O(t) decoder positions computed at step t instead of one (the decoder blocks only: the
    vocabulary projection, as with the cache, is of the last position, from the same output
    table). The prefix is the only state; the encoder output and mask (or inputs) are
    constants, as for `cached_step`.

    Args:
      model, max_decode_length, encoder_output, encoder_mask: as `cached_step`.
      encoder_inputs: the encoder's input dict; used only by a model without `decode`.

    Returns:
      (step_fn(ids, index, state, constants), initial_state, constants) for `decoding`.
    """
    batch = tf.shape(encoder_output)[0]
    state = {"prefix": tf.zeros([batch, max_decode_length], tf.int32)}
    if hasattr(model, "decode"):
        constants = {_OUTPUT: encoder_output, _MASK: encoder_mask}
        projection = _projection(model)  # as the cached loop's
    else:
        constants = {"inputs": dict(encoder_inputs)}

    def step_fn(ids, index, state, constants):
        prefix = decoding.write_at(state["prefix"], index, ids)  # decoder input so far
        visible = prefix[:, :index + 1]
        if "inputs" in constants:
            logits = model({**constants["inputs"], features.DECODER_INPUT_IDS: visible},
                           training=False)[features.LOGITS]
        else:
            hidden = model.decode(visible, constants[_OUTPUT], constants[_MASK], project=False)
            logits = model.logits(hidden[:, -1:], **projection)
        return tf.cast(logits[:, -1], tf.float32), {"prefix": prefix}
    return step_fn, state, constants


def _search(model, beam_size, length_penalty, max_decode_length, start_id, end_id, use_cache,
            encoder_inputs=None):
    """search(encoder_output, encoder_mask) -> (ids [b, max_decode_length], scores [b])."""
    def search(encoder_output, encoder_mask):
        if use_cache:
            step_fn, state, constants = cached_step(model, max_decode_length, encoder_output,
                                                    encoder_mask)
        else:
            step_fn, state, constants = uncached_step(model, max_decode_length, encoder_output,
                                                      encoder_mask, encoder_inputs)
        initial_ids = tf.fill([tf.shape(encoder_output)[0]], tf.cast(start_id, tf.int32))
        if beam_size == 1:
            return decoding.greedy_search(
                step_fn, initial_ids, state, max_decode_length=max_decode_length,
                end_id=end_id, length_penalty=length_penalty, constants=constants)
        ids, scores = decoding.beam_search(
            step_fn, initial_ids, state, vocab_size=int(model.vocab_size), beam_size=beam_size,
            length_penalty=length_penalty, max_decode_length=max_decode_length, end_id=end_id,
            constants=constants)
        return ids[:, 0], scores[:, 0]
    return search


def translate(model, encoder_inputs, *, beam_size=4, length_penalty=0.6, max_decode_length,
              start_id, end_id, use_cache=True, jit_compile=None):
    """Decodes the target of each source row, in the graph.

    Encodes once; beam search then tiles the cache and the encoder's constants (its mask and
    the cross-attention keys and values) to the beams, and gathers only the cache each step.
    beam_size=1 runs greedy search (beam search with one beam gives the same).

    Args:
      model: the sequence-to-sequence model (see the module docstring).
      encoder_inputs: dict of the encoder inputs (`input_word_ids`, `input_mask`,
        `input_type_ids`), each [b, s].
      beam_size: Python int >= 1.
      length_penalty: alpha of ((5 + length) / 6) ** alpha, in the scores (and, for beams,
        in their ranking).
      max_decode_length: Python int, the most target tokens (end token included); at most
        the model's max_target_length.
      start_id: the token fed first (the id of [CLS]).
      end_id: the token that ends a target (the id of [SEP]).
      use_cache: False re-runs the decoder on the whole prefix each step (slow; a baseline).
      jit_compile: compile the decoding loop (after the encoder) with XLA: the step's ~200
        small ops run as one program (the speed-up: benchmarks/README.md).
        None (the default) means True with the cache, False without it (the uncached prefix
        changes shape every step, which XLA cannot compile). A first call per batch and
        source shape compiles (seconds); sources are padded up to a multiple of
        `SOURCE_BUCKET` so varied batches compile once per bucket, and the compiled
        loop is kept per model and settings, so eager calls reuse it. False suits a graph
        meant for any TensorFlow runtime (an export) or a distribution strategy's replica.

    Returns:
      {DECODED_IDS: [b, max_decode_length] int32 (no start token, the end token kept, 0 after
      it), DECODED_SCORES: [b] float32 length-penalized log-probability}: the best hypothesis.

    Raises:
      ValueError: max_decode_length beyond the model's positions, beam_size < 1, or
        jit_compile without the cache.
    """
    _check(model, beam_size, max_decode_length)
    if jit_compile and not use_cache:
        raise ValueError("jit_compile=True needs use_cache=True: without the cache the decoder "
                         "input grows every step, which XLA cannot compile")
    if jit_compile is None:
        jit_compile = use_cache
    settings = (beam_size, length_penalty, max_decode_length, start_id, end_id)
    if jit_compile:
        # Zero columns are masked-out source tokens: the translations do not change.
        limit = getattr(getattr(model, "encoder", None), "max_sequence_length", None)
        encoder_inputs = {name: compiled_loops.bucket_width(tf.convert_to_tensor(value),
                                                      limit or 2**30, SOURCE_BUCKET)
                          for name, value in encoder_inputs.items()}
        search = compiled_loops.compiled(model, ("translate", *settings),
                                   lambda m: _search(m, *settings, use_cache=True))
    else:
        search = _search(model, *settings, use_cache, encoder_inputs)
    encoder_output, encoder_mask = model.encode(encoder_inputs, training=False)
    ids, scores = search(encoder_output, encoder_mask)
    return {features.DECODED_IDS: ids, features.DECODED_SCORES: scores}
