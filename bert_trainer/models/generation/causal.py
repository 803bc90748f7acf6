"""Text continuation with a decoder-only model: prefill the prompts, then greedy or sampled
tokens one step at a time with the key/value cache.

The model needs the API of `CausalLM`:

    init_cache(batch_size, max_length) -> nest of batch-major tensors
    decode(token_ids [b, t], index, cache, positions=, key_mask=, project=False)
        -> (hidden [b, t, h], cache)                              (the prompts' prefill)
    decode_step(token_ids [b], index, cache, positions=, key_mask=, output_table=)
        -> (logits [b, V], cache)
    decoding_table() -> the output table, made once per call and given to every step
    hidden_states({"input_word_ids", "input_mask"}) -> [b, t, h],
        logits(hidden, output_table) -> [b, t, V]                   (use_cache=False only)
    max_sequence_length

Prompts of different lengths share one batch by left alignment, as keras-hub and Hugging Face
do: each prompt is shifted right so that all of them end at the same cache slot; the slots
before a prompt are masked out of attention and every token keeps its own position (slot minus
the row's padding). All rows then step in lock step at one cache index, and each row's logits
are those of the row decoded alone (a masked key adds an exact 0 to the softmax).

Like `generation.decoding`, which runs the loop, the module uses TensorFlow directly.
"""

import tensorflow as tf

from bert_trainer import features
from bert_trainer.models.generation import compiled_loops, decoding

PAD_ID = 0  # [PAD]: never generated (its logit is -inf), 0 after a row's end token
GENERATED_IDS = "generated_ids"  # int32 [b, max_new_tokens]: 0 after the end
GENERATED_LENGTHS = "generated_lengths"  # int32 [b]: tokens before the end token
SCORES = "scores"  # float32 [b]: sum of the generated tokens' log-probabilities


def _check_lengths(model, prompt_ids, prompt_lengths, max_new_tokens, new_token_limit):
    """ValueError for sizes known now; in-graph checks of the others.

    Returns:
      A list of assertion ops (empty when everything was checked now).
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or (
            max_new_tokens < 1):
        raise ValueError(f"max_new_tokens must be a Python int >= 1 (static shapes), got "
                         f"{max_new_tokens!r}")
    limit = int(model.max_sequence_length)
    if max_new_tokens >= limit:
        raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the "
                         f"model's max_sequence_length={limit}: lower max_new_tokens")
    if prompt_ids.shape.rank != 2 or prompt_lengths.shape.rank != 1:
        raise ValueError(f"prompt_ids must be [batch, length] and prompt_lengths [batch], got "
                         f"shapes {prompt_ids.shape} and {prompt_lengths.shape}")
    new = max_new_tokens if new_token_limit is None else tf.get_static_value(new_token_limit)
    if new is not None and not 1 <= int(new) <= max_new_tokens:
        raise ValueError(f"new_token_limit must lie in [1, max_new_tokens={max_new_tokens}], "
                         f"got {int(new)}")
    width = prompt_ids.shape[1]
    lengths = tf.get_static_value(prompt_lengths)
    if lengths is not None and lengths.size and new is not None:
        longest, shortest, new = int(lengths.max()), int(lengths.min()), int(new)
        name = "max_new_tokens" if new_token_limit is None else "new_token_limit"
        if longest + new > limit:
            raise ValueError(f"a prompt of {longest} tokens plus {name}={new} exceeds the "
                             f"model's max_sequence_length={limit}: shorten the prompt or "
                             f"lower {name}")
        if shortest < 1 or (width is not None and longest > width):
            raise ValueError(f"prompt_lengths must lie in [1, {width}] (the prompt_ids "
                             f"width), got {lengths.tolist()}")
        return []
    new = tf.cast(max_new_tokens if new_token_limit is None else new_token_limit, tf.int32)
    message = ("a prompt plus the new tokens exceeds the model's max_sequence_length="
               f"{limit}, a prompt length is outside [1, width], or the new-token limit is "
               f"outside [1, {max_new_tokens}]: shorten the prompt or ask fewer tokens")
    return [tf.debugging.assert_less_equal(prompt_lengths + new, limit, message=message),
            tf.debugging.assert_positive(prompt_lengths, message=message),
            tf.debugging.assert_less_equal(prompt_lengths, tf.shape(prompt_ids)[1],
                                           message=message),
            tf.debugging.assert_positive(new, message=message),
            tf.debugging.assert_less_equal(new, max_new_tokens, message=message)]


def left_align(prompt_ids, prompt_lengths):
    """Right-padded prompts shifted to end at the last column.

    Args:
      prompt_ids: int32 `[b, p]`, row r's prompt in its first `prompt_lengths[r]` columns.
      prompt_lengths: int32 `[b]`.

    Returns:
      `(aligned [b, p] int32, padding [b] int32)`: row r's prompt in columns
      `[padding[r], p)`, 0 before; `padding = p - prompt_lengths`.
    """
    width = tf.shape(prompt_ids)[1]
    padding = width - prompt_lengths
    source = tf.range(width)[None, :] - padding[:, None]  # (b, p): column read, < 0 = pad
    aligned = tf.gather(prompt_ids, tf.maximum(source, 0), batch_dims=1)
    return tf.where(source >= 0, aligned, PAD_ID), padding


def _without_pad(logits):
    """float32 logits with [PAD]'s set to -inf: a row never generates it."""
    logits = tf.cast(logits, tf.float32)
    return tf.where(tf.range(tf.shape(logits)[-1]) == PAD_ID, decoding.NEG_INF, logits)


