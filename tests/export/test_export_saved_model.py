"""Export -> load in a process without bert_trainer -> the in-process model's answers.

One module fixture exports a classifier (text pairs), a tagger, a SQuAD model and a
pretraining encoder, then runs every request in one `python -I tests/serving_check.py`
subprocess (which blocks any bert_trainer import). Each test compares a family's results
with the original Keras model run in this process on the same inputs.
"""

import json
import os
import pathlib
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow as tf
from conftest import TESTS
from export_testing import (
    ENCODER,
    VOCAB,
    best_span_score,
    make_model_dir,
    outputs_numpy,
    save_checkpoint,
    scramble,
    write_vocab,
)

from bert_trainer import features, ops
from bert_trainer.checkpoints import model_dir
from bert_trainer.checkpoints.select import select_checkpoint
from bert_trainer.data.tokenizer import Tokenizer
from bert_trainer.encoders import BertEncoder
from bert_trainer.errors import UserError
from bert_trainer.export import build_serving_module, export_saved_model, predict
from bert_trainer.export.exporter import save
from bert_trainer.tasks.classification.data import text_features
from bert_trainer.tasks.squad import data as squad_data
from bert_trainer.tasks.squad.postprocess import postprocess_squad

SEQ = 32
TOL = 1e-5
SQUAD = {"doc_stride": 6, "max_query_length": 8, "max_answer_length": 10, "n_best": 10}
TEXTS = ["John Smith lives in Paris, France.", "Élève  à  New York 🙂", "", "the cat " * 30]
TEXTS_B = ["a good film", "very  bad", "nice", "x"]
SHORT = {"text": ["a good film", "nice", ""], "text_b": ["very  bad", "x", "the cat sat"]}
QUESTIONS = ["who lives in paris?", "where?", "what is the capital of france?"]
CONTEXTS = ["The cat sat on the mat. " * 5 + "John Smith lives in Paris, France. " * 2,
            "Élève  à  London,  the café is nice.", ""]


def _tokenizer(path) -> Tokenizer:
    return Tokenizer(str(path / "vocab.txt"))


def _ids(texts, model_path):
    tokenizer = _tokenizer(model_path)
    packed = text_features(tokenizer, {"text": tf.constant(texts)}, SEQ)
    return {k: v.numpy().tolist() for k, v in packed.items()}


