"""No silent truncation, every family: as translate does (its cut_pairs,
tests/tasks/test_translate_truncation.py), an input cut to fit is counted in training and evaluation
(a Sum metric over the batches' CUT feature) and marked on its `predict` record
("truncated": true, from the signature's `truncated` output).

- classification / regression: `--long_texts=truncate` cuts a text (pair) to seq_length, and
  windows cut a pair's first text to leave room for the second's windows: `cut_texts`;
- tagging: `--long_texts=truncate` cuts a sentence (windows never do): `cut_sentences`;
- squad: a question longer than max_query_length is cut: `cut_questions`;
- causal_lm: `predict` keeps a long prompt's last pieces and marks it; `bert-train generate`
  refuses such a prompt instead (tests/bad_input_cases.py GENERATE_CASES, "generate prompt
  longer than the positions").
"""

import types

import numpy as np
import pytest
import tensorflow as tf
from causal_testing import build_causal_lm
from export_testing import TAGS, build_model, write_vocab

from bert_trainer.data import windows
from bert_trainer.data.tokenizer import Tokenizer
from bert_trainer.tasks import plugins
from bert_trainer.tasks.causal_lm.serving import CausalLMServing
from bert_trainer.tasks.classification import data as classification_data
from bert_trainer.tasks.classification.serving import ClassifierServing
from bert_trainer.tasks.classification.task import SentenceClassificationTask
from bert_trainer.tasks.regression.serving import RegressionServing
from bert_trainer.tasks.regression.task import RegressionTask
from bert_trainer.tasks.squad import data as squad_data
from bert_trainer.tasks.squad.serving import SquadServing
from bert_trainer.tasks.squad.task import QuestionAnsweringTask
from bert_trainer.tasks.tagging import data as tagging_data
from bert_trainer.tasks.tagging.serving import TaggerServing
from bert_trainer.tasks.tagging.task import TaggingTask

SEQ = 16
SHORT, LONG = "the cat sat on the mat", " ".join(["the cat sat on the mat ."] * 4)  # 28 pieces


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    return write_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt")


# -- classification and regression --------------------------------------------------------


def test_classification_rows_mark_the_texts_that_lost_pieces(vocab_file):
    tokenizer = Tokenizer(vocab_file)
    one = classification_data.text_features(
        tokenizer, {"text": tf.constant([SHORT, LONG])}, SEQ, with_cut=True)
    np.testing.assert_array_equal(one[classification_data.CUT], [0, 1])
    pair = classification_data.text_features(
        tokenizer, {"text": tf.constant([SHORT, SHORT]),
                    "text_b": tf.constant(["a dog", "a dog . " * 3])}, SEQ, with_cut=True)
    np.testing.assert_array_equal(pair[classification_data.CUT], [0, 1])  # 6 + 9 > 13
    assert classification_data.CUT not in classification_data.text_features(
        tokenizer, {"text": tf.constant([LONG])}, SEQ)  # serving_ids' callers see no extra key
    # Windows: one text is never cut; a pair whose both texts are long keeps half of its
    # first text in every window, marked on its first window only (a sum counts texts).
    rows = classification_data.window_features(
        tokenizer, {"text": tf.constant([LONG, SHORT, LONG]),
                    "text_b": tf.constant(["a dog", LONG, LONG])}, SEQ, with_cut=True)
    cut, example = rows[classification_data.CUT].numpy(), rows[windows.EXAMPLE_INDEX].numpy()
    assert cut[example == 0].tolist() == [1]  # long first text, short second: one window
    assert cut[example == 1].sum() == 0  # short first text: whole in every window
    assert cut[example == 2].tolist()[0] == 1 and cut[example == 2].sum() == 1
    assert (example == 2).sum() > 1
    single = classification_data.window_features(tokenizer, {"text": tf.constant([LONG])},
                                                 SEQ, with_cut=True)
    assert single[classification_data.CUT].numpy().sum() == 0


@pytest.mark.parametrize("task_class", [SentenceClassificationTask, RegressionTask])
def test_classification_and_regression_count_cut_texts(task_class):
    batch = {classification_data.CUT: tf.constant([0, 1, 1, 0]),
             "label_ids": tf.constant([0, 1, 0, 1])}
    outputs = {"logits": tf.zeros([4, 2])}
    task = types.SimpleNamespace(windowed=False)
    metrics = task_class.build_metrics(task, training=True)
    for _ in range(2):
        task_class.update_metrics(task, metrics, batch, outputs)
    assert {m.name: float(m.result()) for m in metrics}["cut_texts"] == 4.0
    eval_metrics = task_class.build_metrics(types.SimpleNamespace(windowed=True), training=False)
    assert "cut_texts" in [m.name for m in eval_metrics]


@pytest.mark.parametrize("long_texts", ["truncate", "windows"])
def test_classifier_predict_marks_a_cut_text(vocab_file, long_texts):
    module = ClassifierServing(build_model("classification"), label_names=["a", "b"],
                               pair=True, long_texts=long_texts, vocab_file=vocab_file,
                               lower_case=True, seq_length=SEQ)
    out = {k: v.numpy() for k, v in module.text_function()(
        text=tf.constant([SHORT, LONG, SHORT]),
        text_b=tf.constant(["a dog", LONG, LONG])).items()}
    # truncate cuts both long pairs; windows cut the second pair's first text only (the
    # third keeps its short first text whole and windows the long second one).
    expected = [False, True, True] if long_texts == "truncate" else [False, True, False]
    np.testing.assert_array_equal(out["truncated"], expected)
    family = plugins.get_family("classification")
    assert [family.format_answer(out, i).get("truncated") for i in range(3)] == [
        True if e else None for e in expected]
    older = {k: v for k, v in out.items() if k != "truncated"}  # an export made before
    assert "truncated" not in family.format_answer(older, 1)


