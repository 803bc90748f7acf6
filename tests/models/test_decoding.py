"""Greedy search, beam search and sampling against brute force on toy Markov chains.

The toy models are transition tables over a 6-token vocabulary (0 pad and 1 start never
generated, 2 the end token, 3-5 words). The second-order chain reads the token before the
last one from the state, not from `ids`: beam search only finds the brute-force best if it
gathers the state by the chosen beams every step.
"""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from bert_trainer.models.generation import decoding

VOCAB, START, END, WORDS = 6, 1, 2, (3, 4, 5)


def _table(seed, context):
    """Random next-token probabilities indexed by the last `context` tokens; pad/start get 0."""
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.ones(VOCAB) * 0.7, size=(VOCAB,) * context)
    probs[..., :2] = 0.0
    return (probs / probs.sum(-1, keepdims=True)).astype(np.float32)


def _log(table):
    with np.errstate(divide="ignore"):  # log(0) = -inf: tokens the chain never produces
        return tf.constant(np.log(table))


def _first_order(table):
    log_table = _log(table)

    def step_fn(ids, index, state):
        return tf.gather(log_table, ids), state
    return step_fn, {}


def _second_order(table, max_length):
    """step_fn of a chain on the last two tokens; the older one comes from state["history"]."""
    log_table = _log(table)

    def step_fn(ids, index, state):
        history = decoding.write_at(state["history"], index, ids)  # tokens fed, [n, L]
        before = tf.where(index > 0, tf.gather(history, tf.maximum(index - 1, 0), axis=1), 0)
        logits = tf.gather_nd(log_table, tf.stack([before, ids], -1))
        return logits, {"history": history, "calls": state["calls"] + 1}

    def initial_state(batch):
        return {"history": tf.zeros([batch, max_length], tf.int32),
                "calls": tf.zeros([batch], tf.int32)}
    return step_fn, initial_state


def _prob(table, before, last, token):
    return table[before, last, token] if table.ndim == 3 else table[last, token]


def _all_sequences(table, start, max_length):
    """Every sequence the chain can produce: (tokens, log-prob, finished)."""
    out = []
    for length in range(1, max_length + 1):
        for words in itertools.product(WORDS, repeat=length):
            for finished in (True, False):
                if not finished and length < max_length:
                    continue
                tokens = (*words[:-1], END) if finished else words
                history, log_prob = [0, start], 0.0
                for token in tokens:
                    log_prob += np.log(_prob(table, history[-2], history[-1], token))
                    history.append(token)
                out.append((tokens, log_prob, finished))
    return sorted(set(out))


def _penalty(length, alpha):
    return ((5.0 + length) / 6.0) ** alpha


def _brute_force_ranking(table, start, max_length, alpha):
    """Hypotheses best first as beam search orders them: finished ones first, then by score."""
    scored = [(finished, log_prob / _penalty(len(tokens), alpha), tokens)
              for tokens, log_prob, finished in _all_sequences(table, start, max_length)]
    return sorted(scored, key=lambda h: (not h[0], -h[1]))


def _brute_force_greedy(table, start, max_length):
    history, log_prob = [0, start], 0.0
    while len(history) - 2 < max_length and history[-1] != END:
        probs = table[history[-2], history[-1]] if table.ndim == 3 else table[history[-1]]
        history.append(int(np.argmax(probs)))
        log_prob += np.log(probs[history[-1]])
    return history[2:], log_prob


def _padded(tokens, length):
    return list(tokens) + [0] * (length - len(tokens))


