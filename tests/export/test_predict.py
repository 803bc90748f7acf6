"""`bert-train predict` (and `export` as a user runs it): readers, batching, errors, the CLI.

The CLI tests use a tiny classifier trained here for a few seconds on sentiment words, so
the answers can be checked for being right, not only for being there.
"""

import contextlib
import io
import json
import os
import shutil
import subprocess

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf
from export_testing import VOCAB, build_model, make_model_dir, write_vocab

from bert_trainer.data.tokenizer import Tokenizer
from bert_trainer.errors import EXIT_USER_ERROR, UserError
from bert_trainer.export import predict
from bert_trainer.tasks.classification.data import text_features

POSITIVE, NEGATIVE = ("good", "great", "nice", "fine"), ("bad", "awful", "poor", "terrible")
TEMPLATES = ("the {} film", "a very {} movie", "it was {}", "this movie was {} .",
             "that was a {} film", "{} !", "they said it was {}")


def lines(*texts: str) -> list[bytes]:
    return [t.encode("utf-8") + b"\n" for t in texts]


def test_read_inputs_reports_each_bad_line_by_number():
    raw = lines('{"text": "a", "text_b": "b"}', "", '{"text": "a"}', "not json", "[1, 2]",
                '{"text": "é", "text_b": "ü", "extra": 1}') + [b'{"text": "\xff"}\n']
    got = list(predict.read_inputs(raw, "jsonl", ("text", "text_b")))
    assert got == [(1, {"text": "a", "text_b": "b"}),
                   (3, "lacks the string field(s) text_b"),
                   (4, "is not valid JSON (Expecting value at column 1)"),
                   (5, "is a JSON list, expected an object with text, text_b"),
                   (6, {"text": "é", "text_b": "ü"}),
                   (7, "is not UTF-8 (byte 10: b'\\xff')")]


def test_tsv_positional_or_by_header():
    positional = list(predict.read_inputs(lines("q1\tc1", "only one", "q2\tc2\tx"), "tsv",
                                          ("question", "context")))
    assert positional == [(1, {"question": "q1", "context": "c1"}),
                          (2, "has 1 tab-separated columns, expected 2 (question, context)"),
                          (3, "has 3 tab-separated columns, expected 2 (question, context)")]
    by_header = list(predict.read_inputs(lines("id\tcontext\tquestion", "7\tc1\tq1", "8\tc2"),
                                         "tsv", ("question", "context")))
    assert by_header == [(2, {"question": "q1", "context": "c1"}),
                         (3, "has 2 columns, the header has 3")]


def test_text_format_and_format_detection():
    assert list(predict.read_inputs(lines("a b", "  ", "c\td"), "text", ("text",))) == [
        (1, {"text": "a b"}), (3, {"text": "c\td"})]
    with pytest.raises(UserError, match=r"--format=text gives one text a line, but the model "
                                        r"reads question, context; use --format=tsv"):
        list(predict.read_inputs(lines("x"), "text", ("question", "context")))
    assert [predict.detect_format(p, None) for p in ("a.tsv", "a.JSONL", "a.json", "a.txt", "-")
            ] == ["tsv", "jsonl", "jsonl", "text", "text"]
    assert predict.detect_format("a.tsv", "jsonl") == "jsonl"


def char_count_predictor(calls: list):
    """A stand-in model: the score of a text is its length in characters."""
    def fn(text):
        calls.append(int(tf.size(text)))
        return {"score": tf.cast(tf.strings.length(text, unit="UTF8_CHAR"), tf.float32)}
    return predict.Predictor(("text",), fn, "regression")


def test_predict_lines_batches_in_order_and_skips_bad_lines():
    calls, out, err = [], [], io.StringIO()
    raw = lines('{"text": "ab"}', '{"text": "ééé"}', "oops", '{"text": ""}', '{"text": "x"}')
    summary = predict.predict_lines(char_count_predictor(calls), raw, out.append, fmt="jsonl",
                                    batch_size=2, source="in.jsonl",
                                    progress=predict.Progress(err, total_lines=5))
    assert calls == [2, 2]  # two full batches of valid inputs
    assert [json.loads(o) for o in out] == [
        {"line": 1, "text": "ab", "score": 2.0}, {"line": 2, "text": "ééé", "score": 3.0},
        {"line": 4, "text": "", "score": 0.0}, {"line": 5, "text": "x", "score": 1.0}]
    assert (summary.answered, summary.skipped) == (4, 1)
    assert "in.jsonl:3: skipped: the line is not valid JSON" in err.getvalue()
    assert "line 5/5 | 4 answered" in err.getvalue()


