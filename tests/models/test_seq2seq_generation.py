"""translate(): cached decoding equals uncached decoding and a loop over the teacher-forcing
call, on small fake models that obey the sequence-to-sequence API and on a tiny
Seq2SeqTransformer."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from bert_trainer import features
from bert_trainer.encoders import BertEncoder
from bert_trainer.models import Seq2SeqTransformer
from bert_trainer.models.generation import seq2seq as seq2seq_generation

VOCAB, HIDDEN, START, END = 9, 8, 1, 2


class FakeSeq2Seq:
    """Logits from the mean embedding of every target token so far, its position and the
    masked mean of the encoder output: any history or masking mistake changes them."""

    vocab_size = VOCAB
    max_target_length = 8

    def __init__(self, seed=0):
        rng = np.random.default_rng(seed)
        self.embed = tf.constant(rng.normal(size=(VOCAB, HIDDEN)), tf.float32)
        self.out = tf.constant(rng.normal(size=(HIDDEN, VOCAB)) * 3, tf.float32)
        self.position = tf.constant(rng.normal(size=(HIDDEN,)), tf.float32)
        # Never pad or start; the end token often enough that rows end at different steps.
        self.bias = tf.constant([-30.0, -30.0, 0.5] + [0.0] * (VOCAB - 3))
        self.step_encoder_outputs = []  # what decode_step received, per trace

    def encode(self, inputs, training=None):
        ids, mask = inputs[features.INPUT_WORD_IDS], inputs[features.INPUT_MASK]
        return tf.gather(self.embed, ids) * 1.5, mask

    def _pooled(self, encoder_output, encoder_mask):
        mask = tf.cast(encoder_mask, tf.float32)[..., None]
        return tf.reduce_sum(encoder_output * mask, -2) / tf.reduce_sum(mask, -2)

    def _logits(self, summed, count, pooled):
        count = tf.cast(count, tf.float32)
        return tf.tanh(summed / count + pooled + self.position * count / 4) @ self.out + self.bias

    def init_cache(self, batch_size, max_length):
        return {"sum": tf.zeros([batch_size, HIDDEN])}

    def decode_step(self, token_ids, index, cache, encoder_output, encoder_mask):
        self.step_encoder_outputs.append(encoder_output)
        return self._step(token_ids, index, cache, encoder_output, encoder_mask)

    def _step(self, token_ids, index, cache, encoder_output, encoder_mask):
        summed = cache["sum"] + tf.gather(self.embed, token_ids)
        return (self._logits(summed, index + 1, self._pooled(encoder_output, encoder_mask)),
                {"sum": summed})

    def __call__(self, inputs, training=None):
        """Teacher forcing: {"logits": [b, t, vocab]}."""
        encoder_output, encoder_mask = self.encode(inputs)
        return {features.LOGITS: self._decode(inputs[features.DECODER_INPUT_IDS],
                                              encoder_output, encoder_mask)}

    def _decode(self, decoder_input_ids, encoder_output, encoder_mask):
        summed = tf.cumsum(tf.gather(self.embed, decoder_input_ids), axis=1)
        count = tf.range(1, tf.shape(decoder_input_ids)[1] + 1)[None, :, None]
        return self._logits(summed, count, self._pooled(encoder_output, encoder_mask)[:, None])


class FakeWithDecode(FakeSeq2Seq):
    """Has the decoder-only pass the uncached path prefers over re-encoding, with its output
    projection apart (`decode(project=False)`, `logits`) and a `decoding_table` that the loops
    make once and hand to every projection."""

    def __init__(self, seed=0):
        super().__init__(seed)
        self.tables_made = 0
        self.projected_with = []  # the output_table of each traced projection

    def decoding_table(self):
        self.tables_made += 1
        return tf.identity(self.out)  # [hidden, vocab], as the real model's

    def _logits(self, summed, count, pooled):
        return self.logits(self._hidden(summed, count, pooled))

    def _hidden(self, summed, count, pooled):
        count = tf.cast(count, tf.float32)
        return tf.tanh(summed / count + pooled + self.position * count / 4)

    def logits(self, hidden, output_table=None):
        self.projected_with.append(output_table)
        return hidden @ (self.out if output_table is None else output_table) + self.bias

    def decode_step(self, token_ids, index, cache, encoder_output, encoder_mask,
                    output_table=None):
        summed = cache["sum"] + tf.gather(self.embed, token_ids)
        hidden = self._hidden(summed, index + 1, self._pooled(encoder_output, encoder_mask))
        return self.logits(hidden, output_table), {"sum": summed}

    def decode(self, decoder_input_ids, encoder_output, encoder_mask, project=True):
        summed = tf.cumsum(tf.gather(self.embed, decoder_input_ids), axis=1)
        count = tf.range(1, tf.shape(decoder_input_ids)[1] + 1)[None, :, None]
        pooled = self._pooled(encoder_output, encoder_mask)[:, None]
        hidden = self._hidden(summed, count, pooled)
        return self.logits(hidden) if project else hidden


class FakeProjected(FakeSeq2Seq):
    """Keeps what the steps need of the encoder output in its cache (as cross-attention
    keys and values are), so decode_step gets no encoder output."""

    def init_cache(self, batch_size, max_length, encoder_output=None):
        cache = super().init_cache(batch_size, max_length)
        cache["encoder_output"] = encoder_output
        return cache

    def decode_step(self, token_ids, index, cache, encoder_output, encoder_mask):
        self.step_encoder_outputs.append(encoder_output)
        logits, new = self._step(token_ids, index, {"sum": cache["sum"]},
                                          cache["encoder_output"], encoder_mask)
        return logits, {**new, "encoder_output": cache["encoder_output"]}


def _sources(seed=3, batch=4, length=6, vocab=VOCAB):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab, size=(batch, length)).astype(np.int32)
    lengths = rng.integers(2, length + 1, size=batch)
    mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
    return {features.INPUT_WORD_IDS: tf.constant(ids * mask), features.INPUT_MASK:
            tf.constant(mask), features.INPUT_TYPE_IDS: tf.zeros_like(mask)}


def _translate(model, inputs, **kwargs):
    kwargs = {"beam_size": 4, "length_penalty": 0.6, "max_decode_length": 7,
              "start_id": START, "end_id": END, **kwargs}
    out = seq2seq_generation.translate(model, inputs, **kwargs)
    return out[features.DECODED_IDS].numpy(), out[features.DECODED_SCORES].numpy()


def greedy_by_teacher_forcing(model, inputs, max_decode_length, margins=None):
    """Greedy decoding by calling the model on the growing prefix, no cache: the reference.
    `margins` (a list) gets, per step, the smallest gap between a live row's best and
    second-best log-probability: how far float32 noise must move a logit to flip a token."""
    batch = inputs[features.INPUT_WORD_IDS].shape[0]
    prefix = np.full((batch, 1), START, np.int32)
    ids = np.zeros((batch, max_decode_length), np.int32)
    scores, done = np.zeros(batch), np.zeros(batch, bool)
    for t in range(max_decode_length):
        logits = model({**inputs, features.DECODER_INPUT_IDS: tf.constant(prefix)},
                       training=False)[features.LOGITS][:, -1]
        log_probs = tf.nn.log_softmax(logits).numpy()
        if margins is not None and not done.all():
            top2 = np.sort(log_probs[~done], axis=-1)[:, -2:]
            margins.append(float((top2[:, 1] - top2[:, 0]).min()))
        token = np.where(done, 0, log_probs.argmax(-1))
        scores += np.where(done, 0.0, log_probs.max(-1))
        ids[:, t] = token
        done |= token == END
        prefix = np.concatenate([prefix, token[:, None].astype(np.int32)], 1)
    return ids, scores


@pytest.mark.parametrize("seed", [0, 4, 7])
def test_greedy_translation_equals_the_teacher_forcing_loop(seed):
    model, inputs = FakeSeq2Seq(seed), _sources(seed)
    expected_ids, expected_scores = greedy_by_teacher_forcing(model, inputs, 7)
    ids, scores = _translate(model, inputs, beam_size=1, length_penalty=0.0)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-5)
    assert (ids == END).any(), "the test must see rows end early"


@pytest.mark.parametrize("beam_size", [1, 4])
@pytest.mark.parametrize("model_class", [FakeSeq2Seq, FakeWithDecode])
def test_cached_equals_uncached(model_class, beam_size):
    model, inputs = model_class(4), _sources(4)
    ids, scores = _translate(model, inputs, beam_size=beam_size)
    uncached_ids, uncached_scores = _translate(model, inputs, beam_size=beam_size,
                                               use_cache=False)
    np.testing.assert_array_equal(ids, uncached_ids)
    np.testing.assert_allclose(scores, uncached_scores, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("use_cache", [True, False])
def test_the_output_table_is_made_once_and_given_to_every_step(use_cache):
    model, inputs = FakeWithDecode(5), _sources(5)
    ids, scores = _translate(model, inputs, beam_size=3, use_cache=use_cache)
    assert model.tables_made == 1
    assert model.projected_with and all(t is not None for t in model.projected_with)
    # The same search as the plain projection's (FakeSeq2Seq: the same weights, no table).
    plain_ids, plain_scores = _translate(FakeSeq2Seq(5), inputs, beam_size=3)
    np.testing.assert_array_equal(ids, plain_ids)
    np.testing.assert_allclose(scores, plain_scores, rtol=1e-5, atol=1e-6)


def test_the_encoder_output_stays_out_of_the_beams_when_the_cache_holds_it():
    plain, projected = FakeSeq2Seq(6), FakeProjected(6)
    inputs = _sources(6)
    for beam_size in (1, 3):
        np.testing.assert_array_equal(_translate(plain, inputs, beam_size=beam_size)[0],
                                      _translate(projected, inputs, beam_size=beam_size)[0])
    assert projected.step_encoder_outputs and all(
        output is None for output in projected.step_encoder_outputs)


def test_translate_in_a_tf_function_with_unknown_shapes():
    model, inputs = FakeSeq2Seq(7), _sources(7)
    spec = {name: tf.TensorSpec([None, None], tf.int32) for name in inputs}
    graph = tf.function(lambda x: seq2seq_generation.translate(
        model, x, beam_size=3, max_decode_length=6, start_id=START, end_id=END),
        input_signature=[spec])
    out = graph(inputs)
    assert out[features.DECODED_IDS].dtype == tf.int32 and out[features.DECODED_IDS].shape == (4, 6)
    assert out[features.DECODED_SCORES].dtype == tf.float32
    ids, scores = _translate(model, inputs, beam_size=3, max_decode_length=6)
    np.testing.assert_array_equal(out[features.DECODED_IDS], ids)
    np.testing.assert_allclose(out[features.DECODED_SCORES], scores, rtol=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    ({"max_decode_length": 9}, "max_target_length=8"), ({"beam_size": 0}, "beam_size"),
    ({"use_cache": False, "jit_compile": True}, "needs use_cache=True")])
def test_bad_settings_name_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _translate(FakeSeq2Seq(), _sources(), **kwargs)


REAL_VOCAB = 40
BIAS_SCALE, STDDEV = 0.5, 0.3


def _tiny_transformer(position_encoding="learned"):
    """A real Seq2SeqTransformer, 2 layers of 32; weights wide enough (stddev 0.3) that the
    next-token distributions are peaked and float32 noise flips no argmax."""
    encoder = BertEncoder(vocab_size=REAL_VOCAB, hidden_size=32, num_layers=2,
                          num_attention_heads=4, inner_dim=64, max_sequence_length=16,
                          type_vocab_size=2, output_dropout=0.0, attention_dropout=0.0,
                          initializer=keras.initializers.TruncatedNormal(stddev=STDDEV, seed=1))
    model = Seq2SeqTransformer(encoder, position_encoding=position_encoding,
                               max_target_length=10)
    # Pad and start never come out; a random bias per word against the tied table's pull to
    # repeat the last token (random decoders still repeat a lot).
    bias = np.random.default_rng(2).normal(size=REAL_VOCAB) * BIAS_SCALE
    bias[[0, 1, END]] = [-30.0, -30.0, -1.0]
    model.output_bias.assign(bias)
    return model


@pytest.fixture(scope="module")
def transformer():
    """One `_tiny_transformer()` for the tests that only decode with it: its compiled loops
    (one per settings, kept per model) are made once for them all, not once per test."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(1234)
    return _tiny_transformer()