@pytest.mark.parametrize("order", [1, 2])
def test_large_beam_finds_the_brute_force_ranking_and_greedy_the_greedy_path(order):
    max_length, alpha, starts = 4, 0.6, [START, 3, 5]
    table = _table(seed=order, context=order)
    if order == 1:
        step_fn, state = _first_order(table)
    else:
        step_fn, make_state = _second_order(table, max_length)
        state = make_state(len(starts))
    # A beam wider than every candidate a step can have (3 alive words ** 3 steps * 6 tokens)
    # prunes nothing, so its ranking must be the exhaustive one.
    ids, scores = decoding.beam_search(
        step_fn, starts, state, vocab_size=VOCAB, beam_size=192, length_penalty=alpha,
        max_decode_length=max_length, end_id=END)
    greedy_ids, greedy_scores = decoding.greedy_search(
        step_fn, starts, state, max_decode_length=max_length, end_id=END)
    for row, start in enumerate(starts):
        expected = _brute_force_ranking(table, start, max_length, alpha)
        for place in (*range(8), 40, 41):  # 40 sequences end within 4 tokens; 81 do not
            assert ids[row, place].numpy().tolist() == _padded(expected[place][2], max_length)
            np.testing.assert_allclose(scores[row, place], expected[place][1], rtol=1e-5)
        tokens, log_prob = _brute_force_greedy(table, start, max_length)
        assert greedy_ids[row].numpy().tolist() == _padded(tokens, max_length)
        np.testing.assert_allclose(greedy_scores[row], log_prob, rtol=1e-5)
        # The chains are random enough that the greedy path is not the best sequence.
    assert any(greedy_ids[r].numpy().tolist() != ids[r, 0].numpy().tolist() for r in range(3))


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("seed", [3, 4, 5])
def test_one_beam_is_greedy_search(seed, alpha):
    max_length, starts = 6, [START, 3, 4, 5]
    step_fn, make_state = _second_order(_table(seed, context=2), max_length)
    ids, scores = decoding.beam_search(
        step_fn, starts, make_state(4), vocab_size=VOCAB, beam_size=1, length_penalty=alpha,
        max_decode_length=max_length, end_id=END)
    greedy_ids, greedy_scores = decoding.greedy_search(
        step_fn, starts, make_state(4), max_decode_length=max_length, end_id=END,
        length_penalty=alpha)
    np.testing.assert_array_equal(ids[:, 0], greedy_ids)
    np.testing.assert_allclose(scores[:, 0], greedy_scores, rtol=1e-6)


def test_length_penalty_changes_the_winner():
    # From start: end 0.52 or word 3 (0.48); after 3: end 0.9. Short [end] has the higher
    # log-prob (-0.654 vs -0.839); ((5 + 2) / 6) ** 2 divides the long one enough to win.
    table = np.zeros((VOCAB, VOCAB), np.float32)
    table[:, END] = 1.0
    table[START, [END, 3]] = [0.52, 0.48]
    table[3, [END, 4]] = [0.9, 0.1]
    step_fn, state = _first_order(table)
    winners = {}
    for alpha in (0.0, 2.0):
        ids, scores = decoding.beam_search(
            step_fn, [START], state, vocab_size=VOCAB, beam_size=2, length_penalty=alpha,
            max_decode_length=4, end_id=END)
        winners[alpha] = ids[0, 0].numpy().tolist()
        long_score = np.log(0.48 * 0.9) / _penalty(2, alpha)
        np.testing.assert_allclose(sorted(scores[0].numpy()),
                                   sorted([np.log(0.52) / _penalty(1, alpha), long_score]),
                                   rtol=1e-5)
    assert winners == {0.0: [END, 0, 0, 0], 2.0: [3, END, 0, 0]}


def test_rows_decode_the_same_alone_or_in_a_batch():
    max_length, starts = 5, [START, 3, 4, 5]
    step_fn, make_state = _second_order(_table(7, context=2), max_length)

    def decode(rows):
        return decoding.beam_search(step_fn, rows, make_state(len(rows)), vocab_size=VOCAB,
                                    beam_size=3, length_penalty=0.6,
                                    max_decode_length=max_length, end_id=END)
    ids, scores = decode(starts)
    for row, start in enumerate(starts):
        alone_ids, alone_scores = decode([start])
        np.testing.assert_array_equal(ids[row], alone_ids[0])
        np.testing.assert_allclose(scores[row], alone_scores[0], rtol=1e-6)