def test_regression_predict_marks_a_cut_text(vocab_file):
    module = RegressionServing(build_model("regression"), long_texts="truncate",
                               vocab_file=vocab_file, lower_case=True, seq_length=SEQ)
    out = {k: v.numpy() for k, v in module.text_function()(text=tf.constant([SHORT, LONG]))
           .items()}
    np.testing.assert_array_equal(out["truncated"], [False, True])
    family = plugins.get_family("regression")
    assert family.format_answer(out, 1)["truncated"] is True
    assert "truncated" not in family.format_answer(out, 0)


# -- tagging ------------------------------------------------------------------------------


def test_tagging_truncation_is_marked_and_counted(vocab_file):
    tokenizer = Tokenizer(vocab_file)
    words = tf.ragged.constant([SHORT.split(), LONG.split()])
    tags = tf.ragged.constant([[0] * 6, [0] * 28])
    rows = tagging_data.tag_features(tokenizer, words, tags, SEQ, with_cut=True)
    np.testing.assert_array_equal(rows[tagging_data.CUT], [0, 1])
    task = types.SimpleNamespace()
    metrics = TaggingTask.build_metrics(task, training=False)
    for _ in range(2):
        TaggingTask.update_metrics(task, metrics, rows, {"logits": tf.zeros([2, SEQ, 3])})
    assert {m.name: float(m.result()) for m in metrics}["cut_sentences"] == 2.0


@pytest.mark.parametrize("long_texts", ["truncate", "windows"])
def test_tagger_predict_marks_a_cut_text_only_when_truncating(vocab_file, long_texts):
    module = TaggerServing(build_model("tagging", len(TAGS)), label_names=TAGS,
                           long_texts=long_texts, vocab_file=vocab_file, lower_case=True,
                           seq_length=SEQ)
    out = {k: v.numpy() for k, v in module.text_function()(text=tf.constant([SHORT, LONG]))
           .items()}
    np.testing.assert_array_equal(out["truncated"], [False, long_texts == "truncate"])
    answer = plugins.get_family("tagging").format_answer(out, 1)
    assert answer.get("truncated") is (True if long_texts == "truncate" else None)


# -- squad --------------------------------------------------------------------------------

QUESTION, LONG_QUESTION = "who sat ?", "who sat on the mat in the film ?"  # 3 and 9 pieces


def test_squad_questions_cut_to_max_query_length_are_counted(vocab_file):
    tokenizer = Tokenizer(vocab_file)
    context = " ".join(["the cat sat on the mat ."] * 3)
    examples = [squad_data.SquadExample(str(i), q, context, [], [])
                for i, q in enumerate([QUESTION, LONG_QUESTION])]
    features = list(squad_data.squad_windows(examples, tokenizer, seq_length=24, doc_stride=5,
                                             max_query_length=6, is_training=False))
    marks = [(f.example_index, squad_data._feature_dict(f, True)[squad_data.CUT])
             for f in features]
    assert len([m for m in marks if m[0] == 1]) > 1  # the long question has several windows
    assert [m for m in marks if m[1]] == [(1, 1)]  # counted once, on its first window
    batch = {squad_data.CUT: tf.constant([m[1] for m in marks]),
             "start_positions": tf.zeros([len(marks)], tf.int32),
             "end_positions": tf.zeros([len(marks)], tf.int32)}
    outputs = {"start_logits": tf.zeros([len(marks), 24]), "end_logits": tf.zeros([len(marks), 24])}
    task = types.SimpleNamespace()
    metrics = QuestionAnsweringTask.build_metrics(task, training=True)
    QuestionAnsweringTask.update_metrics(task, metrics, batch, outputs)
    assert {m.name: float(m.result()) for m in metrics}["cut_questions"] == 1.0


def test_squad_predict_marks_a_cut_question(vocab_file):
    module = SquadServing(build_model("squad"), vocab_file=vocab_file, lower_case=True,
                          seq_length=24, doc_stride=5, max_query_length=6)
    context = tf.constant(["the cat sat on the mat ."] * 2)
    out = {k: v.numpy() for k, v in module.text_function()(
        question=tf.constant([QUESTION, LONG_QUESTION]), context=context).items()}
    np.testing.assert_array_equal(out["truncated"], [False, True])
    family = plugins.get_family("squad")
    assert family.format_answer(out, 1)["truncated"] is True
    assert "truncated" not in family.format_answer(out, 0)


# -- causal_lm ----------------------------------------------------------------------------


def test_causal_predict_marks_a_prompt_that_lost_its_first_pieces(vocab_file):
    # 32 positions, 8 new pieces: a prompt keeps its last 23 pieces ([SEP] before them).
    module = CausalLMServing(build_causal_lm(), max_new_tokens=8, vocab_file=vocab_file,
                             lower_case=True, seq_length=32)
    prompts = tf.constant(["the cat sat", " ".join(["the cat"] * 12)])  # 3 and 24 pieces
    out = {k: v.numpy() for k, v in module.function("serving_default")(prompt=prompts).items()}
    np.testing.assert_array_equal(out["truncated"], [False, True])
    family = plugins.get_family("causal_lm")
    assert family.format_answer(out, 1)["truncated"] is True
    assert "truncated" not in family.format_answer(out, 0)