@pytest.mark.parametrize("position_encoding", ["learned", "sinusoidal"])
def test_real_model_greedy_translation_equals_the_teacher_forcing_loop(position_encoding,
                                                                       request):
    model = (request.getfixturevalue("transformer") if position_encoding == "learned"
             else _tiny_transformer(position_encoding))
    inputs = _sources(8, vocab=REAL_VOCAB)
    margins = []
    expected_ids, expected_scores = greedy_by_teacher_forcing(model, inputs, 9, margins)
    # Exact token equality is defensible only away from ties: every choice on the path wins
    # by far more than float32 noise (~1e-6 here, on any CPU, fused kernels or not).
    assert min(margins) > 1e-3, f"a near-tie ({min(margins):.2g}): pick other test weights"
    ids, scores = _translate(model, inputs, beam_size=1, length_penalty=0.0,
                             max_decode_length=9)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_real_model_cached_equals_uncached(beam_size, transformer):
    model, inputs = transformer, _sources(8, vocab=REAL_VOCAB)
    ids, scores = _translate(model, inputs, beam_size=beam_size, max_decode_length=10)
    uncached_ids, uncached_scores = _translate(model, inputs, beam_size=beam_size,
                                               max_decode_length=10, use_cache=False)
    np.testing.assert_array_equal(ids, uncached_ids)
    np.testing.assert_allclose(scores, uncached_scores, rtol=1e-4, atol=1e-4)
    assert (ids != ids[:, :1]).any(), "the test must see more than one token repeated"
    if beam_size == 4:
        assert (ids == END).any(), "the test must see a row end early"