def test_end_token_stops_the_row_and_the_loop():
    table = np.zeros((VOCAB, VOCAB), np.float32)
    table[:, 4] = 1.0  # words go on for ever ...
    table[START, [3, 4]] = [0.7, 0.3]
    table[3] = 0.0
    table[3, END] = 1.0  # ... except after 3, which always ends
    calls = []
    step_fn, state = _first_order(table)

    def counted(ids, index, state):
        calls.append(int(index))  # eager: the while loop runs in Python
        return step_fn(ids, index, state)
    ids, scores = decoding.greedy_search(counted, [START, 3, 4], state, max_decode_length=6,
                                         end_id=END)
    assert ids.numpy().tolist() == [[3, END, 0, 0, 0, 0], [END, 0, 0, 0, 0, 0], [4] * 6]
    np.testing.assert_allclose(scores, [np.log(0.7), 0.0, 0.0], atol=1e-6)
    calls.clear()
    ids, _ = decoding.greedy_search(counted, [START, 3], state, max_decode_length=6, end_id=END)
    assert calls == [0, 1]  # both rows ended after two steps: no more calls
    calls.clear()
    sampled, _ = decoding.sample(counted, [START, 3], state, max_decode_length=6, end_id=END,
                                 top_k=1, initial_index=tf.constant(5, tf.int64))
    assert calls == [5, 6] and sampled.numpy().tolist() == ids.numpy().tolist()
    calls.clear()
    ids, scores = decoding.beam_search(counted, [START], state, vocab_size=VOCAB, beam_size=2,
                                       length_penalty=0.0, max_decode_length=6, end_id=END,
                                       initial_index=3)
    assert calls == [3, 4, 5, 6, 7, 8]  # indices from initial_index (a prefilled prompt)
    # [3, end] and [4, 4, ...]: the second never ends, so the loop runs to the end.
    assert ids[0].numpy().tolist() == [[3, END, 0, 0, 0, 0], [4] * 6]
    np.testing.assert_allclose(scores[0], [np.log(0.7), np.log(0.3)], atol=1e-6)


def test_every_hypothesis_stops_at_its_end_token():
    max_length = 6
    step_fn, make_state = _second_order(_table(11, context=2), max_length)
    ids, _ = decoding.beam_search(step_fn, [START, 3, 4], make_state(3), vocab_size=VOCAB,
                                  beam_size=4, length_penalty=0.6,
                                  max_decode_length=max_length, end_id=END)
    ended = 0
    for hypothesis in ids.numpy().reshape(-1, max_length).tolist():
        if END in hypothesis:
            ended += 1
            cut = hypothesis.index(END) + 1
            assert hypothesis[cut:] == [0] * (max_length - cut), hypothesis
        assert 0 not in hypothesis[:cut if END in hypothesis else max_length], hypothesis
    assert ended > 0


def test_sampling_top_k_one_and_zero_temperature_are_greedy():
    max_length, starts = 6, [START, 3, 4, 5]
    step_fn, make_state = _second_order(_table(5, context=2), max_length)
    greedy_ids, greedy_scores = decoding.greedy_search(
        step_fn, starts, make_state(4), max_decode_length=max_length, end_id=END)
    for settings in ({"top_k": 1, "temperature": 2.0}, {"temperature": 0.0},
                     {"temperature": 1e-3}, {"top_p": 1e-6}):
        ids, scores = decoding.sample(step_fn, starts, make_state(4), max_decode_length=max_length,
                                      end_id=END, seed=9, **settings)
        np.testing.assert_array_equal(ids, greedy_ids, err_msg=str(settings))
        np.testing.assert_allclose(scores, greedy_scores, rtol=1e-6)


def _first_token_frequencies(probs, rows=4000, seed=17, **settings):
    table = np.zeros((VOCAB, VOCAB), np.float32)
    table[:, END] = 1.0
    table[START] = probs
    step_fn, state = _first_order(table)
    ids, _ = decoding.sample(step_fn, [START] * rows, state, max_decode_length=1, end_id=END,
                             seed=seed, **settings)
    return np.bincount(ids[:, 0].numpy(), minlength=VOCAB) / rows


