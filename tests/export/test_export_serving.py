"""The in-graph serving logic against the training-side code it must agree with.

SQuAD windows and span selection are compared with `squad_data.squad_windows` /
`postprocess_squad`; tagging entities with `metrics.tagging.get_entities`; character spans on
accented, emoji and multiply-spaced text with a lookup "model" whose tags we choose.
"""

import numpy as np
import pytest
import tensorflow as tf
from export_testing import TAGS, VOCAB, best_span_score, build_model, write_vocab
from numerics import assert_close

from bert_trainer import features, serving
from bert_trainer.errors import UserError
from bert_trainer.features import END_LOGITS, LOGITS, START_LOGITS
from bert_trainer.metrics.tagging import get_entities
from bert_trainer.serving import byte_to_char
from bert_trainer.tasks.classification import serving as classifier_serving
from bert_trainer.tasks.classification.data import text_features
from bert_trainer.tasks.classification.serving import ClassifierServing
from bert_trainer.tasks.regression.serving import RegressionServing
from bert_trainer.tasks.squad import data as squad_data
from bert_trainer.tasks.squad import serving as squad_serving
from bert_trainer.tasks.squad.postprocess import postprocess_squad
from bert_trainer.tasks.squad.serving import SquadServing
from bert_trainer.tasks.tagging import serving as tagging_serving
from bert_trainer.tasks.tagging.serving import TaggerServing

LONG_CONTEXT = ("The cat sat on the mat. " * 4 + "John Smith lives in Paris, France. "
                + "The dog sat on the mat. " * 4)
QUESTIONS = ["who lives in paris?", "where does the very very very good cat live?", "what?", ""]
CONTEXTS = [LONG_CONTEXT, "Élève  à  Paris,  the café 🙂 is nice.", "", "a b c d e f g h i j k"]


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    return write_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt")


def squad_module(vocab_file, **options):
    return SquadServing(build_model("squad"), vocab_file=vocab_file, lower_case=True,
                        seq_length=24, doc_stride=5, max_query_length=6, **options)


def lookup_logits(table: dict[str, int], num_classes: int, on: float = 6.0):
    """A stand-in model: logits from each token alone (`table`: token -> class, else 0)."""
    classes = np.zeros(len(VOCAB), np.int32)
    for token, label in table.items():
        classes[VOCAB.index(token)] = label
    lookup = tf.constant(classes)

    def run(inputs):
        ids = inputs[features.INPUT_WORD_IDS]
        return tf.one_hot(tf.gather(lookup, ids), num_classes) * on  # (b, seq, classes)
    return run


def test_byte_to_char_counts_code_points():
    texts = ["abc", "Café au lait", "日本語 text", "emoji 🙂 ok", ""]
    offsets = tf.ragged.constant(
        [[len(t[:i].encode("utf-8")) for i in range(len(t) + 1)] for t in texts], tf.int64)
    chars = byte_to_char(tf.constant(texts), offsets)
    assert chars.to_list() == [list(range(len(t) + 1)) for t in texts]
    empty = byte_to_char(tf.constant([], tf.string), tf.ragged.constant([], tf.int64, 1))
    assert empty.shape[0] == 0  # an empty batch is not an error


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_squad_windows_equal_the_training_windows(vocab_file):
    module = squad_module(vocab_file)
    examples = [squad_data.SquadExample(str(i), q, c, [], [])
                for i, (q, c) in enumerate(zip(QUESTIONS, CONTEXTS, strict=True))]
    expected = list(squad_data.squad_windows(examples, module.tokenizer, seq_length=24,
                                             doc_stride=5, max_query_length=6,
                                             is_training=False))
    got = {k: v.numpy() for k, v in module.windows(tf.constant(QUESTIONS),
                                                   tf.constant(CONTEXTS)).items()}
    assert len(expected) == len(got[squad_serving.EXAMPLE_INDEX]) > 8  # the long one: many
    np.testing.assert_array_equal(got[squad_serving.EXAMPLE_INDEX],
                                  [w.example_index for w in expected])
    for name in features.ENCODER_INPUTS:
        np.testing.assert_array_equal(got[name], [w.inputs[name] for w in expected], name)
    np.testing.assert_array_equal(got[squad_serving.CHAR_START],
                                  [w.char_spans[:, 0] for w in expected])
    np.testing.assert_array_equal(got[squad_serving.CHAR_END],
                                  [w.char_spans[:, 1] for w in expected])
    np.testing.assert_array_equal(got[squad_serving.IS_MAX_CONTEXT],
                                  [w.is_max_context for w in expected])