def test_real_model_translation_in_a_tf_function(transformer):
    model, inputs = transformer, _sources(8, vocab=REAL_VOCAB)
    spec = {name: tf.TensorSpec([None, None], tf.int32) for name in inputs}
    graph = tf.function(lambda x: seq2seq_generation.translate(
        model, x, beam_size=4, max_decode_length=10, start_id=START, end_id=END),
        input_signature=[spec])
    out = graph(inputs)
    ids, scores = _translate(model, inputs, beam_size=4, max_decode_length=10)
    np.testing.assert_array_equal(out[features.DECODED_IDS], ids)
    np.testing.assert_allclose(out[features.DECODED_SCORES], scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_real_model_xla_compiled_translation_equals_the_uncompiled_one(beam_size, transformer):
    model, inputs = transformer, _sources(8, vocab=REAL_VOCAB)
    spec = {name: tf.TensorSpec([None, None], tf.int32) for name in inputs}
    graph = tf.function(lambda x: seq2seq_generation.translate(
        model, x, beam_size=beam_size, max_decode_length=10, start_id=START, end_id=END,
        jit_compile=True), input_signature=[spec])
    out = graph(inputs)
    ids, scores = _translate(model, inputs, beam_size=beam_size, max_decode_length=10,
                             jit_compile=False)
    np.testing.assert_array_equal(out[features.DECODED_IDS], ids)
    np.testing.assert_allclose(out[features.DECODED_SCORES], scores, rtol=1e-4, atol=1e-4)
    assert (ids != ids[:, :1]).any(), "the test must see more than one token repeated"
    # Another batch size (3 of the 4 rows): XLA compiles the new shape, same results as
    # uncompiled.
    part = {name: value[:3] for name, value in inputs.items()}
    assert int(tf.shape(part[features.INPUT_WORD_IDS])[0]) == 3 < len(ids)
    np.testing.assert_array_equal(graph(part)[features.DECODED_IDS], ids[:3])


@pytest.mark.parametrize("beam_size", [1, 4])
def test_one_source_row_decodes_in_the_compiled_loop(beam_size, transformer):
    # Static shapes of one row: the beams' gathered cache must keep them through the loop.
    model = transformer
    one = {name: np.asarray(value)[:1] for name, value in _sources(8, vocab=REAL_VOCAB).items()}
    ids, scores = _translate(model, one, beam_size=beam_size, max_decode_length=10)
    plain_ids, plain_scores = _translate(model, one, beam_size=beam_size, max_decode_length=10,
                                         jit_compile=False)
    assert ids.shape == (1, 10)
    np.testing.assert_array_equal(ids, plain_ids)
    np.testing.assert_allclose(scores, plain_scores, rtol=1e-4, atol=1e-4)


def test_the_default_is_the_compiled_loop_kept_per_model_and_settings():
    from bert_trainer.models.generation import compiled_loops  # noqa: PLC0415

    # Greedy (the cheapest loop to compile); beam search's compiled loop is checked against
    # the graph's in test_real_model_xla_compiled_translation_equals_the_uncompiled_one.
    model, inputs = _tiny_transformer(), _sources(8, vocab=REAL_VOCAB)  # sources 6 wide
    plain = _translate(model, inputs, max_decode_length=10, beam_size=1, jit_compile=False)
    assert model not in compiled_loops._COMPILED  # noqa: SLF001
    for _ in range(2):  # eager calls: the second reuses the first's loop
        ids, scores = _translate(model, inputs, max_decode_length=10, beam_size=1)
        np.testing.assert_array_equal(ids, plain[0])
        np.testing.assert_allclose(scores, plain[1], rtol=1e-4, atol=1e-4)
        assert len(compiled_loops._COMPILED[model]) == 1  # noqa: SLF001
    # The sources were padded to 8 columns (SOURCE_BUCKET); padding is masked out, so
    # sources given 13 wide (padded to the encoder's 16 positions) decode the same.
    assert seq2seq_generation.SOURCE_BUCKET == 8
    wide = {name: np.pad(np.asarray(value), [[0, 0], [0, 7]]) for name, value in inputs.items()}
    np.testing.assert_array_equal(
        _translate(model, wide, max_decode_length=10, beam_size=1)[0], plain[0])
    _translate(model, inputs, max_decode_length=10, beam_size=2)  # other settings: a new loop
    assert len(compiled_loops._COMPILED[model]) == 2  # noqa: SLF001
    padded = compiled_loops.bucket_width(tf.constant(inputs[features.INPUT_WORD_IDS]), 16, 8)
    assert padded.shape == (4, 8)


@pytest.mark.slow  # saving and loading decoding loops: ~60 s on 2 busy cores
def test_real_model_translation_in_a_saved_model(tmp_path):
    model, inputs = _tiny_transformer(), _sources(8, vocab=REAL_VOCAB)
    module = tf.Module()
    module.model = model  # tracks the weights
    spec = {name: tf.TensorSpec([None, None], tf.int32) for name in inputs}
    for name, jit_compile in (("translate", False), ("translate_xla", True)):
        setattr(module, name, tf.function(
            lambda x, jit_compile=jit_compile: seq2seq_generation.translate(
                module.model, x, beam_size=2, max_decode_length=6, start_id=START,
                end_id=END, jit_compile=jit_compile), input_signature=[spec]))
    expected = module.translate(inputs)
    tf.saved_model.save(module, str(tmp_path / "saved"))
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    for out in (loaded.translate(inputs), loaded.translate_xla(inputs)):
        np.testing.assert_array_equal(out[features.DECODED_IDS], expected[features.DECODED_IDS])
        np.testing.assert_allclose(out[features.DECODED_SCORES],
                                   expected[features.DECODED_SCORES], rtol=1e-4, atol=1e-4)