def padding_predictor(batches: list):
    """A stand-in export that pads a batch to its longest text (one slot a character) and
    counts it, as the text signatures do."""
    def fn(text):
        batches.append([t.decode() for t in text.numpy()])
        length = tf.strings.length(text, unit="UTF8_CHAR")
        return {"score": tf.cast(length, tf.float32), "input_tokens": length,
                "padding_tokens": tf.reduce_max(length) - length}
    return predict.Predictor(("text",), fn, "regression")


def test_a_window_is_batched_by_length_and_answered_in_input_order():
    texts = ["ccc", "a", "dddddd", "bb", "eeeee", "ffff", "g"]
    sorted_batches, in_order = [], []
    out = []
    summary = predict.predict_lines(padding_predictor(sorted_batches), lines(*texts), out.append,
                                    fmt="text", batch_size=2)
    assert sorted_batches == [["a", "g"], ["bb", "ccc"], ["ffff", "eeeee"], ["dddddd"]]
    assert [json.loads(o)["text"] for o in out] == texts
    assert [json.loads(o)["score"] for o in out] == [len(t) for t in texts]
    assert (summary.input_tokens, summary.padding_tokens) == (sum(map(len, texts)), 2)
    assert "7 inputs in" in summary.report() and "inputs/s; padding 8.3% of 24 slots" in (
        summary.report())
    # One batch a window: batches in input order, padded more.
    again = predict.predict_lines(padding_predictor(in_order), lines(*texts), out.append,
                                  fmt="text", batch_size=2, window_batches=1)
    assert in_order == [["a", "ccc"], ["bb", "dddddd"], ["ffff", "eeeee"], ["g"]]
    assert again.padding_tokens == 2 + 4 + 1 > summary.padding_tokens
    # A window of 2 batches: sorted within each window of 4 inputs only.
    in_order.clear()
    predict.predict_lines(padding_predictor(in_order), lines(*texts), out.append, fmt="text",
                          batch_size=2, window_batches=2)
    assert in_order == [["a", "bb"], ["ccc", "dddddd"], ["g", "ffff"], ["eeeee"]]
    calls = []
    old = predict.predict_lines(char_count_predictor(calls), lines("x"), out.append, fmt="text")
    assert old.padding_tokens is None and "padding not counted by this export" in old.report()


def test_a_window_sorts_by_word_pieces_where_the_predictor_has_a_tokenizer(tmp_path):
    texts = ["the cat", "xqzv", "x"]  # 2, 4 and 1 pieces; 7, 4 and 1 characters
    by_chars, by_pieces = [], []
    predict.predict_lines(padding_predictor(by_chars), lines(*texts), [].append, fmt="text",
                          batch_size=1)
    assert by_chars == [["x"], ["xqzv"], ["the cat"]]
    predictor = padding_predictor(by_pieces)
    predictor.tokenizer = Tokenizer(write_vocab(tmp_path / "vocab.txt"))
    assert predictor.lengths([{"text": t} for t in texts]) == [2, 4, 1]
    out = []
    predict.predict_lines(predictor, lines(*texts), out.append, fmt="text", batch_size=1)
    assert by_pieces == [["x"], ["the cat"], ["xqzv"]]
    assert [json.loads(o)["text"] for o in out] == texts


def test_stop_on_error_writes_what_came_before_then_names_the_line():
    calls, out = [], []
    raw = lines("one", "two") + [b"\xc3(\n"] + lines("four")
    with pytest.raises(UserError, match=r"^in.txt:3: the line is not UTF-8 \(byte 0: "
                                        r"b'\\xc3'\); fix it or pass --on_error=skip$"):
        predict.predict_lines(char_count_predictor(calls), raw, out.append, fmt="text",
                              batch_size=8, on_error="stop", source="in.txt")
    assert [json.loads(o)["text"] for o in out] == ["one", "two"]