def cached_step(model, aligned, padding, cache_length):
    """Prefills the cache with every prompt token but the last; the step function then feeds
    one token a step at the next cache slot.

    Args:
      model: the causal model.
      aligned, padding: from `left_align`.
      cache_length: slots the cache holds (prompt width + new tokens - 1).

    Returns:
      (step_fn(ids, index, state, constants), initial_state, constants) for `decoding`, the
      first call at index `width - 1` with the prompts' last tokens.
    """
    batch, width = tf.shape(aligned)[0], tf.shape(aligned)[1]
    key_mask = tf.range(cache_length)[None, :] >= padding[:, None]  # (b, cache): real slots
    cache = model.init_cache(batch, cache_length)
    prefix = aligned[:, :-1]  # (b, width - 1)
    positions = tf.maximum(tf.range(width - 1)[None, :] - padding[:, None], 0)
    _, cache = model.decode(prefix, 0, cache, positions=positions, key_mask=key_mask,
                            project=False)
    constants = {"padding": padding, "key_mask": key_mask}
    table = model.decoding_table()  # once, outside the loop

    def step_fn(ids, index, state, constants):
        logits, cache = model.decode_step(ids, index, state["cache"],
                                          positions=index - constants["padding"],
                                          key_mask=constants["key_mask"], output_table=table)
        return _without_pad(logits), {"cache": cache}
    return step_fn, {"cache": cache}, constants


def uncached_step(model, aligned, padding, cache_length):
    """The step function that runs the model on the whole prefix every step.

    The baseline the cache is measured against (and a check of it): the same logits, with
    O(t) positions computed at step t instead of one (the blocks only: the vocabulary
    projection, as with the cache, is of the last position). The token buffer is the state.

    Args:
      model, aligned, padding, cache_length: as `cached_step`.

    Returns:
      As `cached_step`.
    """
    batch, width = tf.shape(aligned)[0], tf.shape(aligned)[1]
    buffer = tf.concat([aligned, tf.zeros([batch, cache_length - width], tf.int32)], axis=1)
    real = tf.cast(tf.range(cache_length)[None, :] >= padding[:, None], tf.int32)
    table = model.decoding_table()  # as the cached loop's

    def step_fn(ids, index, state, constants):
        prefix = decoding.write_at(state["prefix"], index, ids)
        inputs = {features.INPUT_WORD_IDS: prefix[:, :index + 1],
                  features.INPUT_MASK: constants["input_mask"][:, :index + 1]}
        hidden = model.hidden_states(inputs, training=False)  # (b, index + 1, hidden)
        logits = model.logits(hidden[:, -1:], output_table=table)[:, 0]
        return _without_pad(logits), {"prefix": prefix}
    return step_fn, {"prefix": buffer}, {"input_mask": real}


# The sampling settings' dtypes in the loops (`decoding.sample` casts to the same).
_SETTING_DTYPES = {"temperature": tf.float32, "top_k": tf.int32, "top_p": tf.float32,
                   "seed": tf.int64, "max_steps": tf.int32}


def _loop(model, max_new_tokens, end_id, greedy, use_cache):
    """run(prompt_ids, prompt_lengths, settings) -> (ids, scores): the prefill and the loop."""
    def run(prompt_ids, prompt_lengths, settings):
        aligned, padding = left_align(prompt_ids, prompt_lengths)
        width = tf.shape(aligned)[1]
        cache_length = width + max_new_tokens - 1
        make = cached_step if use_cache else uncached_step
        step_fn, state, constants = make(model, aligned, padding, cache_length)
        kwargs = dict(max_decode_length=max_new_tokens, end_id=end_id,
                      initial_index=width - 1, constants=constants)
        if greedy:
            return decoding.greedy_search(step_fn, aligned[:, -1], state, **kwargs,
                                          max_steps=settings.get("max_steps"))
        return decoding.sample(step_fn, aligned[:, -1], state, **settings, **kwargs)
    return run


def _compiled_loop(model, max_new_tokens, end_id, greedy):
    """`_loop` with the cache, compiled with XLA; one `tf.function` per model and settings."""
    return compiled_loops.compiled(model, ("generate", max_new_tokens, end_id, greedy),
                             lambda m: _loop(m, max_new_tokens, end_id, greedy, True))


