"""Task data registry: names, presets for GLUE TSVs, label mapping, local tasks."""

import numpy as np
import pytest

from bert_trainer.data.sources import ReadStats, TextColumns
from bert_trainer.errors import UserError
from bert_trainer.tasks import registry

ALL_TASKS = ["cola", "conll2003", "imdb", "mnli", "mrpc", "qnli", "qqp", "rte", "squad",
             "squad_v2", "sst2", "stsb", "ted_hrlr_translate/pt_to_en", "wmt14_translate/de-en",
             "wnli"]


def _rows(dataset):
    return list(dataset.as_numpy_iterator())


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_registry_names_and_unknown_task():
    assert registry.dataset_names() == ALL_TASKS
    with pytest.raises(UserError, match=r"unknown task 'sst-2'; choose one of cola, conll2003, "
                                        r".*wnli, or use your own files with --train_file"):
        registry.get_task_data("sst-2")


def test_registry_entries():
    get = registry.get_task_data
    assert get("mnli").splits == {"train": "train", "eval": "validation_matched"}
    assert get("mnli").label_names == ("entailment", "neutral", "contradiction")
    assert get("stsb").family_name == "regression" and get("stsb").num_labels == 1
    assert get("stsb").label_names is None
    assert (get("squad").tfds_name, get("squad_v2").tfds_name) == ("squad/v1.1", "squad/v2.0")
    assert (get("squad").version_2, get("squad_v2").version_2) == (False, True)
    assert get("imdb").tfds_name == "imdb_reviews" and get("imdb").splits["eval"] == "test"
    assert get("conll2003").num_labels == 9 and get("conll2003").splits["eval"] == "dev"
    pairs = [n for n in ALL_TASKS if get(n).family_name in ("classification", "regression")
             and get(n).is_pair]
    assert pairs == ["mnli", "mrpc", "qnli", "qqp", "rte", "stsb", "wnli"]
    assert {get(n).tfds_name for n in pairs} == {f"glue/{n}" for n in pairs}


def test_sst2_preset_reads_glue_tsv(shared_dir):
    rows = _rows(registry.get_task_data("sst2").load(
        "eval", file=str(shared_dir / "data/sst2/dev.tsv")))
    assert len(rows) == 872
    assert set(rows[0]) == {"text", "label"}
    assert rows[0]["text"].startswith(b"it 's a charming") and rows[0]["label"] == 1
    assert rows[1]["label"] == 0 and rows[0]["label"].dtype == np.int64
    assert sum(r["label"] for r in rows) == 444  # Positive reviews of SST-2 dev.


def test_mrpc_preset_reads_pairs(shared_dir):
    rows = _rows(registry.get_task_data("mrpc").load(
        "eval", file=str(shared_dir / "data/mrpc/dev.tsv")))
    assert len(rows) == 408
    assert set(rows[0]) == {"text", "text_b", "label"}
    assert rows[0]["text"].startswith(b"He said the foodservice pie business")
    assert rows[0]["text_b"].startswith(b'" The foodservice pie business')
    assert sum(r["label"] for r in rows) == 279  # MRPC dev: 279 paraphrases of 408.


def test_label_names_ids_and_outside_label(tmp_path):
    path = _write(tmp_path, "mnli.tsv", "sentence1\tsentence2\tgold_label\n"
                                        "a\tb\tneutral\nc\td\t2\ne\tf\tmaybe\n")
    mnli = registry.get_task_data("mnli")
    with pytest.raises(UserError, match=r"mnli\.tsv:4: label 'maybe' is not in the label set "
                                        r"\['entailment', 'neutral', 'contradiction'\]"):
        mnli.load("train", file=path)
    good = _write(tmp_path, "good.tsv", "sentence1\tsentence2\tgold_label\n"
                                        "a\tb\tneutral\nc\td\t2\ne\tf\tentailment\n")
    assert [r["label"] for r in _rows(mnli.load("train", file=good))] == [1, 2, 0]


def test_regression_labels(tmp_path):
    stsb = registry.get_task_data("stsb")
    good = _write(tmp_path, "sts.tsv", "sentence1\tsentence2\tscore\na\tb\t4.25\nc\td\t0\n")
    rows = _rows(stsb.load("train", file=good))
    assert [r["label"] for r in rows] == [4.25, 0.0] and rows[0]["label"].dtype == np.float32
    bad = _write(tmp_path, "bad.tsv", "sentence1\tsentence2\tscore\na\tb\thigh\n")
    with pytest.raises(UserError, match=r"bad\.tsv:2: regression label 'high' is not a number"):
        stsb.load("train", file=bad)


def test_skip_bad_rows_counts_through_load(shared_dir):
    stats = ReadStats("imdb")
    rows = _rows(registry.get_task_data("imdb").load(
        "train", file=str(shared_dir / "data/imdb/train_sample.tsv"), skip_bad_rows=True,
        stats=stats))
    assert (len(rows), stats.skipped) == (1949, 50)
    assert sum(r["label"] for r in rows) == 957