def test_format_answer_of_each_family():
    squad = {"answer": np.array([b"Paris", b""]), "score": np.array([1.5, -np.inf], np.float32),
             "start": np.array([3, -1]), "end": np.array([8, -1])}
    assert predict.format_answer("squad", squad, 1) == {"answer": "", "score": None,
                                                        "start": -1, "end": -1}
    tagging = {"entity_type": np.array([[b"LOC", b""]]),
               "entity_text": np.array([["Köln".encode(), b""]], object),
               "entity_start": np.array([[4, -1]]), "entity_end": np.array([[8, -1]]),
               "num_entities": np.array([1])}
    assert predict.format_answer("tagging", tagging, 0) == {
        "entities": [{"type": "LOC", "text": "Köln", "start": 4, "end": 8}]}
    with pytest.raises(UserError, match=r"returns \['logits'\], not the outputs of a bert-train"):
        predict._family(["logits"])
    # An export without a family record is recognized by its outputs, the most specific first.
    assert predict._family(["answer", "end", "score", "start"]).name == "squad"
    assert predict._family(["score"]).name == "regression"
    assert predict._family(["label_index", "label_name", "probabilities"]).name == (
        "classification")


def train_sentiment(model_path) -> None:
    """Trains a tiny classifier on sentiment words (a few seconds) and saves a model dir."""
    keras.utils.set_random_seed(0)
    model = build_model("classification")
    texts = [t.format(w) for t in TEMPLATES for w in POSITIVE + NEGATIVE]
    labels = np.array([int(w in POSITIVE) for _ in TEMPLATES for w in POSITIVE + NEGATIVE])
    vocab = write_vocab(model_path.parent / "sentiment_vocab.txt")
    inputs = text_features(Tokenizer(vocab), {"text": tf.constant(texts)}, 16)
    optimizer = keras.optimizers.Adam(3e-3)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            logits = model(inputs, training=True)["logits"]
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables, strict=True))
        return loss

    losses = [float(step()) for _ in range(80)]
    assert losses[-1] < 0.1 < losses[0], losses[::10]
    make_model_dir(model_path, "classification", model=model, seq_length=16)


def cli(*args) -> subprocess.CompletedProcess:
    """`bert-train ARGS` through the CLI's entry point (`cli.main`) in this process, its
    stdout and stderr captured: what a user sees and the exit code, without importing
    TensorFlow again in a subprocess per call."""
    from bert_trainer import cli as cli_module  # noqa: PLC0415

    gin.clear_config()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_module.main(["bert-train", *map(str, args)])
    return subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())


def error_lines(proc, command):
    return [ln for ln in proc.stderr.splitlines() if ln.startswith(f"bert-train {command}:")]


