"""`predict` reads a task's own TSV files (their header names the text columns) and refuses
a file of which no line could be read, instead of writing an empty output and exiting 0."""

import io

import pytest
import tensorflow as tf

from bert_trainer.errors import UserError
from bert_trainer.export import predict


def lines(*texts: str) -> list[bytes]:
    return [t.encode("utf-8") + b"\n" for t in texts]


def test_sst2_header_maps_sentence_to_text_and_ignores_the_label():
    got = list(predict.read_inputs(lines("sentence\tlabel", "a fine film \t1", "dull\t0"),
                                   "tsv", ("text",)))
    assert got == [(2, {"text": "a fine film "}), (3, {"text": "dull"})]


@pytest.mark.parametrize("header,row,expected", [
    ("index\tsentence1\tsentence2\tlabel", "0\ta\tb\t1", {"text": "a", "text_b": "b"}),
    ("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate", "0\t1\t2\tq\tr\t0",
     {"text": "q", "text_b": "r"}),
    ("index\tquestion\tsentence\tlabel", "0\tq\ts\tentailment", {"text": "q", "text_b": "s"}),
    ("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", "1\t7\t8\tx\ty",
     {"text": "x", "text_b": "y"}),
    ("text_b\ttext", "second\tfirst", {"text": "first", "text_b": "second"}),
])
def test_glue_pair_headers(header, row, expected):
    assert list(predict.read_inputs(lines(header, row), "tsv", ("text", "text_b"))) == [
        (2, expected)]


def test_a_headerless_tsv_is_still_positional():
    assert list(predict.read_inputs(lines("a\tb"), "tsv", ("text", "text_b"))) == [
        (1, {"text": "a", "text_b": "b"})]


def _length_predictor():
    def fn(text):
        return {"score": tf.cast(tf.strings.length(text), tf.float32)}
    return predict.Predictor(("text",), fn, "regression")


def test_a_file_with_no_readable_line_is_an_error_not_an_empty_answer():
    out = []
    raw = lines("id\tsentence_x\tlabel", "1\ta\t0", "2\tb\t1")  # 3 columns, no known header
    with pytest.raises(UserError, match=r"^dev.tsv: none of its 3 input lines could be read "
                                        r"\(first: line 1 has 3 tab-separated columns, "
                                        r"expected 1 \(text\)\); the model reads text: give a "
                                        r"TSV header naming them, or --format=text/jsonl$"):
        predict.predict_lines(_length_predictor(), raw, out.append, fmt="tsv",
                              source="dev.tsv", progress=predict.Progress(io.StringIO()))
    assert out == []


def test_some_bad_lines_among_good_ones_are_still_skipped():
    out = []
    summary = predict.predict_lines(_length_predictor(), lines("ab", "a\tb", "abc"),
                                    out.append, fmt="tsv")
    assert (summary.answered, summary.skipped, len(out)) == (2, 1, 2)