@pytest.mark.slow  # over a few seconds: left out of make test-fast
@pytest.mark.parametrize("version_2", [False, True])
def test_squad_selection_equals_postprocess_on_random_logits(vocab_file, version_2):
    module = squad_module(vocab_file, n_best=5, max_answer_length=4, version_2=version_2,
                          null_threshold=0.5)
    examples = [squad_data.SquadExample(str(i), q, c, [], [])
                for i, (q, c) in enumerate(zip(QUESTIONS, CONTEXTS, strict=True))]
    windows = list(squad_data.squad_windows(examples, module.tokenizer, seq_length=24,
                                            doc_stride=5, max_query_length=6,
                                            is_training=False))
    graph_windows = module.windows(tf.constant(QUESTIONS), tf.constant(CONTEXTS))
    rng = np.random.default_rng(3)
    answered = 0
    for _ in range(5):
        start, end = rng.normal(size=(2, len(windows), 24)).astype(np.float32)
        expected = postprocess_squad(examples, windows, start, end, n_best=5,
                                                max_answer_length=4, version_2=version_2,
                                                null_threshold=0.5)
        got = {k: v.numpy() for k, v in module.select(graph_windows, start, end,
                                                      tf.constant(CONTEXTS)).items()}
        for i, (example, context) in enumerate(zip(examples, CONTEXTS, strict=True)):
            answer = got[squad_serving.ANSWER][i].decode("utf-8")
            assert answer == expected[example.id], (i, answer, expected[example.id])
            lo, hi = got[squad_serving.START][i], got[squad_serving.END][i]
            assert (context[lo:hi] == answer) if answer else (lo, hi) == (-1, -1)
            if answer:
                answered += 1
                best = max(best_span_score(w, start[w.unique_id], end[w.unique_id], 5, 4)
                           for w in windows if w.example_index == i)
                assert got[serving.SCORE][i] == pytest.approx(best, abs=1e-5)
    assert answered >= 5  # the comparison covered real answers, not only empty ones


def test_squad_answer_comes_from_the_window_that_holds_it(vocab_file):
    module = squad_module(vocab_file)
    # Start on "paris", end on "france"; every other token scores 0.
    start = lookup_logits({"paris": 1}, 2)
    end = lookup_logits({"france": 1}, 2)
    module._run_model = lambda inputs: {START_LOGITS: start(inputs)[:, :, 1],
                                        END_LOGITS: end(inputs)[:, :, 1]}
    questions = tf.constant(["where does john live?", "who?"])
    contexts = tf.constant([LONG_CONTEXT, ""])
    windows = module.windows(questions, contexts)
    outputs = module._answer(questions, contexts)  # Eager: cheaper than tracing, same ops.
    out = {k: v.numpy() for k, v in outputs.items()}
    assert int(np.sum(windows[squad_serving.EXAMPLE_INDEX].numpy() == 0)) >= 5
    begin = LONG_CONTEXT.index("Paris")
    assert begin > 24  # far beyond what the first window holds
    assert out[squad_serving.ANSWER][0].decode() == "Paris, France"
    assert (out[squad_serving.START][0], out[squad_serving.END][0]) == (begin, begin + 13)
    assert out[serving.SCORE][0] == pytest.approx(12.0)
    # An empty context has no valid span: no answer, offsets -1, score -inf.
    assert out[squad_serving.ANSWER][1] == b""
    assert (out[squad_serving.START][1], out[squad_serving.END][1]) == (-1, -1)
    assert out[serving.SCORE][1] == -np.inf


def test_entities_equal_conlleval_reading_of_random_tags():
    _, type_of, is_begin = tagging_serving.tag_scheme(TAGS)
    rng = np.random.default_rng(0)
    rows = [list(rng.integers(0, len(TAGS), size=rng.integers(0, 12))) for _ in range(200)]
    flat = np.array([t for row in rows for t in row], np.int32)
    row_ids = np.array([r for r, row in enumerate(rows) for _ in row], np.int64)
    first, last, kind = (x.numpy() for x in tagging_serving.find_entities(
        tf.constant(flat), tf.constant(row_ids), type_of, is_begin))
    starts = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    types = ("",) + tuple(sorted({t[2:] for t in TAGS if t != "O"}))
    got = [[] for _ in rows]
    for f, la, k in zip(first, last, kind, strict=True):
        row = row_ids[f]
        got[row].append((types[k], int(f - starts[row]), int(la - starts[row] + 1)))
    expected = [get_entities([TAGS[t] for t in row], scheme="IOB2") for row in rows]
    assert got == expected
    assert sum(map(len, expected)) > 100