@pytest.fixture(scope="module")
def sentiment_export(tmp_path_factory):
    root = tmp_path_factory.mktemp("sentiment")
    train_sentiment(root / "model")
    proc = cli("export", f"--model_dir={root / 'model'}", f"--output={root / 'export'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, proc.stdout


HELD_OUT = [("that movie was very good", "positive"), ("an awful film", "negative"),
            ("it was a great film", "positive"), ("the poor movie", "negative")]


@pytest.mark.slow
def test_export_cli_lists_signatures_and_keeps_an_existing_output(sentiment_export):
    root, stdout = sentiment_export
    assert f"exported classification model (seq_length 16) to {root / 'export'}" in stdout
    assert ("serving_default(text) -> input_tokens, label_index, label_name, padding_tokens, "
            "probabilities, truncated") in stdout
    assert "serving_ids(input_word_ids, input_mask, input_type_ids) -> logits" in stdout
    assert (root / "export" / "assets" / "vocab.txt").read_text().split() == (
        (root / "model" / "vocab.txt").read_text().split())
    proc = cli("export", f"--model_dir={root / 'model'}", f"--output={root / 'export'}")
    assert proc.returncode == EXIT_USER_ERROR
    assert error_lines(proc, "export") == [
        f"bert-train export: error: --output={root / 'export'} exists and is not empty; "
        "choose a new directory or pass --overwrite"]


@pytest.mark.slow
def test_predict_cli_skips_a_malformed_line_and_answers_the_rest(sentiment_export):
    root, _ = sentiment_export
    records = [json.dumps({"text": t}) for t, _ in HELD_OUT]
    source = root / "in.jsonl"
    source.write_text("\n".join(records[:2] + ['{"text": "broken'] + records[2:]) + "\n")
    proc = cli("predict", f"--saved_model={root / 'export'}", f"--input={source}",
               "--output=-", "--batch_size=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [a["line"] for a in answers] == [1, 2, 4, 5]
    assert [(a["text"], a["label"]) for a in answers] == HELD_OUT
    assert all(abs(sum(a["probabilities"]) - 1) < 1e-5 for a in answers)
    assert f"{source}:3: skipped: the line is not valid JSON" in proc.stderr
    assert "predict: answered 4 inputs" in proc.stderr and "skipped 1 unreadable" in proc.stderr

    # A stop: stdout has the answers before the bad line; an output file appears only whole.
    proc = cli("predict", f"--saved_model={root / 'export'}", f"--input={source}",
               "--output=-", "--on_error=stop")
    assert proc.returncode == EXIT_USER_ERROR
    [error] = error_lines(proc, "predict")
    assert error.startswith(f"bert-train predict: error: {source}:3: the line is not valid JSON")
    assert [json.loads(line)["line"] for line in proc.stdout.splitlines()] == [1, 2]
    out = root / "stopped.jsonl"
    proc = cli("predict", f"--saved_model={root / 'export'}", f"--input={source}",
               f"--output={out}", "--on_error=stop")
    assert proc.returncode == EXIT_USER_ERROR
    assert not [name for name in os.listdir(root) if "stopped" in name]  # nor a temporary


@pytest.mark.slow
def test_an_export_whose_model_record_does_not_fit_its_variables_is_refused(sentiment_export,
                                                                           tmp_path):
    root, _ = sentiment_export
    copy = tmp_path / "export"
    shutil.copytree(root / "export", copy)
    record_file = copy / "assets.extra" / "bert_train_family.json"
    record = json.loads(record_file.read_text())
    record["model"]["encoder_config"]["inner_dim"] += 1
    record_file.write_text(json.dumps(record))
    with pytest.raises(UserError, match=r"variables/variables does not fit the model .*"
                                        r"bert_train_family.json describes .*re-export the model"):
        predict.load_predictor(saved_model=str(copy))
    del record["model"]["seq_length"]
    record_file.write_text(json.dumps(record))
    with pytest.raises(UserError, match=r"its model entry is incomplete .*seq_length"):
        predict.load_predictor(saved_model=str(copy))


@pytest.mark.slow
def test_model_dir_and_saved_model_give_the_same_answers(sentiment_export, tmp_path):
    root, _ = sentiment_export
    source = tmp_path / "in.txt"
    source.write_text("\n".join(t for t, _ in HELD_OUT) + "\nCafé  très GOOD!\n")
    results = []
    # The export is rebuilt in this process (the CPU), as the model directory; its own graph
    # only without rebuild.
    for kind, rebuild in (("model_dir", True), ("saved_model", True), ("saved_model", False)):
        predictor = predict.load_predictor(
            rebuild=rebuild, **{kind: str(root / ("model" if kind == "model_dir" else "export"))})
        assert predictor.in_process == rebuild
        assert (predictor.input_names, predictor.family) == (("text",), "classification")
        pieces = predictor.tokenizer.tokenize(["good film"]).to_list()  # windows sort by pieces
        assert pieces == [[VOCAB.index("good"), VOCAB.index("film")]]
        out = tmp_path / f"{kind}_{rebuild}.jsonl"
        summary = predict.run_predict(predictor, str(source), str(out), stderr=io.StringIO())
        assert (summary.answered, summary.skipped) == (5, 0)
        results.append([json.loads(line) for line in out.read_text().splitlines()])
    for a, *others in zip(*results, strict=True):
        for b in others:
            assert a["label"] == b["label"]
            assert np.abs(np.subtract(a["probabilities"], b["probabilities"])).max() <= 1e-5


@pytest.mark.slow
def test_predict_flag_and_path_errors(tmp_path):
    proc = cli("predict", "--model_dir=a", "--saved_model=b", "--input=x")
    assert proc.returncode == EXIT_USER_ERROR
    [error] = error_lines(proc, "predict")
    assert "model_dir" in error and "saved_model" in error
    with pytest.raises(UserError, match=r"--saved_model=.* holds no saved_model.pb"):
        predict.load_predictor(saved_model=str(tmp_path))
