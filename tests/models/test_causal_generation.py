"""generate(): cached equals uncached, batched equals per row, sampling, end tokens, graphs."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from numerics import assert_close

from bert_trainer.models import CausalLM
from bert_trainer.models.generation.causal import (
    GENERATED_IDS,
    GENERATED_LENGTHS,
    SCORES,
    generate,
    left_align,
)

VOCAB, MAX_LEN, NEW = 97, 24, 8
LENGTHS = np.array([1, 5, 3, 7], "int32")


def _model(**kwargs):
    # A wide initializer: the greedy tokens vary instead of repeating one near-uniform pick.
    return CausalLM(VOCAB, hidden_size=32, num_layers=2, num_attention_heads=4, inner_dim=64,
                    max_sequence_length=MAX_LEN, initializer_range=0.5, **kwargs)


@pytest.fixture(scope="module")
def model():
    """One `_model()` for the tests that only read it: its XLA-compiled greedy loop (and the
    traces of its other loops) is made once for them all, not once per test. Built as each
    test used to build its own: right after the seed the suite sets before every test."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(1234)
    built = _model()
    built({"input_word_ids": np.ones((1, 2), "int32")})  # its weights, drawn now
    return built


def _prompts(lengths=LENGTHS, seed=0):
    """Right-padded prompts [len(lengths), max(lengths)], no id 0 inside a prompt."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((len(lengths), int(max(lengths))), "int32")
    for row, length in enumerate(lengths):
        ids[row, :length] = rng.integers(1, VOCAB, length)
    return ids


def _run(model, prompts=None, lengths=LENGTHS, **kwargs):
    prompts = _prompts(lengths) if prompts is None else prompts
    kwargs.setdefault("max_new_tokens", NEW)
    kwargs.setdefault("end_id", VOCAB + 1)  # never generated: every row runs to the end
    out = generate(model, prompts, lengths, **kwargs)
    return {key: np.asarray(value) for key, value in out.items()}


def test_left_align():
    aligned, padding = left_align(tf.constant([[5, 6, 7], [8, 0, 0]]), tf.constant([3, 1]))
    np.testing.assert_array_equal(aligned, [[5, 6, 7], [0, 0, 8]])
    np.testing.assert_array_equal(padding, [0, 2])


@pytest.mark.parametrize("norm_first", [True, False])
def test_cached_equals_uncached_greedy_and_per_row(norm_first, request):
    # Pre-norm is the default: the shared model.
    model = request.getfixturevalue("model") if norm_first else _model(norm_first=False)
    cached = _run(model)
    uncached = _run(model, use_cache=False)
    np.testing.assert_array_equal(cached[GENERATED_IDS], uncached[GENERATED_IDS])
    assert_close(cached[SCORES], uncached[SCORES], rtol=1e-4)
    ids = cached[GENERATED_IDS]
    assert ids.shape == (4, NEW) and ids.dtype == np.int32
    assert len(np.unique(ids)) > 4, "the test model should not repeat one token"
    np.testing.assert_array_equal(cached[GENERATED_LENGTHS], [NEW] * 4)
    assert (ids > 0).all() and (ids < VOCAB).all()
    prompts = _prompts()
    for row, length in enumerate(LENGTHS):  # each prompt alone, without padding
        alone = _run(model, prompts[row:row + 1, :length], LENGTHS[row:row + 1])
        np.testing.assert_array_equal(alone[GENERATED_IDS][0], ids[row], err_msg=f"row {row}")
        assert_close(alone[SCORES][0], cached[SCORES][row], rtol=1e-4)


def test_greedy_continuation_equals_argmax_of_the_full_pass(model):
    """Row by row, each generated token is the argmax of `call`'s logits on prompt + the
    tokens before it, and the score is the sum of their log-probabilities."""
    out = _run(model)
    prompts = _prompts()
    for row, length in enumerate(LENGTHS):
        sequence = np.concatenate([prompts[row, :length], out[GENERATED_IDS][row]])
        logits = np.array(model({"input_word_ids": sequence[None]})["logits"])[0]
        logits[:, 0] = -np.inf  # [PAD] is never generated
        picks = logits[length - 1:-1].argmax(-1)
        np.testing.assert_array_equal(picks, out[GENERATED_IDS][row])
        log_probs = np.asarray(tf.nn.log_softmax(logits[length - 1:-1]))
        assert_close(out[SCORES][row], log_probs[np.arange(NEW), picks].sum(), rtol=1e-4)


def test_end_token_stops_a_row(model):
    free = _run(model)[GENERATED_IDS]
    end_id = int(free[1, 3])  # row 1's fourth token becomes the end token
    out = _run(model, end_id=end_id)
    for row in range(4):
        hits = np.flatnonzero(free[row] == end_id)
        stop = int(hits[0]) if hits.size else NEW
        assert out[GENERATED_LENGTHS][row] == stop
        np.testing.assert_array_equal(out[GENERATED_IDS][row, :stop], free[row, :stop])
        np.testing.assert_array_equal(out[GENERATED_IDS][row, stop:], 0)
    assert out[GENERATED_LENGTHS][1] <= 3


# Sampling settings of the tests below.
SAMPLED = {"temperature": 1.2, "top_k": 20, "top_p": 0.9}


def _sampled_loop(model):
    """The XLA-compiled sampling loop `generate` keeps for `model` (max_new_tokens NEW)."""
    from bert_trainer.models.generation import compiled_loops  # noqa: PLC0415

    return compiled_loops._COMPILED[model][("generate", NEW, VOCAB + 1, False)]  # noqa: SLF001


def test_sampling_is_reproducible_and_top_k_1_is_greedy(model):
    greedy = _run(model)
    first = _run(model, **SAMPLED, seed=7)
    traces = _sampled_loop(model).experimental_get_tracing_count()
    again = _run(model, **SAMPLED, seed=7)
    other = _run(model, **SAMPLED, seed=8)
    np.testing.assert_array_equal(first[GENERATED_IDS], again[GENERATED_IDS])
    np.testing.assert_array_equal(first[SCORES], again[SCORES])
    assert (first[GENERATED_IDS] != other[GENERATED_IDS]).any()
    assert (first[GENERATED_IDS] != greedy[GENERATED_IDS]).any()
    for kwargs in ({"top_k": 1}, {"top_p": 1e-6}):
        narrow = _run(model, temperature=0.8, seed=3, **kwargs)
        np.testing.assert_array_equal(narrow[GENERATED_IDS], greedy[GENERATED_IDS])
        assert_close(narrow[SCORES], greedy[SCORES])
    # The settings and the seed are the loop's tensors: new values reuse its one trace (and
    # XLA program) for these shapes instead of compiling it again.
    assert _sampled_loop(model).experimental_get_tracing_count() == traces
    # Sampling with the cache draws the same tokens as without it.
    uncached = _run(model, **SAMPLED, seed=7, use_cache=False)
    np.testing.assert_array_equal(uncached[GENERATED_IDS], first[GENERATED_IDS])


def test_new_token_limit_stops_early_within_the_same_shapes(model):
    full = _run(model)
    for limit in (3, tf.constant(3)):
        out = _run(model, new_token_limit=limit)
        assert out[GENERATED_IDS].shape == (4, NEW)
        np.testing.assert_array_equal(out[GENERATED_IDS][:, :3], full[GENERATED_IDS][:, :3])
        np.testing.assert_array_equal(out[GENERATED_IDS][:, 3:], 0)
        np.testing.assert_array_equal(out[GENERATED_LENGTHS], [3] * 4)
    # The limit, not the cap, is checked against the positions.
    long_prompt = _prompts([20])
    out = _run(model, long_prompt, np.array([20], "int32"), max_new_tokens=10, new_token_limit=4)
    assert out[GENERATED_LENGTHS][0] == 4
    with pytest.raises(ValueError, match="prompt of 20 tokens plus new_token_limit=5 exceeds"):
        _run(model, long_prompt, np.array([20], "int32"), max_new_tokens=10, new_token_limit=5)
    with pytest.raises(ValueError, match=r"new_token_limit must lie in \[1, max_new_tokens=8\]"):
        _run(model, new_token_limit=9)


class _PadLovingModel:
    """The decoding API with fixed logits that rank [PAD] (0) first and token 7 second."""

    max_sequence_length = 16

    def init_cache(self, batch_size, max_length):
        return {"calls": tf.zeros([batch_size], tf.int32)}

    def decode(self, token_ids, index, cache, positions=None, key_mask=None, project=True):
        logits = tf.one_hot(tf.zeros_like(token_ids), 10) * 5 + tf.one_hot(
            tf.fill(tf.shape(token_ids), 7), 10)
        return logits, cache

    def decode_step(self, token_ids, index, cache, positions=None, key_mask=None,
                    output_table=None):
        logits, cache = self.decode(token_ids[:, None], index, cache)
        return logits[:, 0], cache

    def decoding_table(self):
        return None


def test_pad_is_never_generated():
    out = _run(_PadLovingModel(), _prompts([2, 1]), np.array([2, 1], "int32"))
    np.testing.assert_array_equal(out[GENERATED_IDS], np.full((2, NEW), 7))


def test_saved_model_with_tensor_settings(model, tmp_path):
    greedy = _run(model)
    sampled = _run(model, **SAMPLED, seed=7)

    class Generator(tf.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32),
                                      tf.TensorSpec([None], tf.int32),
                                      tf.TensorSpec([], tf.float32),
                                      tf.TensorSpec([], tf.int32),
                                      tf.TensorSpec([], tf.float32),
                                      tf.TensorSpec([], tf.int32),
                                      tf.TensorSpec([], tf.int32)])
        def __call__(self, prompt_ids, prompt_lengths, temperature, top_k, top_p, seed, limit):
            return generate(self.model, prompt_ids, prompt_lengths, max_new_tokens=NEW,
                            end_id=VOCAB + 1, temperature=temperature, top_k=top_k,
                            top_p=top_p, seed=seed, new_token_limit=limit)

    path = str(tmp_path / "generator")
    tf.saved_model.save(Generator(), path)
    loaded = tf.saved_model.load(path)
    prompts = _prompts()
    out = loaded(prompts, LENGTHS, 0.0, 0, 1.0, 0, NEW)
    np.testing.assert_array_equal(out[GENERATED_IDS], greedy[GENERATED_IDS])
    out = loaded(prompts, LENGTHS, 1.2, 20, 0.9, 7, NEW)
    np.testing.assert_array_equal(out[GENERATED_IDS], sampled[GENERATED_IDS])
    out = loaded(prompts, LENGTHS, 1.2, 20, 0.9, 7, 2)
    np.testing.assert_array_equal(out[GENERATED_IDS][:, :2], sampled[GENERATED_IDS][:, :2])
    np.testing.assert_array_equal(out[GENERATED_LENGTHS], [2] * 4)
    # Lengths known only at run time are checked then.
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_sequence_length=24"):
        loaded(np.ones((1, 20), "int32"), np.array([20], "int32"), 0.0, 0, 1.0, 0, NEW)
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_sequence_length=24"):
        loaded(prompts, LENGTHS, 0.0, 0, 1.0, 0, NEW + 1)


def test_xla_by_default_equals_the_graph_executor_greedy_and_sampled():
    """The default loop (XLA with the cache, prompt widths bucketed) gives the graph
    executor's tokens, and a seed draws the same sample in both."""
    from bert_trainer.models.generation import compiled_loops  # noqa: PLC0415

    model = _model()
    for settings in ({}, {"temperature": 1.3, "top_k": 30, "top_p": 0.95, "seed": 11}):
        default = _run(model, **settings)
        plain = _run(model, jit_compile=False, **settings)
        np.testing.assert_array_equal(default[GENERATED_IDS], plain[GENERATED_IDS])
        np.testing.assert_allclose(default[SCORES], plain[SCORES], rtol=1e-5, atol=1e-5)
    # One compiled loop per model and settings, reused by the next call.
    loops = compiled_loops._COMPILED[model]  # noqa: SLF001
    assert len(loops) == 2
    _run(model)
    assert len(loops) == 2