def test_tag_scheme_rejects_non_iob2_tags():
    with pytest.raises(UserError, match=r"tag 'E-PER' in task.label_names is not IOB2"):
        tagging_serving.tag_scheme(["O", "B-PER", "E-PER"])


@pytest.mark.slow  # over a few seconds: left out of make test-fast
@pytest.mark.parametrize("long_texts", ["windows", "truncate"])
def test_tagger_character_spans_with_accents_emoji_and_spaces(vocab_file, long_texts):
    module = TaggerServing(build_model("tagging", len(TAGS)), label_names=TAGS,
                           vocab_file=vocab_file, lower_case=True, seq_length=24,
                           long_texts=long_texts)
    tag = {name: i for i, name in enumerate(TAGS)}
    module._run_model = lambda inputs: {LOGITS: lookup_logits(
        {"john": tag["B-PER"], "eleve": tag["B-PER"], "smith": tag["I-PER"],
         "new": tag["B-LOC"], "york": tag["I-LOC"], "paris": tag["B-LOC"]}, len(TAGS))(inputs)}
    texts = ["Élève  Smiths went to  New   York, then Paris.", "🙂 John and the cat", "",
             "the mat " * 12 + "Paris", "Smith"]
    out = {k: v.numpy() for k, v in module.text_function()(tf.constant(texts)).items()}
    got = [[(out["entity_type"][i, j].decode(), out["entity_text"][i, j].decode(),
             int(out["entity_start"][i, j]), int(out["entity_end"][i, j]))
            for j in range(out["num_entities"][i])] for i in range(len(texts))]
    first = texts[0]
    assert got[0] == [("PER", "Élève  Smiths", 0, 13),
                      ("LOC", "New   York", first.index("New"), first.index(",")),
                      ("LOC", "Paris", first.index("Paris"), first.index("Paris") + 5)]
    assert got[1] == [("PER", "John", 2, 6)]  # the emoji is one character (four bytes)
    assert got[2] == []
    # "Paris" is past seq_length - 2 pieces: a later window tags it, truncation does not.
    paris = texts[3].index("Paris")
    assert got[3] == ([("LOC", "Paris", paris, paris + 5)] if long_texts == "windows" else [])
    assert got[4] == [("PER", "Smith", 0, 5)]  # I- with nothing open starts an entity
    assert out["entity_start"].shape == (5, 3) and out["entity_start"][1, 1] == -1
    assert out["entity_type"][1, 2] == b""


@pytest.mark.slow  # over a few seconds: left out of make test-fast
@pytest.mark.parametrize("regression", [False, True])
def test_classifier_serving_packs_pairs_as_fine_tuning_does(vocab_file, regression):
    model = build_model("regression" if regression else "classification", 3)
    serving_class = RegressionServing if regression else ClassifierServing
    module = serving_class(model, label_names=None if regression else ["a", "b", "c"],
                           pair=True, vocab_file=vocab_file, lower_case=True, seq_length=16)
    batch = {"text": ["The cat sat on the mat.", "Café"], "text_b": ["a dog", "very " * 20]}
    logits = model(text_features(module.tokenizer, batch, 16))[LOGITS].numpy()
    out = {k: v.numpy() for k, v in module.text_function()(**batch).items()}
    if regression:
        assert_close(out[serving.SCORE], logits[:, 0])  # a traced call vs an eager one
        return
    assert_close(out[classifier_serving.PROBABILITIES], tf.nn.softmax(logits))
    # The label is the served probabilities' own argmax (exact); the probabilities match
    # the eager logits to a tolerance, so a near-tie may not flip the check on another CPU.
    np.testing.assert_array_equal(out[classifier_serving.LABEL_INDEX],
                                  out[classifier_serving.PROBABILITIES].argmax(-1))
    names = [n.decode() for n in out[classifier_serving.LABEL_NAME]]
    assert names == ["abc"[i] for i in logits.argmax(-1)]


def test_seq_length_beyond_the_encoder_is_refused(vocab_file):
    with pytest.raises(UserError, match=r"seq_length=65 must be in \[3, 64\]"):
        ClassifierServing(build_model("classification"), label_names=["x", "y"],
                          vocab_file=vocab_file, lower_case=True, seq_length=65)