def test_local_task_labels_from_training_file(tmp_path):
    path = _write(tmp_path, "t.jsonl", '{"q": "a", "p": "b", "y": 10}\n'
                                       '{"q": "c", "p": "d", "y": 2}\n')
    task = registry.local_task_data("mine", "classification",
                                     columns=TextColumns("q", "p", "y"))
    assert task.is_pair and task.label_names is None
    with pytest.raises(UserError, match="task 'mine' has no label names"):
        task.load("train", file=path)
    task = task.with_labels_from(path)
    assert task.label_names == ("2", "10")  # Numeric order, not string order.
    rows = _rows(task.load("train", file=path))
    assert [(r["text"], r["text_b"], r["label"]) for r in rows] == [(b"a", b"b", 1),
                                                                    (b"c", b"d", 0)]
    # With integer class names, "1" is a name (absent here), never the id 1.
    other = _write(tmp_path, "o.jsonl", '{"q": "a", "p": "b", "y": 1}\n')
    with pytest.raises(UserError, match=r"o\.jsonl:1: label '1' is not in the label set "
                                        r"\['2', '10'\]"):
        task.load("eval", file=other)


def test_unlabeled_file_has_no_label(tmp_path):
    path = _write(tmp_path, "u.tsv", "sentence\nhello\n")
    task = registry.local_task_data("u", "classification", label_names=["x", "y"],
                                     columns=TextColumns("sentence", None, None))
    assert _rows(task.load("eval", file=path)) == [{"text": b"hello"}]


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_conll_local_iob1_to_iob2_ids(shared_dir):
    task = registry.get_task_data("conll2003")
    rows = _rows(task.load("eval", file=str(shared_dir / "data/conll2003/eng.testa")))
    assert len(rows) == 3250
    names = task.label_names
    # IOB1 "I-ORG" opening the sentence becomes "B-ORG"; "I-LOC" after nothing → "B-LOC".
    assert [names[t] for t in rows[0]["tags"][:3]] == ["O", "O", "B-ORG"]
    assert [names[t] for t in rows[1]["tags"]] == ["B-LOC", "O"]
    assert rows[1]["tokens"].tolist() == [b"LONDON", b"1996-08-30"]


def test_tagging_labels_from_data_and_unknown_tag(tmp_path):
    path = _write(tmp_path, "x.conll", "A NN I-GENE\nB NN I-GENE\nC NN O\n\nD NN B-DRUG\n")
    task = registry.local_task_data("bio", "tagging").with_labels_from(path)
    assert task.label_names == ("O", "B-DRUG", "B-GENE", "I-GENE")
    assert [r["tags"].tolist() for r in _rows(task.load("train", file=path))] == [[2, 3, 0],
                                                                                   [1]]
    other = _write(tmp_path, "y.conll", "A NN O\n\nD NN B-PER\nE NN B-DRUG\n")
    with pytest.raises(UserError, match=r"y\.conll:4: tag 'B-DRUG' is not in the label set "
                                        r"\['O', 'B-PER'"):
        registry.get_task_data("conll2003").load("train", file=other)


def test_wrong_format_and_missing_source(tmp_path):
    path = _write(tmp_path, "x.json", "{}")
    with pytest.raises(UserError, match=r"x\.json: task 'sst2' reads TSV, CSV or JSONL, not json"):
        registry.get_task_data("sst2").load("train", file=path)
    with pytest.raises(UserError, match="task 'mine' has no TFDS source; pass its train data "
                                        "with --train_file"):
        registry.local_task_data("mine", "regression").load("train")
    with pytest.raises(UserError, match="unknown task family 'ner'; known: causal_lm, "
                                        "classification, masked_lm, regression, squad, tagging, "
                                        "translate"):
        registry.local_task_data("mine", "ner")


def test_many_labels_build_the_label_index_once_per_pass(tmp_path, monkeypatch):
    """10^4 distinct labels (one a row): the label index is built once per read of the file,
    not once per row (rows x labels work looked like a hang)."""
    from bert_trainer.tasks.classification import family  # noqa: PLC0415

    rows = 10_000
    path = _write(tmp_path, "many.tsv", "text\tlabel\n" + "".join(
        f"text {i}\tlab{i}\n" for i in range(rows)))
    calls = []
    build = family._label_index
    monkeypatch.setattr(family, "_label_index", lambda names: calls.append(1) or build(names))
    task = registry.local_task_data("many", "classification").with_labels_from(path)
    assert len(task.label_names) == rows
    dataset = task.load("train", file=path)  # reads every row once to check it
    assert len(calls) == 1
    labels = [int(r["label"]) for r in dataset.as_numpy_iterator()]
    assert len(calls) == 2  # and once more for the stream
    assert sorted(labels) == list(range(rows))


def test_one_number_spelled_two_ways_is_refused(tmp_path):
    """'1', '1.0' and '01' parse to one number: not three classes without a word."""
    path = _write(tmp_path, "spelled.tsv", "text\tlabel\na\t1\nb\t2\nc\t1.0\nd\t01\n")
    task = registry.local_task_data("spelled", "classification")
    with pytest.raises(UserError, match=r"spelled\.tsv:4: label '1\.0' is the number '1' "
                                        r"\(line 2\) written another way"):
        task.with_labels_from(path)
    # Distinct numbers, and long integers that one float cannot tell apart, stay classes.
    big = _write(tmp_path, "big.tsv", "text\tlabel\na\t12345678901234567890\n"
                                      "b\t12345678901234567891\nc\t1e3\nd\tnan\n")
    assert task.with_labels_from(big).label_names == (
        "12345678901234567890", "12345678901234567891", "1e3", "nan")
