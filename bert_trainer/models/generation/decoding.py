"""Autoregressive decoding in the graph: greedy search, beam search and sampling.

Generic over the model: the caller gives

    step_fn(ids [n] int32, index scalar int32, state) -> (logits [n, vocab] float32, new_state)

where `ids` is the token at position `index` of the decoder input and `state` is any nest of
tensors whose axis 0 is `n` (a key/value cache, the encoder output and its mask, a prefix, ...).
The first call gets the start ids at index `initial_index`: 0, unless a prompt already fills
the positions before it (a decoder-only model's prefilled cache). Beam search tiles every state
tensor to the beams and gathers every one by the chosen beams each step, so the model needs no
beam logic.

Conventions shared by the three functions:
- The returned ids are the generated tokens, `[..., max_decode_length]` int32: WITHOUT the start
  token, WITH the end token where one was generated, and 0 after it. `ids[..., t]` is the token
  chosen from the logits of the call at index `initial_index + t`. A sequence that never
  produces `end_id` runs to `max_decode_length` tokens (truncated).
- Scores are log-probabilities under the model (`log_softmax(logits)`, before any sampling
  filter) summed over the returned tokens, end token included, divided by the length penalty
  `((5 + length) / 6) ** alpha` of GNMT, tensor2tensor and T5 (`length` counts the end token;
  alpha = 0 gives the plain log-probability).

Everything runs in one `tf.while_loop` with static shapes (`max_decode_length` is a Python
int), so the functions work eagerly, inside `tf.function`, in a SavedModel and under XLA. The
module uses TensorFlow directly, not `keras.ops`: it needs `tf.nest` over the caller's state,
batched gathers and stateless random numbers, and the models it drives run on TensorFlow.
"""

import tensorflow as tf

NEG_INF = float("-inf")


def length_penalty_factor(length, alpha):
    """((5 + length) / 6) ** alpha: the divisor of a sequence's log-probability.

    Args:
      length: int or int tensor, the number of generated tokens (end token included).
      alpha: float or float tensor; 0 disables the penalty.

    Returns:
      float32 tensor of `length`'s shape.
    """
    length = tf.cast(length, tf.float32)
    return tf.pow((5.0 + length) / 6.0, tf.cast(alpha, tf.float32))


def _check_length(max_decode_length):
    if isinstance(max_decode_length, bool) or not isinstance(max_decode_length, int) or (
            max_decode_length < 1):
        raise ValueError(f"max_decode_length must be a Python int >= 1 (static shapes), got "
                         f"{max_decode_length!r}")
    return max_decode_length


def write_at(ids, index, tokens):
    """`ids` [..., L] with `tokens` [...] written at position `index` (a scalar).

    A select rather than a scatter: static shapes, XLA-friendly; step functions that keep a
    prefix in their state use it too.
    """
    at_index = tf.range(tf.shape(ids)[-1]) == index
    return tf.where(at_index, tokens[..., None], ids)


def _with_constants(step_fn, constants):
    """step_fn as (ids, index, state) -> ..., with `constants` bound as its fourth argument."""
    if constants is None:
        return step_fn
    return lambda ids, index, state: step_fn(ids, index, state, constants)


