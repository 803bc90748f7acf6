"""Local file readers: real GLUE/IMDB/CoNLL/SQuAD samples, and every bad-input message."""

import json

import pytest

from bert_trainer.data import sources
from bert_trainer.data.sources import ReadStats, TextColumns
from bert_trainer.errors import UserError

SST2 = TextColumns("sentence", None, "label")
MRPC = TextColumns("#1 String", "#2 String", "Quality")


def _write(tmp_path, name, content, mode="w"):
    path = tmp_path / name
    if mode == "wb":
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return str(path)


def test_sst2_tsv_rows_and_line_numbers(shared_dir):
    path = str(shared_dir / "data/sst2/dev.tsv")
    rows = list(sources.read_table(path, SST2, delimiter="\t"))
    assert len(rows) == 872
    assert rows[0].line == 2  # Line 1 is the header.
    assert rows[0].text.startswith("it 's a charming and often affecting journey")
    assert rows[0].label == "1" and rows[0].text_b is None
    assert {r.label for r in rows} == {"0", "1"}


def test_mrpc_tsv_with_bom_header_and_quotes(shared_dir):
    # MRPC's header starts with a UTF-8 BOM and its text holds bare `"`: no quoting in TSV.
    path = str(shared_dir / "data/mrpc/train.tsv")
    rows = list(sources.read_table(path, MRPC, delimiter="\t"))
    assert len(rows) == 3668
    assert rows[0].text.startswith('Amrozi accused his brother , whom he called " the witness "')
    assert rows[0].text_b.startswith("Referring to him as only")
    assert rows[0].label == "1" and rows[1].label == "0"


def test_imdb_sample_broken_rows_error_then_skipped(shared_dir):
    # The sample holds 50 review fragments without a label column (a raw newline in a review).
    path = str(shared_dir / "data/imdb/train_sample.tsv")
    with pytest.raises(UserError, match=r"train_sample\.tsv:33: expected at least 2 columns, "
                                        r"found 1; .*--skip_bad_rows"):
        list(sources.read_table(path, SST2, delimiter="\t"))
    stats = ReadStats(path)
    rows = list(sources.read_table(path, SST2, delimiter="\t", skip_bad_rows=True, stats=stats))
    assert (len(rows), stats.examples, stats.skipped) == (1949, 1949, 50)
    assert stats.skipped_lines[:3] == [33, 61, 72]
    assert sum(r.label == "1" for r in rows) == 957
    assert "skipped 50 bad rows (lines [33, 61, 72, 95, 109], ...)" in stats.summary()


def test_csv_quoting_spans_lines(tmp_path):
    path = _write(tmp_path, "x.csv", 'id,text,label\n1,"a, ""quoted""\nsecond line",pos\n\n'
                                     '2,plain,neg\n')
    rows = list(sources.read_table(path, TextColumns(1, None, "label"), delimiter=","))
    assert [r.text for r in rows] == ['a, "quoted"\nsecond line', "plain"]
    assert [r.line for r in rows] == [3, 5]  # The line where each record ends.
    assert [r.label for r in rows] == ["pos", "neg"]


def test_csv_bad_quoting(tmp_path):
    path = _write(tmp_path, "q.csv", 'text,label\nok,1\n"a"b,0\n')
    with pytest.raises(UserError, match=r"q\.csv:3: bad CSV quoting \(.*\); fix the quotes"):
        list(sources.read_table(path, TextColumns("text"), delimiter=","))


def test_jsonl_rows_and_errors(tmp_path):
    path = _write(tmp_path, "x.jsonl", '{"q": "a", "p": "b", "y": 2}\n\n{"q": "c", "p": "d", '
                                       '"y": "x"}\n{"q": "e"}\nnot json\n')
    columns = TextColumns("q", "p", "y")
    with pytest.raises(UserError, match=r"x\.jsonl:4: object lacks the keys \['p', 'y'\]"):
        list(sources.read_jsonl(path, columns))
    stats = ReadStats(path)
    rows = list(sources.read_jsonl(path, columns, skip_bad_rows=True, stats=stats))
    assert [(r.line, r.text, r.text_b, r.label) for r in rows] == [(1, "a", "b", "2"),
                                                                   (3, "c", "d", "x")]
    assert stats.skipped_lines == [4, 5]


def test_non_utf8_names_byte_offset(tmp_path):
    path = _write(tmp_path, "latin1.tsv", "sentence\tlabel\nok\t1\ncaf\xe9\t0\n".encode("latin-1"),
                  mode="wb")
    # Offset: "sentence\tlabel\n" is 15 bytes, "ok\t1\n" 5, "caf" 3 → 23.
    with pytest.raises(UserError, match=r"latin1\.tsv:3: not UTF-8 \(byte 0xe9 at byte offset "
                                        r"23\); re-save the file as UTF-8"):
        list(sources.read_table(path, SST2, delimiter="\t"))