def _pretraining_dir(path):
    encoder = BertEncoder(vocab_size=len(VOCAB), **ENCODER)
    scramble(encoder, seed=5)
    vocab = write_vocab(path.parent / "pretraining_vocab.txt")
    model_dir.write_pretrained(str(path), encoder=encoder, vocab_file=vocab,
                               task={"name": "pretraining", "family": "pretraining",
                                     "seq_length": SEQ})
    return path, encoder


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    made = {
        "classification": make_model_dir(root / "cls", "classification", pair=True, seed=1),
        "tagging": make_model_dir(root / "tag", "tagging", seed=2),
        "squad": make_model_dir(root / "qa", "squad", seed=3, task_extra={"squad": SQUAD}),
        "pretraining": _pretraining_dir(root / "pre"),
    }
    modules = {}
    for family, (path, _) in made.items():
        modules[family] = build_serving_module(str(path))  # Kept: the in-process reference.
        save(modules[family], str(root / f"{family}_export"))
    ids = _ids(TEXTS, made["classification"][0])
    text_inputs = {"classification": {"text": TEXTS, "text_b": TEXTS_B},
                   "tagging": {"text": TEXTS},
                   "squad": {"question": QUESTIONS, "context": CONTEXTS}}
    requests = [{"key": f"{family}/serving_default", "export": str(root / f"{family}_export"),
                 "signature": "serving_default", "inputs": inputs}
                for family, inputs in text_inputs.items()]
    requests.append({"key": "classification/short", "export": str(root / "classification_export"),
                     "signature": "serving_default", "inputs": SHORT})
    requests += [{"key": f"{family}/{sig}", "export": str(root / f"{family}_export"),
                  "signature": sig, "inputs": ids}
                 for family in made for sig in ("serving_ids", "encode")
                 if not (family == "pretraining" and sig == "serving_ids")]
    (root / "requests.json").write_text(json.dumps(requests), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run([sys.executable, "-I", str(TESTS / "serving_check.py"),
                           str(root / "requests.json"), str(root / "results.json")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((root / "results.json").read_text(encoding="utf-8"))
    return types.SimpleNamespace(root=root, made=made, ids=ids, results=results,
                                 modules=modules)


@pytest.mark.slow
def test_subprocess_never_imported_bert_trainer(exported):
    results = exported.results
    assert "bert_trainer" not in results["modules"]
    assert "tensorflow" in results["modules"] and "tensorflow_text" in results["modules"]
    signatures = {pathlib.Path(p).name: s for p, s in results["signatures"].items()}
    assert signatures == {
        "classification_export": ["encode", "serving_default", "serving_ids"],
        "tagging_export": ["encode", "serving_default", "serving_ids"],
        "squad_export": ["encode", "serving_default", "serving_ids"],
        "pretraining_export": ["encode"]}


@pytest.mark.slow
def test_predict_refuses_an_encoder_only_export(exported):
    with pytest.raises(UserError, match=r"has no serving_default signature \(only encode\): it "
                                        r"encodes token ids"):
        predict.load_predictor(saved_model=str(exported.root / "pretraining_export"))


def _encoder_outputs(encoder, ids):
    outputs = encoder({k: np.array(v, np.int32) for k, v in ids.items()}, training=False)
    return {k: outputs[k].numpy() for k in (features.SEQUENCE_OUTPUT, features.POOLED_OUTPUT)}


@pytest.mark.slow
@pytest.mark.parametrize("family", ["classification", "tagging", "squad", "pretraining"])
def test_ids_signatures_equal_the_keras_model(exported, family):
    made, ids, results = exported.made, exported.ids, exported.results
    model = made[family][1]
    encoder = getattr(model, "encoder", model)
    for name, expected in _encoder_outputs(encoder, ids).items():
        got = np.array(results[f"{family}/encode"][name])
        assert got.shape == expected.shape and np.abs(got - expected).max() <= TOL, name
    if family == "pretraining":
        return
    # A SavedModel is traced portable (TensorFlow's ops, no packing), so the reference is too:
    # on the CPU a tagger computes the real tokens only and its logits at the padding differ.
    with ops.portable():
        expected = outputs_numpy(model({k: np.array(v, np.int32) for k, v in ids.items()}))
    for name, value in expected.items():
        got = np.array(results[f"{family}/serving_ids"][name])
        assert got.shape == value.shape and np.abs(got - value).max() <= TOL, name


@pytest.mark.slow
def test_classification_answers_equal_the_keras_model(exported):
    results = exported.results
    path, model = exported.made["classification"]
    tokenizer = _tokenizer(path)
    inputs = text_features(tokenizer, {"text": tf.constant(TEXTS), "text_b": tf.constant(TEXTS_B)},
                           SEQ)
    probabilities = tf.nn.softmax(model(inputs)["logits"]).numpy()
    got = results["classification/serving_default"]
    assert np.abs(np.array(got["probabilities"]) - probabilities).max() <= TOL
    assert got["label_index"] == probabilities.argmax(-1).tolist()
    assert got["label_name"] == [["negative", "positive"][i] for i in got["label_index"]]
    assert np.ptp(probabilities[:, 0]) > 0.01  # the inputs are told apart


@pytest.mark.slow
def test_a_bare_tensorflow_process_pads_a_batch_to_its_longest_only(exported):
    got = exported.results["classification/short"]
    path, model = exported.made["classification"]
    inputs = text_features(_tokenizer(path), {k: tf.constant(v) for k, v in SHORT.items()}, SEQ)
    probabilities = tf.nn.softmax(model(inputs)["logits"]).numpy()  # padded to seq_length
    assert np.abs(np.array(got["probabilities"]) - probabilities).max() <= TOL
    real = inputs[features.INPUT_MASK].numpy().sum(axis=1)
    assert got["input_tokens"] == real.tolist() and max(real) < SEQ
    assert got["padding_tokens"] == (max(real) - real).tolist()  # not SEQ - real


@pytest.mark.slow
def test_tagging_answers_equal_the_in_process_module(exported):
    results = exported.results
    outputs = exported.modules["tagging"].text_function()(tf.constant(TEXTS))
    expected = {k: v.numpy().tolist() for k, v in outputs.items()}
    expected["entity_type"] = [[t.decode() for t in row] for row in expected["entity_type"]]
    expected["entity_text"] = [[t.decode() for t in row] for row in expected["entity_text"]]
    got = results["tagging/serving_default"]
    assert got == expected
    assert sum(got["num_entities"]) >= 2  # a real comparison, not of empty lists
    for i, text in enumerate(TEXTS):  # the text of an entity is its character span
        for j in range(got["num_entities"][i]):
            start, end = got["entity_start"][i][j], got["entity_end"][i][j]
            assert text[start:end] == got["entity_text"][i][j]


@pytest.mark.slow
def test_squad_answers_equal_postprocess_of_the_keras_model(exported):
    results = exported.results
    path, model = exported.made["squad"]
    tokenizer = _tokenizer(path)
    examples = [squad_data.SquadExample(str(i), q, c, [], [])
                for i, (q, c) in enumerate(zip(QUESTIONS, CONTEXTS, strict=True))]
    windows = list(squad_data.squad_windows(
        examples, tokenizer, seq_length=SEQ, doc_stride=SQUAD["doc_stride"],
        max_query_length=SQUAD["max_query_length"], is_training=False))
    assert len(windows) >= 6  # the long context spans several windows
    stacked = {k: np.stack([w.inputs[k] for w in windows]) for k in features.ENCODER_INPUTS}
    logits = outputs_numpy(model(stacked))
    start, end = logits["start_logits"], logits["end_logits"]
    options = {k: SQUAD[k] for k in ("n_best", "max_answer_length")}
    answers = postprocess_squad(examples, windows, start, end, **options)
    got = results["squad/serving_default"]
    assert got["answer"] == [answers[ex.id] for ex in examples]
    for i, context in enumerate(CONTEXTS):
        scores = [best_span_score(w, start[w.unique_id], end[w.unique_id], SQUAD["n_best"],
                                  SQUAD["max_answer_length"])
                  for w in windows if w.example_index == i]
        assert got["score"][i] == pytest.approx(max(scores), abs=TOL)
        if got["answer"][i]:
            assert context[got["start"][i]:got["end"][i]] == got["answer"][i]
    assert got["answer"][0] and got["answer"][2] == "" and got["start"][2] == -1


def test_checkpoint_choice_best_latest_and_prefix(tmp_path):
    path, model = make_model_dir(tmp_path / "m", "classification", seed=1)
    latest = select_checkpoint(str(path))
    kernel = model.classifier.weights[0]
    first = kernel.numpy()
    kernel.assign(first + 1.0)
    best = save_checkpoint(model, str(path / "best"), step=3)
    assert select_checkpoint(str(path), None) == best  # default: best/ when it holds one
    assert select_checkpoint(str(path), "latest") == latest
    assert select_checkpoint(str(path), latest) == latest
    step = latest.rsplit("-", 1)[1]  # a step: the export reads that checkpoint's weights
    for choice, value in ((None, first + 1.0), ("latest", first), ("3", first + 1.0),
                          (step, first)):
        module = build_serving_module(str(path), checkpoint=choice)
        np.testing.assert_array_equal(module.model.classifier.weights[0].numpy(), value)
    with pytest.raises(UserError, match=r"--checkpoint=best: .* holds no checkpoint"):
        select_checkpoint(str(make_model_dir(tmp_path / "n", "tagging")[0]), "best")


def test_export_errors_name_the_problem(tmp_path):
    path, _ = make_model_dir(tmp_path / "m", "tagging")
    info = json.loads((path / "bert_train.json").read_text())
    info["task"]["label_names"] = ["O", "B-X", "I-X"]  # 3 tags; the checkpoint has 5
    (path / "bert_train.json").write_text(json.dumps(info))
    with pytest.raises(UserError, match=r"checkpoint .*ckpt-7 does not fit the task model"):
        build_serving_module(str(path))
    info["task"]["family"] = "translation"
    (path / "bert_train.json").write_text(json.dumps(info))
    with pytest.raises(UserError, match=r"task family 'translation' cannot be exported"):
        build_serving_module(str(path))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(UserError, match=r"--output=.*out exists and is not empty"):
        export_saved_model(str(make_model_dir(tmp_path / "c", "classification")[0]), str(out))
    assert (out / "keep.txt").read_text() == "x"