def _decode_one_path(step_fn, initial_ids, initial_state, max_decode_length, end_id,
                     length_penalty, initial_index, choose, constants=None, max_steps=None):
    """The loop greedy search and sampling share: one sequence per row, `choose` picks the token.

    Args:
      choose: (logits [n, vocab] float32, index) -> token ids [n] int32.
      max_steps: optional int32 scalar tensor: stop after that many steps (at most
        `max_decode_length`, which fixes the shapes); the ids after it stay 0.

    Returns:
      (ids [n, max_decode_length] int32, scores [n] float32), as the module docstring says.
    """
    length = _check_length(max_decode_length)
    initial_ids = tf.convert_to_tensor(initial_ids, tf.int32)
    n = tf.shape(initial_ids)[0]
    initial_index = tf.cast(initial_index, tf.int32)
    step_fn = _with_constants(step_fn, constants)

    def body(index, last, ids, log_prob, lengths, finished, state):
        logits, state = step_fn(last, initial_index + index, state)
        logits = tf.cast(logits, tf.float32)
        token = tf.cast(choose(logits, index), tf.int32)
        token_log_prob = tf.gather(tf.nn.log_softmax(logits), token, batch_dims=1)
        # A finished row emits 0 and keeps its score; it still runs through step_fn because
        # the batch moves in lock step.
        token = tf.where(finished, 0, token)
        log_prob += tf.where(finished, 0.0, token_log_prob)
        lengths += tf.cast(~finished, tf.int32)
        finished |= token == end_id
        return index + 1, token, write_at(ids, index, token), log_prob, lengths, finished, state

    def cond(index, last, ids, log_prob, lengths, finished, state):
        return tf.logical_not(tf.reduce_all(finished))

    loop_vars = (tf.constant(0), initial_ids, tf.zeros([n, length], tf.int32),
                 tf.zeros([n], tf.float32), tf.zeros([n], tf.int32), tf.zeros([n], tf.bool),
                 initial_state)
    if max_steps is not None:  # a run-time limit (a SavedModel's input) within the shapes
        length = tf.minimum(tf.cast(max_steps, tf.int32), length)
    _, _, ids, log_prob, lengths, _, _ = tf.while_loop(
        cond, body, loop_vars, maximum_iterations=length)
    return ids, log_prob / length_penalty_factor(lengths, length_penalty)


def greedy_search(step_fn, initial_ids, initial_state, *, max_decode_length, end_id,
                  length_penalty=0.0, initial_index=0, constants=None, max_steps=None):
    """The most likely token at every step, until `end_id` or `max_decode_length`.

    Args:
      step_fn: (ids [n] int32, index scalar int32, state) -> (logits [n, vocab], new_state).
      initial_ids: [n] int32, the start token of each row (fed at index 0).
      initial_state: nest of tensors with axis 0 = n.
      max_decode_length: Python int, the most tokens generated (end token included).
      end_id: int, the token that ends a row.
      length_penalty: alpha of the score's length penalty; the default 0 scores by the plain
        log-probability. `beam_search` with one beam and the same alpha gives the same score.
      initial_index: int or int32 scalar tensor, the index of the first call.
      constants: optional nest of tensors with axis 0 = n, passed unchanged to every call as
        `step_fn(ids, index, state, constants)` (None: step_fn takes three arguments).
      max_steps: optional int32 scalar tensor, fewer steps than `max_decode_length` chosen
        at run time (ids after it stay 0); None: `max_decode_length`.

    Returns:
      (ids [n, max_decode_length] int32, scores [n] float32): see the module docstring.
    """
    return _decode_one_path(step_fn, initial_ids, initial_state, max_decode_length, end_id,
                            length_penalty, initial_index,
                            lambda logits, index: tf.argmax(logits, axis=-1), constants,
                            max_steps)


def _filter_logits(logits, temperature, top_k, top_p):
    """Logits scaled by temperature, with tokens outside top-k and then top-p set to -inf.

    top-p keeps the smallest set of most likely tokens (of the top-k, renormalized, as Hugging
    Face does) whose probability reaches top_p; tokens tied with the last kept one are kept too.
    Works on thresholds of the logit value, so the logits are sorted once and never scattered.
    """
    scaled = logits / tf.where(temperature > 0, temperature, 1.0)
    ranked = tf.sort(scaled, axis=-1, direction="DESCENDING")  # [n, vocab]
    vocab = tf.shape(logits)[-1]
    k = tf.where(top_k > 0, tf.minimum(top_k, vocab), vocab)
    ranked = tf.where(tf.range(vocab) < k, ranked, NEG_INF)
    mass_before = tf.cumsum(tf.nn.softmax(ranked), axis=-1, exclusive=True)
    # The first token always has mass_before = 0 < top_p, so at least one token is kept.
    kept = (mass_before < top_p) & (ranked > NEG_INF)
    threshold = tf.reduce_min(tf.where(kept, ranked, float("inf")), axis=-1, keepdims=True)
    return tf.where(scaled < threshold, NEG_INF, scaled)


_GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's increment (2^64 / the golden ratio)


