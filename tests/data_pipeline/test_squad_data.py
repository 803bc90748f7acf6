"""SQuAD windows and postprocessing: exact answer text recovery on the real dev sample."""

import json

import numpy as np
import pytest
import tensorflow as tf

from bert_trainer import features
from bert_trainer.errors import UserError
from bert_trainer.tasks import registry
from bert_trainer.tasks.squad import data as squad_data


@pytest.fixture
def dev_raw(shared_dir):
    return registry.get_task_data("squad").load(
        "eval", file=str(shared_dir / "data/squad/dev-v1.1-sample.json"))


def _squad_file(tmp_path, qas_by_context, version="v2.0"):
    paragraphs = [{"context": c, "qas": qas} for c, qas in qas_by_context]
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"version": version, "data": [{"paragraphs": paragraphs}]}))
    return registry.get_task_data("squad_v2").load("eval", file=str(path))


def _one_hot_logits(windows, seq_length):
    start = np.full((len(windows), seq_length), -10.0)
    end = np.full((len(windows), seq_length), -10.0)
    for i, w in enumerate(windows):
        start[i, w.start_position], end[i, w.end_position] = 10.0, 10.0
    return start, end


@pytest.mark.slow  # over a few seconds: left out of make test-fast
@pytest.mark.parametrize("seq_length,doc_stride", [(384, 128), (128, 48)])
def test_gold_spans_recover_answer_text(dev_raw, tokenizer, seq_length, doc_stride):
    data = squad_data.squad_eval_data(dev_raw, tokenizer, seq_length=seq_length,
                                      doc_stride=doc_stride, max_query_length=64, batch_size=64)
    assert len(data.examples) == 1449
    assert len(data.features) > (1449 if seq_length == 384 else 2 * 1449)  # Long contexts split.
    predictions = squad_data.postprocess_squad(data.examples, data.features,
                                               *_one_hot_logits(data.features, seq_length))
    labelled = {w.example_index: w.answer_index for w in data.features if w.answer_index >= 0}
    assert len(labelled) == 1449  # Every question's answer lies in some window.
    recovered = [predictions[ex.id] == ex.answer_texts[labelled[i]]
                 for i, ex in enumerate(data.examples)]
    first = [predictions[ex.id] == ex.answer_texts[0] for ex in data.examples]
    print(f"SQuAD recovery: labelled answer {np.mean(recovered):.2%}, "
          f"first answer {np.mean(first):.2%}")
    assert np.mean(recovered) >= 0.99
    # Accepted first-answer misses (16 of 1449): answer_start inside a longer piece with no
    # whole-piece copy anywhere ("8" of "20–18", "5" of "50", "ten" of "contenders", "20,980"
    # of "£20,980" whose vocab piece is "£2"); the label then uses another annotator's answer.
    assert np.mean(first) >= 0.985


def test_windows_cover_every_piece_once_with_max_context(dev_raw, tokenizer):
    seq, stride, query = 96, 32, 24
    data = squad_data.squad_eval_data(dev_raw.take(60), tokenizer, seq_length=seq,
                                      doc_stride=stride, max_query_length=query, batch_size=8)
    by_example = {}
    for w in data.features:
        by_example.setdefault(w.example_index, []).append(w)
    for index, windows in by_example.items():
        assert [w.window_index for w in windows] == list(range(len(windows)))
        spans = [tuple(s) for w in windows for s in w.char_spans[w.char_spans[:, 0] >= 0]]
        max_spans = [tuple(s) for w in windows for s in w.char_spans[w.is_max_context]]
        assert sorted(set(spans)) == sorted(max_spans)  # Each piece: max context exactly once.
        firsts = [int(np.argmax(w.char_spans[:, 0] >= 0)) for w in windows]
        question_len = firsts[0] - 2
        assert question_len <= query
        # Consecutive windows start `doc_stride` pieces apart: their first pieces are `stride`
        # pieces apart in the concatenated context.
        piece_index = {s: i for i, s in enumerate(sorted(set(spans)))}
        starts = [piece_index[tuple(w.char_spans[f])] for w, f in zip(windows, firsts,
                                                                      strict=True)]
        assert starts == [stride * i for i in range(len(windows))], index


