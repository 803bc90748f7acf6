"""Texts longer than seq_length: windows cover every piece, and their outputs combine back.

The window cut and the max-context choice are checked piece by piece (against squad_data's
host-side reference), the classification and tagging rows against truncation for texts that
fit, the host-side (evaluation) and in-graph (serving) combinations against each other and
against a hand computation, and predict and the SavedModel on long texts.
"""

import json

import numpy as np
import pytest
import tensorflow as tf
from export_testing import (
    TAGS,
    WORDS,
    build_model,
    make_model_dir,
    save_checkpoint,
    scramble,
    write_vocab,
)

from bert_trainer import features
from bert_trainer.data import windows
from bert_trainer.data.tokenizer import Tokenizer
from bert_trainer.errors import UserError
from bert_trainer.export import build_serving_module, export_saved_model, predict
from bert_trainer.features import LOGITS
from bert_trainer.metrics import tagging as tagging_metrics
from bert_trainer.tasks.classification import data as classification_data
from bert_trainer.tasks.classification.serving import ClassifierServing
from bert_trainer.tasks.squad import data as squad_data
from bert_trainer.tasks.tagging import data as tagging_data
from bert_trainer.tasks.tagging.serving import TaggerServing

SEQ = 16  # Windows of 14 pieces (one text) with the default stride 7.


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    return write_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt")


@pytest.fixture(scope="module")
def tokenizer(vocab_file):
    return Tokenizer(vocab_file)


def words_text(n: int, seed: int = 0) -> str:
    """n vocabulary words (one piece each) joined by spaces."""
    return " ".join(np.random.default_rng(seed).choice(WORDS, n))


# -- the cut ------------------------------------------------------------------------------

CUTS = [(0, 10, None), (1, 10, None), (10, 10, None), (11, 10, None), (57, 10, None),
        (57, 10, 3), (57, 10, 10), (57, 10, 25), (33, 1, None), (100, 7, 1), (9, 2, None)]