def _shift_xor(z, bits):
    """`z ^ (z >> bits)` on uint64."""
    return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(bits, tf.uint64)))


def _mix64(z):
    """SplitMix64's output function on uint64 (wrapping arithmetic)."""
    z = _shift_xor(z, 30) * tf.constant(0xBF58476D1CE4E5B9, tf.uint64)
    z = _shift_xor(z, 27) * tf.constant(0x94D049BB133111EB, tf.uint64)
    return _shift_xor(z, 31)


def uniform_noise(shape, seed, index):
    """float32 uniforms in (0, 1), shape `[n, vocab]`, for decoding step `index`.

    SplitMix64 over (seed, step, element) in integer ops, which XLA and the graph executor
    compute alike: a seed gives the same numbers eagerly, in a graph, compiled with XLA and on
    any device. (TensorFlow's stateless generators, Philox named or not, draw other numbers
    under XLA than without it.)

    Args:
      shape: int32 `[2]`.
      seed: int64 `[2]` (`_sampling_seed`).
      index: int scalar, the step.
    """
    seed = tf.bitcast(tf.cast(seed, tf.int64), tf.uint64)
    golden = tf.constant(_GOLDEN, tf.uint64)
    step = tf.cast(tf.cast(index, tf.int64), tf.uint64)
    xor = tf.bitwise.bitwise_xor
    key = xor(_mix64(xor(_mix64(seed[0] + golden), seed[1])), _mix64((step + 1) * golden))
    count = tf.cast(tf.range(tf.reduce_prod(shape)), tf.uint64)
    bits = _mix64(key + (count + 1) * golden)
    # The top 24 bits, centred in their interval: never 0 nor 1.
    top = tf.bitwise.right_shift(bits, tf.constant(40, tf.uint64))
    uniform = (tf.cast(top, tf.float32) + 0.5) * (1.0 / 2**24)
    return tf.reshape(uniform, shape)


def _sampling_seed(seed):
    """A stateless RNG seed, shape [2] int64, from an int or a [2] tensor."""
    if isinstance(seed, int):
        return tf.constant([seed, 0], tf.int64)
    seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
    return tf.reshape(tf.stack([seed, tf.zeros_like(seed)]) if seed.shape.rank == 0 else seed,
                      [2])


def _check_sampling(temperature, top_k, top_p):
    """ValueError for settings given as Python numbers that make no sampler (tensors unchecked)."""
    if isinstance(temperature, (int, float)) and temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}")
    if isinstance(top_k, int) and top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0: off), got {top_k}")
    if isinstance(top_p, (int, float)) and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1: off), got {top_p}")


def sample(step_fn, initial_ids, initial_state, *, max_decode_length, end_id, temperature=1.0,
           top_k=0, top_p=1.0, seed=0, length_penalty=0.0, initial_index=0, constants=None,
           max_steps=None):
    """Tokens drawn from the model's distribution, reproducibly (stateless RNG).

    Each step draws from softmax(logits / temperature) restricted to the top_k most likely
    tokens and then to the top_p nucleus. The draw at index i uses `seed` folded with i, so the
    same seed, inputs and batch give the same ids in any process (XLA-compiled draws differ
    from uncompiled ones: XLA generates its own random numbers). The settings may be tensors
    (a SavedModel's inputs); Python numbers are checked here.

    Args:
      step_fn, initial_ids, initial_state, max_decode_length, end_id, initial_index,
        constants, max_steps: as `greedy_search`.
      temperature: float >= 0; 0 picks the most likely token (greedy).
      top_k: int >= 0; 0 keeps every token.
      top_p: float in (0, 1]; 1 keeps every token.
      seed: int or [2] int tensor.
      length_penalty: alpha of the score's length penalty (see the module docstring).

    Returns:
      (ids [n, max_decode_length] int32, scores [n] float32): the scores are the model's
      log-probabilities of the drawn tokens (unscaled, unfiltered).

    Raises:
      ValueError: temperature < 0, top_k < 0 or top_p outside (0, 1] (given as numbers).
    """
    _check_sampling(temperature, top_k, top_p)
    temperature = tf.cast(temperature, tf.float32)
    top_k = tf.cast(top_k, tf.int32)
    top_p = tf.cast(top_p, tf.float32)
    seed = _sampling_seed(seed)

    def choose(logits, index):
        filtered = _filter_logits(logits, temperature, top_k, top_p)
        # Gumbel-max: argmax(logits + Gumbel noise) is a draw from softmax(logits), and unlike
        # stateless_categorical it compiles with XLA. Filtered tokens stay at -inf.
        uniform = uniform_noise(tf.shape(filtered), seed, index)
        drawn = tf.argmax(filtered - tf.math.log(-tf.math.log(uniform)), -1, tf.int32)
        return tf.where(temperature > 0, drawn, tf.argmax(logits, -1, tf.int32))

    return _decode_one_path(step_fn, initial_ids, initial_state, max_decode_length, end_id,
                            length_penalty, initial_index, choose, constants, max_steps)