def test_eval_and_training_batches(dev_raw, tokenizer):
    data = squad_data.squad_eval_data(dev_raw.take(40), tokenizer, seq_length=64,
                                      doc_stride=24, max_query_length=16, batch_size=16)
    batches = list(data.dataset)
    assert sum(b[squad_data.UNIQUE_IDS].shape[0] for b in batches) == len(data.features)
    ids = np.concatenate([b[squad_data.UNIQUE_IDS].numpy() for b in batches])
    assert ids.tolist() == list(range(len(data.features)))
    train = squad_data.squad_dataset(dev_raw.take(40), tokenizer, seq_length=64, doc_stride=24,
                                     max_query_length=16, batch_size=16, is_training=True,
                                     shuffle_buffer=32, seed=0)
    for batch in [batches[0], next(iter(train))]:
        for key in features.ENCODER_INPUTS:
            assert batch[key].shape == (16, 64) and batch[key].dtype == tf.int32, key
        for key in (features.START_POSITIONS, features.END_POSITIONS):
            assert batch[key].shape == (16,) and batch[key].dtype == tf.int32, key
    assert squad_data.UNIQUE_IDS not in train.element_spec
    assert train.element_spec[features.START_POSITIONS].shape.as_list() == [16]


def test_input_context_shards_examples(dev_raw, tokenizer):
    shards = [squad_data.squad_eval_data(dev_raw.take(30), tokenizer, seq_length=64,
                                         doc_stride=24, max_query_length=16, batch_size=8,
                                         input_context=tf.distribute.InputContext(2, i, 2))
              for i in range(2)]
    ids = [{ex.id for ex in shard.examples} for shard in shards]
    assert len(ids[0]) == len(ids[1]) == 15 and not ids[0] & ids[1]
    assert ids[0] | ids[1] == {ex.id for ex in squad_data.squad_examples(dev_raw.take(30))}
    for shard in shards:  # Windows belong to the shard's own examples.
        assert {w.example_id for w in shard.features} == {ex.id for ex in shard.examples}


def test_v1_training_keeps_only_windows_with_the_answer(dev_raw, tokenizer):
    examples = list(squad_data.squad_examples(dev_raw.take(30)))
    options = dict(seq_length=64, doc_stride=24, max_query_length=16)
    train = list(squad_data.squad_windows(examples, tokenizer, is_training=True, **options))
    evals = list(squad_data.squad_windows(examples, tokenizer, is_training=False, **options))
    assert len(train) == sum(w.answer_index >= 0 for w in evals) < len(evals)
    for w in train:
        assert w.start_position > 0 and w.end_position >= w.start_position
        ex = examples[w.example_index]
        assert w.example_id == ex.id
        text = ex.context[w.char_spans[w.start_position, 0]:w.char_spans[w.end_position, 1]]
        assert text == ex.answer_texts[w.answer_index]


def test_v2_unanswerable_points_at_cls(tmp_path, tokenizer):
    context = "Alpha beta gamma. " * 20 + "The capital of France is Paris."
    raw = _squad_file(tmp_path, [(context, [
        {"id": "a", "question": "What is the capital of France?", "is_impossible": False,
         "answers": [{"text": "Paris", "answer_start": context.index("Paris")}]},
        {"id": "b", "question": "What is the capital of Mars?", "is_impossible": True,
         "answers": []}])])
    examples = list(squad_data.squad_examples(raw))
    windows = list(squad_data.squad_windows(examples, tokenizer, seq_length=48, doc_stride=16,
                                            max_query_length=16, is_training=True,
                                            version_2=True))
    answerable = [w for w in windows if w.example_index == 0]
    impossible = [w for w in windows if w.example_index == 1]
    assert len(answerable) == len(impossible) > 3  # v2.0 keeps every window.
    assert all((w.start_position, w.end_position) == (0, 0) for w in impossible)
    hits = [w for w in answerable if w.start_position > 0]
    assert 1 <= len(hits) < len(answerable)
    assert all((w.start_position, w.end_position) == (0, 0) for w in answerable
               if w.start_position == 0)
    w = hits[0]
    assert context[w.char_spans[w.start_position, 0]:w.char_spans[w.end_position, 1]] == "Paris"