PROBS = np.array([0.0, 0.0, 0.05, 0.45, 0.3, 0.2], np.float32)


@pytest.mark.parametrize("settings, expected", [
    ({}, PROBS),
    # Nucleus 0.7: 0.45 and 0.3 (the mass before 0.2 is already 0.75), renormalized.
    ({"top_p": 0.7}, [0, 0, 0, 0.6, 0.4, 0]),
    ({"top_k": 3}, np.where(PROBS >= 0.2, PROBS, 0) / 0.95),
    # top_p applies to the top_k tokens renormalized: 0.45 / 0.75 = 0.6 >= 0.5 keeps one.
    ({"top_k": 2, "top_p": 0.5}, [0, 0, 0, 1, 0, 0]),
    ({"temperature": 0.5}, PROBS ** 2 / np.sum(PROBS ** 2)),
])
def test_sampling_follows_the_filtered_distribution(settings, expected):
    frequencies = _first_token_frequencies(PROBS, **settings)
    # 4000 draws: 4 standard deviations of a frequency are at most 0.032.
    np.testing.assert_allclose(frequencies, expected, atol=0.032)
    assert np.all(frequencies[np.asarray(expected) == 0] == 0)


def test_sampling_is_reproducible_by_seed():
    step_fn, make_state = _second_order(_table(6, context=2), 8)

    def draw(seed):
        return decoding.sample(step_fn, [START] * 64, make_state(64), max_decode_length=8,
                               end_id=END, seed=seed)[0].numpy()
    np.testing.assert_array_equal(draw(3), draw(3))
    np.testing.assert_array_equal(draw(3), draw(tf.constant([3, 0])))
    assert (draw(3) != draw(4)).any()


@pytest.mark.parametrize("settings, message", [
    ({"temperature": -1.0}, "temperature"), ({"top_k": -2}, "top_k"),
    ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"max_decode_length": 0}, "max_decode_length"),
    ({"max_decode_length": tf.constant(3)}, "max_decode_length")])
def test_sampling_settings_are_checked(settings, message):
    step_fn, state = _first_order(_table(1, context=1))
    kwargs = {"max_decode_length": 3, "end_id": END, **settings}
    with pytest.raises(ValueError, match=message):
        decoding.sample(step_fn, [START], state, **kwargs)


def test_beam_settings_are_checked():
    step_fn, state = _first_order(_table(1, context=1))
    with pytest.raises(ValueError, match="beam_size"):
        decoding.beam_search(step_fn, [START], state, vocab_size=VOCAB, beam_size=0,
                             length_penalty=0.6, max_decode_length=3, end_id=END)


@pytest.fixture(scope="module")
def eager_decoded():
    """The eager results the graph and XLA runs below are compared with, run once for both:
    {} filled by the first test with flat (beams, greedy, sampled)."""
    return {}


@pytest.mark.parametrize("jit_compile", [False, True])
def test_decoding_in_a_tf_function_equals_eager(jit_compile, eager_decoded):
    max_length = 5
    step_fn, make_state = _second_order(_table(8, context=2), max_length)
    starts = tf.constant([START, 3, 4])

    def decode(rows):
        state = make_state(tf.shape(rows)[0])
        beams = decoding.beam_search(step_fn, rows, state, vocab_size=VOCAB, beam_size=3,
                                     length_penalty=0.6, max_decode_length=max_length,
                                     end_id=END)
        greedy = decoding.greedy_search(step_fn, rows, state, max_decode_length=max_length,
                                        end_id=END)
        sampled = decoding.sample(step_fn, rows, state, max_decode_length=max_length,
                                  end_id=END, temperature=tf.constant(0.0), top_p=0.9)
        return beams, greedy, sampled
    compiled = tf.function(decode, input_signature=[tf.TensorSpec([None], tf.int32)],
                           jit_compile=jit_compile)
    if "outputs" not in eager_decoded:
        eager_decoded["outputs"] = tf.nest.flatten(decode(starts))
    eager_outputs = eager_decoded["outputs"]
    graph_outputs = tf.nest.flatten(compiled(starts))
    for eager, graph in zip(eager_outputs, graph_outputs, strict=True):
        assert graph.shape == eager.shape
        np.testing.assert_allclose(graph, eager, rtol=1e-6)