@pytest.mark.parametrize("num, room, stride", CUTS)
def test_windows_cover_every_piece_and_each_piece_has_one_max_context_window(num, room,
                                                                             stride):
    cut = windows.cut([num], room, stride)
    start, length = cut.start.numpy(), cut.length.numpy()
    step = max(min(room, room // 2 if stride is None else stride), 1)
    assert start[0] == 0 and start[-1] + length[-1] == num  # From the first to the last piece.
    np.testing.assert_array_equal(np.diff(start), step)
    assert (length <= room).all() and int(cut.num_windows[0]) == len(start)
    covered = np.zeros(num, int)
    for s, n in zip(start, length, strict=True):
        covered[s:s + n] += 1
    assert (covered >= 1).all()
    values = tf.RaggedTensor.from_row_lengths(tf.range(num) * 10, [num])
    assert windows.gather(values, cut).to_list() == [
        [10 * p for p in range(s, s + n)] for s, n in zip(start, length, strict=True)]
    chosen = np.full(num, -1)
    for w, row in enumerate(windows.max_context(values, cut).to_list()):
        for j in np.flatnonzero(row):
            assert chosen[start[w] + j] == -1, "a piece chosen by two windows"
            chosen[start[w] + j] = w
    # google-research/bert's `_check_is_max_context`, as squad_data computes it host-side.
    spans = list(zip(start.tolist(), length.tolist(), strict=True))
    np.testing.assert_array_equal(chosen, squad_data._max_context(spans, num))


def test_a_batch_cuts_each_text_as_alone():
    nums, room, stride = [5, 0, 23, 40], 6, 4
    cut = windows.cut(nums, room, stride)
    alone = [windows.cut([n], room, stride) for n in nums]
    np.testing.assert_array_equal(cut.num_windows, [int(a.num_windows[0]) for a in alone])
    np.testing.assert_array_equal(cut.example, np.repeat(range(4), cut.num_windows))
    np.testing.assert_array_equal(cut.start, np.concatenate([a.start for a in alone]))
    np.testing.assert_array_equal(cut.length, np.concatenate([a.length for a in alone]))
    values = tf.ragged.range(nums)
    best = windows.max_context(values, cut).flat_values.numpy()
    expected = np.concatenate([windows.max_context(tf.ragged.range([n]), a).flat_values
                               for n, a in zip(nums, alone, strict=True)])
    np.testing.assert_array_equal(best, expected)


def test_bad_options_are_one_line_errors():
    for options, expected in [(dict(long_texts="wrap"), "FinetuneConfig.long_texts='wrap'"),
                              (dict(doc_stride=0), "FinetuneConfig.doc_stride=0 must be"),
                              (dict(doc_stride=2.5), "FinetuneConfig.doc_stride=2.5 must be"),
                              (dict(window_pooling="sum"), "window_pooling='sum' is unknown")]:
        with pytest.raises(UserError, match=expected):
            windows.check_options(**options)
    windows.check_options("truncate", 1, "max")  # Accepted.
    assert windows.stored_options({"windows": {"long_texts": "truncate"}}) == {
        "long_texts": "truncate", "doc_stride": None, "window_pooling": "mean"}
    assert windows.stored_options(None) == windows.OPTIONS


# -- classification rows ------------------------------------------------------------------

SHORT = ["the cat sat on the mat", "", "john lives in paris , france", "a good film"]
SHORT_B = ["a dog", "the river", "", words_text(30, 5)]  # The last pair trims text_b.


@pytest.mark.parametrize("pair", [False, True])
def test_texts_that_fit_are_one_window_equal_to_truncation(tokenizer, pair):
    batch = {"text": tf.constant(SHORT), "label": tf.constant([0, 1, 1, 0])}
    if pair:
        batch["text_b"] = tf.constant(SHORT_B)
        batch["text"] = tf.constant(SHORT[:3] + [words_text(4, 6)])
    rows = classification_data.window_features(tokenizer, batch, SEQ)
    truncated = classification_data.text_features(tokenizer, batch, SEQ)
    counts = np.bincount(rows[windows.EXAMPLE_INDEX])
    assert counts.tolist()[:3] == [1, 1, 1] and (counts[3] > 1) == pair  # The long text_b.
    fit = [0, 1, 2] + ([] if pair else [3])
    for name in (*features.ENCODER_INPUTS, features.LABEL_IDS):
        np.testing.assert_array_equal(rows[name].numpy()[fit], truncated[name].numpy()[fit],
                                      err_msg=name)


def test_a_long_pair_keeps_its_first_text_and_windows_the_second(tokenizer):
    text, text_b = words_text(40, 1), words_text(50, 2)
    rows = classification_data.window_features(
        tokenizer, {"text": tf.constant([text]), "text_b": tf.constant([text_b])}, SEQ,
        doc_stride=3)
    a = tokenizer.tokenize([text]).to_list()[0]
    b = tokenizer.tokenize([text_b]).to_list()[0]
    keep = (SEQ - 3) // 2  # Both long: the first text keeps half the room.
    ids, types = rows[features.INPUT_WORD_IDS].numpy(), rows[features.INPUT_TYPE_IDS].numpy()
    seen = set()
    for row, row_types, start in zip(ids, types, rows[windows.WINDOW_START].numpy(),
                                     strict=True):
        assert list(row[1:1 + keep]) == a[:keep]
        second = row[row_types == 1][:-1]  # Without its [SEP].
        assert list(second) == b[start:start + len(second)] and len(second) <= SEQ - 3 - keep
        seen.update(range(start, start + len(second)))
    assert seen == set(range(len(b)))  # Every piece of the second text is in a window.


def test_head_and_tail_keep_the_first_quarter_of_the_room_and_fill_it_from_the_end(tokenizer):
    kept = classification_data.head_and_tail(tf.ragged.constant([list(range(10)), [7, 8, 9]]), 8)
    assert kept.to_list() == [[0, 1, 4, 5, 6, 7, 8, 9], [7, 8, 9]]
    long_text = words_text(40, 4)
    batch = {"text": tf.constant([long_text, SHORT[0]]), "label": tf.constant([1, 0])}
    rows = classification_data.text_features(tokenizer, batch, SEQ, with_cut=True,
                                             head_tail=True)
    first = classification_data.text_features(tokenizer, batch, SEQ, with_cut=True)
    pieces = tokenizer.tokenize([long_text]).to_list()[0]
    room = SEQ - 2
    head = room // 4
    ids = rows[features.INPUT_WORD_IDS].numpy()
    assert ids[0, 1:1 + head].tolist() == pieces[:head]
    assert ids[0, 1 + head:SEQ - 1].tolist() == pieces[len(pieces) - (room - head):]
    assert (ids[0, 0], ids[0, -1]) == (tokenizer.cls_id, tokenizer.sep_id)
    assert rows[classification_data.CUT].numpy().tolist() == [1, 0]  # counted as cut
    for name in (*features.ENCODER_INPUTS, features.LABEL_IDS):  # a text that fits: as ever
        np.testing.assert_array_equal(rows[name].numpy()[1], first[name].numpy()[1])
    with pytest.raises(ValueError, match="head_tail reads single texts"):
        classification_data.text_features(
            tokenizer, {"text": tf.constant(["a"]), "text_b": tf.constant(["b"])}, SEQ,
            head_tail=True)


# -- tagging rows -------------------------------------------------------------------------


def test_tagging_windows_map_back_to_one_tag_per_word(tokenizer):
    sentences = [["john", "lives", "in", "paris"], words_text(45, 3).split()]
    tag_ids = [[3, 0, 0, 1], list(np.random.default_rng(4).integers(0, len(TAGS), 45))]
    words, tags = tf.ragged.constant(sentences), tf.ragged.constant(tag_ids)
    rows = tagging_data.window_tag_features(tokenizer, words, tags, 10, doc_stride=3)
    truncated = tagging_data.tag_features(tokenizer, words, tags, 10)
    for name in (*features.ENCODER_INPUTS, features.LABEL_IDS):  # The short one: one window.
        np.testing.assert_array_equal(rows[name].numpy()[0], truncated[name].numpy()[0])
    assert rows[windows.NUM_WINDOWS].numpy().tolist() == [1] + [14] * 14
    merged = windows.merge_pieces(
        {"labels": rows[features.LABEL_IDS].numpy()},
        *(rows[k].numpy() for k in (windows.EXAMPLE_INDEX, windows.NUM_WINDOWS,
                                    windows.WINDOW_START, windows.IS_MAX_CONTEXT)))
    for sentence, gold, m in zip(sentences, tag_ids, merged, strict=True):
        assert len(m["labels"]) == len(sentence)  # One piece per word here, each once.
        got = tagging_data.word_predictions([m["labels"]], [m["labels"]], TAGS)[0]
        assert got == [TAGS[t] for t in gold]
    # Each word's chosen window holds it and labels it with its tag.
    labels = rows[features.LABEL_IDS].numpy()
    chosen = rows[windows.IS_MAX_CONTEXT].numpy()
    assert (labels[chosen] != features.IGNORE_LABEL).all()
    assert chosen.sum() == sum(map(len, sentences))


def test_merge_leaves_out_a_text_whose_windows_were_not_all_evaluated():
    index, count = np.array([0, 0, 1, 2, 2]), np.array([2, 2, 1, 3, 3])
    texts, groups = windows.complete_rows(index, count)
    assert texts.tolist() == [0, 1] and [g.tolist() for g in groups] == [[0, 1], [2]]


# -- combining window logits --------------------------------------------------------------


def test_mean_and_max_pooling_on_the_host_and_in_graph():
    logits = np.array([[1, -2], [3, 0], [5, 5], [0, 4], [-1, 2], [2, 0]], np.float32)
    example = np.array([0, 0, 1, 2, 2, 2])
    labels = np.array([1, 1, 0, 1, 1, 1])
    mean = np.array([[2, -1], [5, 5], [1 / 3, 2]], np.float32)
    top = np.array([[3, 0], [5, 5], [2, 4]], np.float32)
    for pooling, expected in (("mean", mean), ("max", top)):
        in_graph = windows.pool(tf.constant(logits), tf.constant(example), 3, pooling)
        np.testing.assert_allclose(in_graph.numpy(), expected, rtol=1e-6)
        host, host_labels = windows.pool_eval(logits, labels, example, np.bincount(example)[
            example], pooling)
        np.testing.assert_allclose(host, expected, rtol=1e-6)
        assert host_labels.tolist() == [1, 0, 1]
    assert np.argmax(mean[2]) == 1 and np.argmax(top[2]) == 1 and not np.allclose(mean, top)
    # One window per text (every text fits): both poolings return its logits, bit for bit.
    alone = np.arange(6)
    for pooling in windows.POOLINGS:
        host, _ = windows.pool_eval(logits, labels, alone, np.ones(6), pooling)
        in_graph = windows.pool(tf.constant(logits), tf.constant(alone), 6, pooling)
        np.testing.assert_array_equal(host, logits)
        np.testing.assert_array_equal(in_graph.numpy(), logits)


def manual_class_logits(model, tokenizer, text: str, pooling: str) -> np.ndarray:
    """One text's logits from each window alone, then combined with numpy."""
    rows = classification_data.window_features(tokenizer, {"text": tf.constant([text])}, SEQ)
    per_window = np.stack([
        model({k: rows[k][i:i + 1] for k in features.ENCODER_INPUTS}, training=False)[LOGITS]
        .numpy()[0] for i in range(rows[features.INPUT_WORD_IDS].shape[0])])
    assert len(per_window) > 1
    return per_window.max(axis=0) if pooling == "max" else per_window.mean(axis=0)


def classifier(model, vocab_file, **options):
    module = ClassifierServing(model, label_names=["negative", "positive", "neutral"],
                               vocab_file=vocab_file, lower_case=True, seq_length=SEQ, **options)
    module.max_windows_per_call = 3  # Several model calls per batch, the last one partial.
    return module


@pytest.mark.slow  # traces three serving functions: left out of make test-fast
def test_classifier_serving_combines_windows_as_the_evaluation_does(vocab_file, tokenizer):
    model = build_model("classification", 3)
    scramble(model, seed=3)
    long_text = words_text(60, 7)
    texts = tf.constant(SHORT + [long_text])
    truncate = classifier(model, vocab_file, long_texts="truncate").text_function()(texts)
    # Head and tail: the model on the rows training reads (`text_features(head_tail=True)`).
    head_tail = classifier(model, vocab_file, long_texts="head_tail").text_function()(texts)
    rows = classification_data.text_features(tokenizer, {"text": texts}, SEQ, head_tail=True)
    np.testing.assert_allclose(head_tail["probabilities"].numpy(), tf.nn.softmax(
        model(rows, training=False)[LOGITS]).numpy(), atol=1e-5)
    assert head_tail["truncated"].numpy().tolist() == [False] * 4 + [True]
    assert np.abs(head_tail["probabilities"].numpy()[4]
                  - truncate["probabilities"].numpy()[4]).max() > 1e-3
    probabilities, functions = {}, {}
    for pooling in windows.POOLINGS:
        functions[pooling] = classifier(model, vocab_file, window_pooling=pooling).text_function()
        out = functions[pooling](texts)
        # Texts that fit: the windowed answer is the truncated one.
        np.testing.assert_allclose(out["probabilities"].numpy()[:4],
                                   truncate["probabilities"].numpy()[:4], atol=1e-6)
        expected = tf.nn.softmax(manual_class_logits(model, tokenizer, long_text, pooling))
        np.testing.assert_allclose(out["probabilities"].numpy()[4], expected.numpy(),
                                   atol=1e-5)
        probabilities[pooling] = out["probabilities"].numpy()[4]
    assert np.abs(probabilities["mean"] - probabilities["max"]).max() > 1e-3
    # The default options (windows, mean pooling): the function traced above answers.
    default = classifier(model, vocab_file)
    assert (default.long_texts, default.window_pooling) == ("windows", "mean")
    empty = functions["mean"](tf.constant([], tf.string))
    assert empty["probabilities"].shape == (0, 3)  # No text, no window: not an error.


def manual_word_tags(model, tokenizer, text: str, seq_length: int) -> list[str]:
    """One text's word tags from the window rows, each word from its max-context window."""
    words = tf.ragged.constant([text.split()])
    rows = tagging_data.window_tag_features(tokenizer, words, None, seq_length)
    logits = model({k: rows[k] for k in features.ENCODER_INPUTS}, training=False)[LOGITS]
    merged = windows.merge_pieces(
        {"predicted": np.argmax(logits.numpy(), -1), "labels": rows[features.LABEL_IDS]},
        *(rows[k].numpy() for k in (windows.EXAMPLE_INDEX, windows.NUM_WINDOWS,
                                    windows.WINDOW_START, windows.IS_MAX_CONTEXT)))[0]
    return tagging_data.word_predictions([merged["predicted"]], [merged["labels"]], TAGS)[0]


def entities_of(out: dict, i: int) -> list[tuple[str, str]]:
    return [(out["entity_type"][i, j].decode(), out["entity_text"][i, j].decode())
            for j in range(int(out["num_entities"][i]))]


@pytest.mark.slow  # traces two serving functions: left out of make test-fast
def test_tagger_serving_tags_every_word_of_a_long_text_from_its_best_window(vocab_file,
                                                                            tokenizer):
    model = build_model("tagging", len(TAGS))
    scramble(model, seed=1, scale=0.5)
    text = words_text(70, 11)
    windowed = TaggerServing(model, label_names=TAGS, vocab_file=vocab_file, lower_case=True,
                             seq_length=SEQ)
    windowed.max_windows_per_call = 4  # Several model calls, the last one partial.
    tags = manual_word_tags(model, tokenizer, text, SEQ)
    assert len(tags) == 70
    words = text.split()
    expected = [(kind, " ".join(words[a:b]))
                for kind, a, b in tagging_metrics.get_entities(tags, scheme="IOB2")]
    out = {k: v.numpy() for k, v in windowed.text_function()(tf.constant([text, "john"])).items()}
    assert entities_of(out, 0) == expected and len(expected) >= 3
    ends = [int(out["entity_end"][0, j]) for j in range(int(out["num_entities"][0]))]
    assert max(ends) > len(" ".join(words[:SEQ - 2]))  # Entities past the first window.
    truncate = TaggerServing(model, label_names=TAGS, vocab_file=vocab_file, lower_case=True,
                             seq_length=SEQ, long_texts="truncate")
    short = {k: v.numpy() for k, v in truncate.text_function()(tf.constant(["john"])).items()}
    assert entities_of(short, 0) == entities_of(out, 1)  # A short text: the same answer.


# -- predict and the export ---------------------------------------------------------------


@pytest.mark.slow  # exports two SavedModels: left out of make test-fast
@pytest.mark.parametrize("long_texts", ["windows", "truncate"])
def test_predict_and_the_export_answer_a_long_text(tmp_path, vocab_file, tokenizer,
                                                   long_texts):
    model_dir, model = make_model_dir(tmp_path / "run", "classification", seq_length=SEQ,
                                      seed=5, task_extra={"windows": {"long_texts": long_texts}})
    texts = [words_text(80, 8), "a good film"]
    export_saved_model(str(model_dir), str(tmp_path / "export"))
    answers = {}
    for source in ("model_dir", "saved_model"):
        path = model_dir if source == "model_dir" else tmp_path / "export"
        predictor = predict.load_predictor(**{source: str(path)})
        (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
        out = tmp_path / f"{source}.jsonl"
        predict.run_predict(predictor, str(tmp_path / "in.txt"), str(out))
        answers[source] = [json.loads(line) for line in out.read_text().splitlines()]
    got = [a["probabilities"] for a in answers["saved_model"]]
    np.testing.assert_allclose(got, [a["probabilities"] for a in answers["model_dir"]],
                               atol=1e-6)
    if long_texts == "windows":
        logits = manual_class_logits(model, tokenizer, texts[0], "mean")
    else:
        inputs = classification_data.text_features(tokenizer, {"text": tf.constant(texts[:1])},
                                                   SEQ)
        logits = model(inputs, training=False)[LOGITS].numpy()[0]
    np.testing.assert_allclose(got[0], tf.nn.softmax(logits).numpy(), atol=1e-5)
    assert build_serving_module(str(model_dir)).long_texts == long_texts


# -- the tasks: training rows, evaluation ---------------------------------------------------


def run_eval(task, model) -> dict:
    """The trainer's evaluation loop without the trainer: gathered outputs, concatenated."""
    gathered = {}
    for batch in task.build_inputs(task.eval_split, None, is_training=False):
        outputs = model(task.model_inputs(batch), training=False)
        for name, value in task.eval_step_outputs(batch, outputs).items():
            gathered.setdefault(name, []).append(np.asarray(value))
    return {name: np.concatenate(parts) for name, parts in gathered.items()}


@pytest.mark.slow  # builds a task on the tiny pretrained model: left out of make test-fast
def test_classification_trains_on_every_window_and_scores_texts_as_serving_does(
        tiny_pretrained, tmp_path):
    from finetune_testing import make_task, shared_file  # noqa: PLC0415

    lines = open(shared_file("sst2/dev.tsv"), encoding="utf-8").read().splitlines()[1:61]
    sentences = [line.split("\t")[0] for line in lines]
    docs = [" ".join(sentences[i:i + 5]) for i in range(0, 60, 5)]  # 12 texts, ~100 pieces
    tsv = tmp_path / "docs.tsv"
    tsv.write_text("text\tlabel\n" + "".join(f"{d}\t{i % 2}\n" for i, d in enumerate(docs)),
                   encoding="utf-8")
    task = make_task("classification", tiny_pretrained, train_file=str(tsv),
                     eval_file=str(tsv), seq_length=SEQ, train_batch_size=8, eval_batch_size=8)
    rows = task.num_train_rows()
    assert task.num_examples("train") == 12 and rows > 5 * 12
    batch = next(iter(task.build_inputs("train", None, is_training=True)))
    # No evaluation keys; "cut" marks texts that lost pieces (counted).
    assert set(batch) == {*features.ENCODER_INPUTS, features.LABEL_IDS, "cut"}
    assert batch[features.INPUT_WORD_IDS].shape == (8, SEQ)
    assert task.task_info()["windows"] == windows.OPTIONS

    model = task.build_model()
    scramble(model, seed=2, scale=0.2)
    gathered = run_eval(task, model)
    assert len(gathered[LOGITS]) == rows  # The same windows as training, each once.
    results = task.aggregate_eval(gathered)
    assert results["num_examples"] == 12 and results["num_windows"] == rows
    pooled, labels = windows.pool_eval(gathered[LOGITS], gathered[features.LABEL_IDS],
                                       gathered[windows.EXAMPLE_INDEX],
                                       gathered[windows.NUM_WINDOWS])
    assert labels.tolist() == [i % 2 for i in range(12)]
    assert results["accuracy"] == pytest.approx(np.mean(np.argmax(pooled, -1) == labels))
    module = ClassifierServing(model, label_names=["0", "1"], vocab_file=task.tokenizer.vocab_file,
                               lower_case=True, seq_length=SEQ)
    served = module.text_function()(tf.constant(docs))["probabilities"].numpy()
    np.testing.assert_allclose(served, tf.nn.softmax(pooled).numpy(), atol=1e-5)


@pytest.mark.slow  # builds a task on the tiny pretrained model: left out of make test-fast
def test_tagging_evaluation_scores_every_word_of_sentences_longer_than_a_window(
        tiny_pretrained):
    from finetune_testing import shared_file  # noqa: PLC0415

    from bert_trainer.tasks import finetuning, registry  # noqa: PLC0415

    def task_of(long_texts):
        config = finetuning.FinetuneConfig(seq_length=8, eval_batch_size=16,
                                           long_texts=long_texts)
        data = finetuning.DataConfig(eval_file=shared_file("conll2003/eng.testa"),
                                     max_eval_examples=40)
        return registry.build_task(registry.resolve_task_data("conll2003"),
                                   finetuning.spec_from_checkpoint(tiny_pretrained["dir"]),
                                   config=config, data=data)

    results = {}
    for long_texts in ("windows", "truncate"):
        task = task_of(long_texts)
        gathered = run_eval(task, task.build_model())
        labels = gathered[features.LABEL_IDS]
        gathered["predictions"] = np.where(labels == features.IGNORE_LABEL, 0, labels)
        results[long_texts] = task.aggregate_eval(gathered)  # Perfect predictions.
    sentences = list(task.raw_examples("eval").as_numpy_iterator())
    names = task.label_names
    entities = sum(len(tagging_metrics.get_entities([names[t] for t in s["tags"]]))
                   for s in sentences)
    assert results["windows"] == pytest.approx({"precision": 1.0, "recall": 1.0, "f1": 1.0,
                                                "num_sentences": 40, "num_entities": entities})
    # Truncation at 6 pieces scores only the entities of the words that fit.
    assert results["truncate"]["num_entities"] < entities


@pytest.mark.slow  # exports a SavedModel: left out of make test-fast
def test_the_exported_tagger_tags_a_long_text_from_every_window(tmp_path, tokenizer):
    model_dir, model = make_model_dir(tmp_path / "run", "tagging", seq_length=SEQ, seed=4)
    scramble(model, seed=4, scale=0.5)
    save_checkpoint(model, str(model_dir), step=9)  # The scrambled weights, as the latest.
    export_saved_model(str(model_dir), str(tmp_path / "export"))
    text = words_text(60, 12)
    words = text.split()
    tags = manual_word_tags(model, tokenizer, text, SEQ)  # computed once, used twice
    expected = [(kind, " ".join(words[a:b])) for kind, a, b in tagging_metrics.get_entities(
        tags, scheme="IOB2")]
    assert expected and max(b for _, _, b in tagging_metrics.get_entities(
        tags)) > SEQ - 2  # Past the first window.
    for source in ("model_dir", "saved_model"):
        path = model_dir if source == "model_dir" else tmp_path / "export"
        predictor = predict.load_predictor(**{source: str(path)})
        out = predictor({"text": [text]})
        assert entities_of(out, 0) == expected, source


def test_a_resume_must_read_the_same_rows(tiny_pretrained, tmp_path):
    from finetune_testing import shared_file  # noqa: PLC0415

    from bert_trainer.tasks import finetuning, registry  # noqa: PLC0415

    def task(**options):
        config = finetuning.FinetuneConfig(seq_length=SEQ, **options)
        return registry.build_task(registry.resolve_task_data("sst2"),
                                   finetuning.spec_from_checkpoint(tiny_pretrained["dir"]),
                                   config=config, data=finetuning.DataConfig(
                                       train_file=shared_file("sst2/dev.tsv")))

    first = task()
    first.build_model()
    first.write_model_info(str(tmp_path))
    first.check_resume(str(tmp_path))  # No checkpoint yet: anything goes.
    task(long_texts="truncate").check_resume(str(tmp_path))
    (tmp_path / "ckpt-3.index").write_bytes(b"")
    task(window_pooling="max").check_resume(str(tmp_path))  # Evaluation only: allowed.
    with pytest.raises(UserError, match=r"was trained with long_texts='windows'; this run asks "
                                        r"for long_texts='truncate' \(other training rows\)"):
        task(long_texts="truncate").check_resume(str(tmp_path))
    with pytest.raises(UserError, match=r"was trained with doc_stride=None; this run asks for "
                                        r"doc_stride=5"):
        task(doc_stride=5).check_resume(str(tmp_path))