def test_empty_missing_and_header_errors(tmp_path):
    with pytest.raises(UserError, match="empty.tsv is empty"):
        list(sources.read_table(_write(tmp_path, "empty.tsv", ""), SST2, delimiter="\t"))
    with pytest.raises(UserError, match="nope.tsv does not exist"):
        list(sources.read_table(str(tmp_path / "nope.tsv"), SST2, delimiter="\t"))
    only_header = _write(tmp_path, "h.tsv", "sentence\tlabel\n")
    with pytest.raises(UserError, match="h.tsv holds no examples"):
        list(sources.read_table(only_header, SST2, delimiter="\t"))
    with pytest.raises(UserError, match=r"h.tsv:1: header has no column 'text' \(it has "
                                        r"\['sentence', 'label'\]\)"):
        list(sources.read_table(only_header, TextColumns("text"), delimiter="\t"))
    all_bad = _write(tmp_path, "bad.tsv", "sentence\tlabel\nno label\n")
    with pytest.raises(UserError, match=r"holds no examples \(all 1 rows were bad\)"):
        list(sources.read_table(all_bad, SST2, delimiter="\t", skip_bad_rows=True))


def test_file_format_from_extension():
    assert [sources.file_format(p) for p in ("a.tsv", "b.CSV", "c.jsonl", "d.json",
                                             "eng.txt")] == ["tsv", "csv", "jsonl", "json",
                                                             "conll"]
    assert sources.file_format("eng.testa", "conll") == "conll"
    with pytest.raises(UserError, match="cannot tell the format of eng.testa"):
        sources.file_format("eng.testa")


def test_conll_sentences_skip_docstart(shared_dir):
    path = str(shared_dir / "data/conll2003/eng.testa")
    sentences = list(sources.read_conll(path))
    assert len(sentences) == 3250
    assert all(words and "-DOCSTART-" not in words for _, words, _ in sentences)
    first_line, words, tags = sentences[0]
    assert first_line == 1 and words[:3] == ["CRICKET", "-", "LEICESTERSHIRE"]
    assert tags[:3] == ["O", "O", "I-ORG"]
    assert sentences[1] == (13, ["LONDON", "1996-08-30"], ["I-LOC", "O"])


def test_conll_bad_line(tmp_path):
    path = _write(tmp_path, "x.conll", "-DOCSTART- -X- O O\n\nA NN O\nB\n\nC NN I-PER\n")
    with pytest.raises(UserError, match=r"x\.conll:4: expected a word and a tag"):
        list(sources.read_conll(path))
    stats = ReadStats(path)
    assert list(sources.read_conll(path, skip_bad_rows=True, stats=stats)) == [
        (6, ["C"], ["I-PER"])]
    assert (stats.examples, stats.skipped) == (1, 1)


def test_squad_json_real_sample(shared_dir):
    rows = sources.read_squad_json(str(shared_dir / "data/squad/dev-v1.1-sample.json"))
    assert len(rows) == 1449
    first = rows[0]
    assert first["id"] == "56be4db0acb8001400a502ec"
    assert first["answers"]["text"][0] == "Denver Broncos"
    assert first["context"][177:177 + 14] == "Denver Broncos"
    assert not any(r["is_impossible"] for r in rows)


def _squad(tmp_path, answers, is_impossible=False):
    qa = {"id": "q1", "question": "Who?", "answers": answers, "is_impossible": is_impossible}
    doc = {"version": "v2.0", "data": [{"paragraphs": [{"context": "Ann met Bob.",
                                                        "qas": [qa]}]}]}
    return _write(tmp_path, "s.json", json.dumps(doc))


def test_squad_json_answer_outside_context(tmp_path):
    path = _squad(tmp_path, [{"text": "Bob", "answer_start": 2}])
    with pytest.raises(UserError, match=r"s\.json data\[0\]\.paragraphs\[0\]\.qas\[0\]: question "
                                        r"q1: answer 'Bob' is not in the context at 2"):
        sources.read_squad_json(path)
    with pytest.raises(UserError, match=r"holds no examples \(all 1 rows were bad\)"):
        sources.read_squad_json(path, skip_bad_rows=True)


def test_squad_json_v2_impossible_and_syntax_error(tmp_path):
    rows = sources.read_squad_json(_squad(tmp_path, [], is_impossible=True))
    assert rows[0]["is_impossible"] and rows[0]["answers"] == {"text": [], "answer_start": []}
    broken = _write(tmp_path, "broken.json", '{"data": [\n{"paragraphs": }\n]}')
    with pytest.raises(UserError, match=r"broken\.json:2: invalid JSON \(Expecting value at "
                                        r"column 16\)"):
        sources.read_squad_json(broken)