def tile_beams(tensor, beam_size):
    """[n, ...] -> [n * beam_size, ...], each row repeated beam_size times in place."""
    return tf.repeat(tensor, beam_size, axis=0)


def _flat_beam_rows(beams, batch, beam_size):
    """[batch * beam] rows of a beam-major state picked by `beams` [batch, beam] (indices
    within each row): one index vector per step, so each state tensor costs one gather."""
    return tf.reshape(beams + tf.range(batch)[:, None] * beam_size, [-1])


def _follow(tensor, rows):
    """`tensor`'s rows picked by `rows` (as many as it has): its static shape kept, which a
    traced loop (XLA, a static batch) requires of its state."""
    picked = tf.gather(tensor, rows)
    picked.set_shape(tensor.shape)
    return picked


def _sort_best_first(flags, scores, ids):
    """Each row's hypotheses sorted: finished ones first, each group by score, best first."""
    by_score = tf.argsort(scores, axis=-1, direction="DESCENDING", stable=True)
    flags, scores, ids = (tf.gather(t, by_score, batch_dims=1) for t in (flags, scores, ids))
    by_flag = tf.argsort(tf.cast(flags, tf.int32), axis=-1, direction="DESCENDING", stable=True)
    return tuple(tf.gather(t, by_flag, batch_dims=1) for t in (flags, scores, ids))