def test_constants_equal_the_same_tensors_carried_in_the_state():
    """Per-row constants (tiled once, never gathered) give what the state gave: each row's own
    bias reaches every beam of that row and no other."""
    table, max_length, starts = _table(seed=7, context=2), 4, [START, 3, 4]
    step_fn, make_state = _second_order(table, max_length)
    row_bias = tf.constant(np.random.default_rng(3).normal(size=(3, VOCAB)), tf.float32)
    seen_shapes = []

    def biased_in_state(ids, index, state):
        logits, new = step_fn(ids, index, {k: v for k, v in state.items() if k != "bias"})
        return logits + state["bias"], {**new, "bias": state["bias"]}

    def biased_by_constants(ids, index, state, constants):
        seen_shapes.append(tuple(constants["bias"].shape))
        logits, new = step_fn(ids, index, state)
        return logits + constants["bias"], new

    def decode(fn, state, **constants):
        beams = decoding.beam_search(fn, starts, state, vocab_size=VOCAB, beam_size=3,
                                     length_penalty=0.6, max_decode_length=max_length,
                                     end_id=END, **constants)
        greedy = decoding.greedy_search(fn, starts, state, max_decode_length=max_length,
                                        end_id=END, **constants)
        sampled = decoding.sample(fn, starts, state, max_decode_length=max_length, end_id=END,
                                  seed=5, **constants)
        return beams + greedy + sampled

    carried = decode(biased_in_state, {**make_state(3), "bias": row_bias})
    constant = decode(biased_by_constants, make_state(3), constants={"bias": row_bias})
    for expected, got in zip(carried, constant, strict=True):
        if expected.dtype == tf.int32:
            assert got.numpy().tolist() == expected.numpy().tolist()
        else:
            np.testing.assert_allclose(got, expected, rtol=1e-5)
    # Beam search's calls see the 3 rows tiled to 9 beams, greedy's and sampling's the rows.
    assert seen_shapes[0] == (9, VOCAB) and set(seen_shapes) == {(9, VOCAB), (3, VOCAB)}
    unbiased = decoding.greedy_search(step_fn, starts, make_state(3),
                                      max_decode_length=max_length, end_id=END)
    assert unbiased[0].numpy().tolist() != constant[3].numpy().tolist()  # the bias matters


def test_uniform_noise_is_the_same_eagerly_in_graphs_and_under_xla():
    """Sampling's noise: one stream per (seed, step), equal with and without XLA (TF's
    stateless generators are not), uniform in (0, 1), and different across seeds and steps."""
    seed = decoding._sampling_seed(7)  # noqa: SLF001
    shape = tf.constant([8, 1000])

    def noise(index):
        return decoding.uniform_noise(shape, seed, index)

    eager = noise(3).numpy()
    np.testing.assert_array_equal(tf.function(noise)(tf.constant(3)).numpy(), eager)
    np.testing.assert_array_equal(tf.function(noise, jit_compile=True)(3).numpy(), eager)
    assert 0 < eager.min() and eager.max() < 1
    assert abs(eager.mean() - 0.5) < 0.01 and abs(eager.std() - 12 ** -0.5) < 0.01
    assert np.abs(noise(4).numpy() - eager).mean() > 0.3  # another step, other numbers
    other = decoding.uniform_noise(shape, decoding._sampling_seed(8), 3).numpy()  # noqa: SLF001
    assert np.abs(other - eager).mean() > 0.3