def generate(model, prompt_ids, prompt_lengths, *, max_new_tokens, end_id, temperature=0.0,
             top_k=0, top_p=1.0, seed=None, use_cache=True, jit_compile=None,
             new_token_limit=None):
    """Continues each prompt until `end_id` or `max_new_tokens`, in the graph.

    Works eagerly, inside `tf.function` and in a SavedModel; the sampling settings may be
    tensors. Greedy (`temperature=0`) and sampled rows use `decoding.greedy_search` and
    `decoding.sample` (top-k, then top-p over the temperature-scaled logits; the draw at
    step i uses `seed` folded with i, so a seed reproduces its tokens).

    Args:
      model: a `CausalLM` (or a model with its decoding API, see the module docstring).
      prompt_ids: int `[b, p]`, right-padded with 0 (e.g. [SEP] + the prompt's tokens).
      prompt_lengths: int `[b]`, each prompt's tokens, in [1, p].
      max_new_tokens: Python int >= 1, the most tokens generated per row (end token
        included); each prompt length plus it must be at most `model.max_sequence_length`.
      end_id: the token that ends a row (the id of [SEP]).
      temperature: float >= 0 (0: greedy, the most likely token each step).
      top_k: int >= 0 (0: off); top_p: float in (0, 1] (1: off).
      seed: int or int scalar tensor; None draws one (a different continuation each call).
      use_cache: False runs the model on the whole prefix each step (slow; a baseline).
      jit_compile: compile the prefill and the loop with XLA (needs the cache). None (the
        default) means True with the cache, False without it. XLA runs a step as one
        program; the graph executor (False) dispatches the step's ~200 small ops one by one,
        which on a CPU costs more than their arithmetic. A first call per shape compiles
        (about a second for the mini model, over the tracing every path pays); prompt widths
        are padded up to a multiple of `compiled_loops.WIDTH_BUCKET` so a run of varied
        prompts compiles once per bucket. False suits a SavedModel meant for any TensorFlow runtime.
      new_token_limit: optional int scalar (a tensor: a SavedModel's input), at most
        `max_new_tokens`: stop after that many tokens; the shapes and the cache stay those
        of `max_new_tokens` (the columns after the limit are 0). Checked against the
        prompts' lengths in its stead.

    Returns:
      `{"generated_ids": int32 [b, max_new_tokens]` (without the end token, 0 from there
      on), `"generated_lengths": int32 [b]` (tokens before the end), `"scores": float32 [b]`
      (sum of the log-probabilities of the generated tokens, end token included, under the
      model's distribution without [PAD])}.

    Raises:
      ValueError: max_new_tokens not a positive int, a prompt (when its length is known
        now) plus max_new_tokens (or new_token_limit) beyond max_sequence_length, bad
        sampling settings given as numbers, or jit_compile without the cache. In a graph
        with lengths or a limit unknown until run time, those checks raise
        `tf.errors.InvalidArgumentError` then.
    """
    if jit_compile and not use_cache:
        raise ValueError("jit_compile=True needs use_cache=True: without the cache the model "
                         "input grows every step, which XLA cannot compile")
    if jit_compile is None:
        jit_compile = use_cache
    prompt_ids = tf.cast(tf.convert_to_tensor(prompt_ids), tf.int32)
    prompt_lengths = tf.cast(tf.convert_to_tensor(prompt_lengths), tf.int32)
    checks = _check_lengths(model, prompt_ids, prompt_lengths, max_new_tokens, new_token_limit)
    greedy = isinstance(temperature, (int, float)) and temperature == 0
    if not greedy:
        decoding._check_sampling(temperature, top_k, top_p)  # noqa: SLF001 (its own checks)
        if seed is None:
            seed = tf.random.uniform([], 0, 2**31 - 1, tf.int32)
    settings = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed}
    if new_token_limit is not None:
        settings["max_steps"] = tf.cast(new_token_limit, tf.int32)

    with tf.control_dependencies(checks):
        prompt_ids = tf.identity(prompt_ids)
    if jit_compile:
        run = _compiled_loop(model, max_new_tokens, end_id, greedy)
        # Left alignment turns the extra columns into padding no token attends to, every
        # token at its own position: the logits are those of the unpadded prompts.
        prompt_ids = compiled_loops.bucket_width(prompt_ids,
                                           int(model.max_sequence_length) - max_new_tokens)
    else:
        run = _loop(model, max_new_tokens, end_id, greedy, use_cache)
    if greedy:  # the sampling settings are not used (nor traced)
        settings = {key: settings[key] for key in ("max_steps",) if key in settings}
    else:  # as tensors: a new temperature, top-k, top-p or seed reuses the compiled loop
        settings = {key: tf.cast(tf.convert_to_tensor(value), _SETTING_DTYPES[key])
                    for key, value in settings.items()}
    ids, scores = run(prompt_ids, prompt_lengths, settings)
    ids = tf.where(ids == end_id, PAD_ID, ids)  # the end token is the last nonzero one
    lengths = tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), axis=1)
    return {GENERATED_IDS: ids, GENERATED_LENGTHS: lengths, SCORES: scores}