def test_prompt_widths_are_bucketed_without_changing_the_tokens(model):
    from bert_trainer.models.generation.compiled_loops import WIDTH_BUCKET, bucket_width  # noqa: PLC0415

    prompts = _prompts()  # width 7
    padded = bucket_width(tf.constant(prompts), limit=92)
    assert padded.shape == (4, WIDTH_BUCKET)
    np.testing.assert_array_equal(padded[:, :7], prompts)
    np.testing.assert_array_equal(padded[:, 7:], 0)
    # Never past the room the new tokens leave, and never cutting a prompt.
    assert bucket_width(tf.constant(prompts), limit=16).shape == (4, 16)
    assert bucket_width(tf.constant(prompts), limit=4).shape == (4, 7)
    dynamic = tf.function(lambda ids: bucket_width(ids, limit=92),
                          input_signature=[tf.TensorSpec([None, None], tf.int32)])
    assert dynamic(tf.constant(prompts)).shape == (4, WIDTH_BUCKET)
    wide = np.zeros((4, 16), "int32")
    wide[:, :7] = prompts
    for jit in (True, False):
        np.testing.assert_array_equal(_run(model, wide, jit_compile=jit)[GENERATED_IDS],
                                      _run(model, jit_compile=jit)[GENERATED_IDS])


def test_mixed_bfloat16_generation_runs():
    model = _model(dtype="mixed_bfloat16")
    out = _run(model)
    assert out[SCORES].dtype == np.float32 and np.isfinite(out[SCORES]).all()
    assert ((out[GENERATED_IDS] > 0) & (out[GENERATED_IDS] < VOCAB)).all()


def test_bad_lengths_and_settings_raise(model):
    with pytest.raises(ValueError, match=r"prompt of 7 tokens plus max_new_tokens=18 exceeds "
                                         r"the model's max_sequence_length=24"):
        _run(model, max_new_tokens=18)
    _run(model, max_new_tokens=17)  # 7 + 17 = 24 fits
    with pytest.raises(ValueError, match="max_new_tokens must be a Python int >= 1"):
        _run(model, max_new_tokens=0)
    with pytest.raises(ValueError, match="prompt_lengths must lie in"):
        _run(model, lengths=np.array([0, 5, 3, 7], "int32"), prompts=_prompts())
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        _run(model, temperature=1.0, top_p=1.5)
    with pytest.raises(ValueError, match="jit_compile=True needs use_cache=True"):
        _run(model, use_cache=False, jit_compile=True)