def beam_search(step_fn, initial_ids, initial_state, *, vocab_size, beam_size, length_penalty,
                max_decode_length, end_id, initial_index=0, constants=None):
    """The beam_size best sequences of each row by length-penalized log-probability.

    Each step expands the beam_size alive hypotheses of a row by every token and keeps the
    2 * beam_size best by log-probability (one token per hypothesis ends it, so at least
    beam_size of them go on). An end token ranked within the first beam_size finishes its
    hypothesis: it stops growing and keeps its score; the beam_size best non-ending ones stay
    alive. A row is done once it holds beam_size finished hypotheses (fairseq's and Hugging
    Face's early stop), else at max_decode_length, where its alive hypotheses fill the
    remaining places after the finished ones. With one beam this is exactly greedy search
    (same ids, same score for the same alpha).

    Args:
      step_fn: (ids [n] int32, index scalar int32, state) -> (logits [n, vocab], new_state),
        called with n = batch * beam_size (the beams of row r at r * beam_size ...).
      initial_ids: [batch] int32 start token of each row.
      initial_state: nest of tensors with axis 0 = batch; tiled to the beams here.
      vocab_size: Python int >= 2, the logits' last dimension.
      beam_size: Python int >= 1.
      length_penalty: alpha of ((5 + length) / 6) ** alpha (0.6 in the Transformer and T5).
      max_decode_length: Python int, the most tokens generated (end token included).
      end_id: int, the token that ends a hypothesis.
      initial_index: int or int32 scalar tensor, the index of the first call.
      constants: optional nest of tensors with axis 0 = batch, tiled to the beams once and
        passed unchanged to every call as `step_fn(ids, index, state, constants)`.

    Returns:
      (ids [batch, beam_size, max_decode_length] int32, scores [batch, beam_size] float32),
      best first. A place no hypothesis reached (more beams than distinct sequences) scores
      -inf.
    """
    length = _check_length(max_decode_length)
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be a Python int >= 1, got {beam_size!r}")
    if not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"vocab_size must be a Python int >= 2, got {vocab_size!r}")
    k = beam_size
    initial_ids = tf.convert_to_tensor(initial_ids, tf.int32)
    initial_index = tf.cast(initial_index, tf.int32)
    batch = tf.shape(initial_ids)[0]
    rank = tf.range(2 * k)
    if constants is not None:
        constants = tf.nest.map_structure(lambda t: tile_beams(t, k), constants)
    step_fn = _with_constants(step_fn, constants)

    def body(index, last, alive_ids, alive_log_prob, state, fin_ids, fin_score, fin_flag, done):
        logits, state = step_fn(tf.reshape(last, [-1]), initial_index + index, state)
        log_probs = tf.reshape(tf.nn.log_softmax(tf.cast(logits, tf.float32)),
                               [batch, k, vocab_size])
        candidates = tf.reshape(alive_log_prob[:, :, None] + log_probs, [batch, k * vocab_size])
        top_log_prob, top_index = tf.math.top_k(candidates, 2 * k)  # [batch, 2k]
        top_beam, top_token = top_index // vocab_size, top_index % vocab_size
        top_ids = write_at(tf.gather(alive_ids, top_beam, batch_dims=1), index, top_token)
        ends = top_token == end_id

        # Finished: an end token within the first k candidates (so one beam stays greedy), not
        # an unreachable (-inf) one, and not in a row already done (its result is final).
        new_flag = ends & (rank < k) & (top_log_prob > NEG_INF) & ~done[:, None]
        new_score = tf.where(
            new_flag, top_log_prob / length_penalty_factor(index + 1, length_penalty), NEG_INF)
        fin_score, pick = tf.math.top_k(tf.concat([fin_score, new_score], 1), k)
        fin_flag = tf.gather(tf.concat([fin_flag, new_flag], 1), pick, batch_dims=1)
        fin_ids = tf.gather(tf.concat([fin_ids, top_ids], 1), pick, batch_dims=1)

        alive_log_prob, pick = tf.math.top_k(tf.where(ends, NEG_INF, top_log_prob), k)
        alive_ids = tf.gather(top_ids, pick, batch_dims=1)
        last = tf.gather(top_token, pick, batch_dims=1)
        # Every state tensor follows its hypothesis' beam.
        beams = tf.gather(top_beam, pick, batch_dims=1)
        rows = _flat_beam_rows(beams, batch, k)
        state = tf.nest.map_structure(lambda t: _follow(t, rows), state)
        done |= tf.reduce_all(fin_flag, axis=1)
        return index + 1, last, alive_ids, alive_log_prob, state, fin_ids, fin_score, fin_flag, done

    def cond(index, last, alive_ids, alive_log_prob, state, fin_ids, fin_score, fin_flag, done):
        return tf.logical_not(tf.reduce_all(done))

    # Only the first beam of a row is alive at the start: k copies would give k equal beams.
    first_only = tf.tile(tf.concat([[0.0], tf.fill([k - 1], NEG_INF)], 0)[None], [batch, 1])
    no_ids = tf.zeros([batch, k, length], tf.int32)
    loop_vars = (tf.constant(0), tf.tile(initial_ids[:, None], [1, k]), no_ids, first_only,
                 tf.nest.map_structure(lambda t: tile_beams(t, k), initial_state),
                 no_ids, tf.fill([batch, k], NEG_INF), tf.zeros([batch, k], tf.bool),
                 tf.zeros([batch], tf.bool))
    (_, _, alive_ids, alive_log_prob, _, fin_ids, fin_score, fin_flag, _) = tf.while_loop(
        cond, body, loop_vars, maximum_iterations=length)

    # Rows not done ran to max_decode_length: their alive hypotheses (all that long) follow the
    # finished ones. Done rows hold k finished hypotheses, which sort first.
    alive_score = alive_log_prob / length_penalty_factor(length, length_penalty)
    _, scores, ids = _sort_best_first(
        tf.concat([fin_flag, tf.zeros_like(fin_flag)], 1), tf.concat([fin_score, alive_score], 1),
        tf.concat([fin_ids, alive_ids], 1))
    return ids[:, :k], scores[:, :k]