def test_non_ascii_offsets(tmp_path, tokenizer):
    context = "Le café «Zürich» à Genève — naïve 東京 crème brûlée, ﬁne."
    answers = ["Zürich", "Genève", "東京", "crème brûlée", "ﬁne"]
    raw = _squad_file(tmp_path, [(context, [
        {"id": str(i), "question": "Où?", "is_impossible": False,
         "answers": [{"text": a, "answer_start": context.index(a)}]}
        for i, a in enumerate(answers)])])
    data = squad_data.squad_eval_data(raw, tokenizer, seq_length=64, doc_stride=32,
                                      max_query_length=8, batch_size=8)
    predictions = squad_data.postprocess_squad(data.examples, data.features,
                                               *_one_hot_logits(data.features, 64))
    assert predictions == {str(i): a for i, a in enumerate(answers)}


def test_postprocess_v2_threshold_order_and_length(tmp_path, tokenizer):
    context = "one two three four five six seven eight nine ten"
    raw = _squad_file(tmp_path, [(context, [
        {"id": "q", "question": "n?", "is_impossible": False,
         "answers": [{"text": "three", "answer_start": 8}]}])])
    data = squad_data.squad_eval_data(raw, tokenizer, seq_length=32, doc_stride=8,
                                      max_query_length=4, batch_size=4)
    (window,) = data.features
    first = int(np.argmax(window.char_spans[:, 0] >= 0))  # "one"
    three, four, five = first + 2, first + 3, first + 4
    start, end = np.full((1, 32), -5.0), np.full((1, 32), -5.0)
    start[0, three], start[0, four] = 3.0, 1.0
    end[0, five], end[0, four] = 2.0, 1.5  # Best: "three four five" = 5.0.
    start[0, 0], end[0, 0] = 3.0, 3.0  # [CLS]: 6.0
    post = lambda **kw: squad_data.postprocess_squad(data.examples, data.features, start,
                                                     end, **kw)["q"]
    assert post() == "three four five"  # v1.1 never answers [CLS].
    assert post(version_2=True) == ""  # 6.0 - 5.0 > 0.0
    assert post(version_2=True, null_threshold=1.5) == "three four five"
    assert post(max_answer_length=2) == "three four"  # 4.5 beats "four five" (3.0).
    start[0, three] = -6.0  # Without "three", the best two-piece span is "four five".
    assert post(max_answer_length=2) == "four five"  # 1.0 + 2.0 beats "four" (2.5).
    with pytest.raises(ValueError, match="missing unique ids"):
        squad_data.postprocess_squad(data.examples, data.features, start, end,
                                     unique_ids=[7])


def test_postprocess_with_gathered_order(dev_raw, tokenizer):
    data = squad_data.squad_eval_data(dev_raw.take(20), tokenizer, seq_length=64,
                                      doc_stride=24, max_query_length=16, batch_size=8)
    start, end = _one_hot_logits(data.features, 64)
    order = np.random.default_rng(0).permutation(len(data.features))
    shuffled = squad_data.postprocess_squad(data.examples, data.features, start[order],
                                            end[order], unique_ids=order)
    assert shuffled == squad_data.postprocess_squad(data.examples, data.features, start, end)


def test_bad_window_arguments(dev_raw, tokenizer):
    with pytest.raises(UserError, match="seq_length=20 must exceed max_query_length=64"):
        list(squad_data.squad_windows([], tokenizer, seq_length=20, is_training=False))
    with pytest.raises(UserError, match="doc_stride=0 must be >= 1"):
        list(squad_data.squad_windows([], tokenizer, doc_stride=0, is_training=False))
