"""Reading pretraining text: sentence splitting, Gutenberg headers, formats, bad input."""

import collections

import pytest

from bert_trainer.data import text_corpus
from bert_trainer.errors import UserError


def test_split_sentences_keeps_abbreviations_and_initials():
    text = ('Mr. Smith met Dr. J. R. Jones in the U.S. on Monday. "Where are you?" he asked.\n'
            "They left at noon! Then it rained, etc. and the St. Louis train was late. (It was.)")
    assert text_corpus.split_sentences(text) == [
        "Mr. Smith met Dr. J. R. Jones in the U.S. on Monday.",
        '"Where are you?" he asked.',
        "They left at noon!",
        "Then it rained, etc. and the St. Louis train was late.",
        "(It was.)",
    ]


def test_split_sentences_needs_a_capital_after_the_period():
    assert text_corpus.split_sentences("Pi is 3.14 or so. about that. Yes.") == [
        "Pi is 3.14 or so. about that.", "Yes."]


def test_gutenberg_header_and_footer_are_skipped(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("The Project Gutenberg EBook of A Book\n\nLicence text.\n"
                    "*** START OF THE PROJECT GUTENBERG EBOOK A BOOK ***\n\nCHAPTER I\n\n"
                    "It was a dark night.  The rain fell\nin torrents.\n\n"
                    "*** END OF THE PROJECT GUTENBERG EBOOK A BOOK ***\nMore licence.\n",
                    encoding="utf-8")
    assert list(text_corpus.read_documents([str(path)], "prose")) == [
        ["It was a dark night.", "The rain fell in torrents."]]


def test_real_gutenberg_book_starts_at_the_story(shared_dir):
    path = shared_dir / "data" / "corpus" / "gutenberg" / "austen-emma.txt"
    assert text_corpus.detect_format(str(path)) == "prose"
    first = next(text_corpus.read_documents([str(path)]))
    # The licence ("*END*THE SMALL PRINT!") and the "VOLUME I" / "CHAPTER I" headings are gone.
    assert first[0].startswith("Emma Woodhouse, handsome, clever, and rich")
    assert not any("Gutenberg" in s for s in first)


def test_formats_are_detected(shared_dir, tmp_path):
    corpus = shared_dir / "data" / "corpus"
    assert text_corpus.detect_format(str(corpus / "inaugural" / "1789-Washington.txt")) == "prose"
    lines = tmp_path / "lines.txt"
    lines.write_text("First sentence here.\nSecond one follows.\n\nNew document starts.\n"
                     "It ends here.\n", encoding="utf-8")
    assert text_corpus.detect_format(str(lines)) == "lines"
    assert list(text_corpus.read_documents([str(lines)])) == [
        ["First sentence here.", "Second one follows."],
        ["New document starts.", "It ends here."]]


def test_long_documents_are_cut_for_bounded_memory(tmp_path):
    path = tmp_path / "long.txt"
    path.write_text("".join(f"Sentence number {i} is here.\n" for i in range(25)),
                    encoding="utf-8")
    docs = list(text_corpus.read_documents([str(path)], "lines", max_document_sentences=10))
    assert [len(d) for d in docs] == [10, 10, 5]


def test_non_utf8_line_is_named_or_replaced(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("Good line.\nAnother good one.\nCaf\xe9 au lait.\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"latin1.txt: line 3 is not UTF-8.*--encoding_errors"):
        list(text_corpus.read_documents([str(path)], "lines"))
    stats = collections.Counter()
    docs = list(text_corpus.read_documents([str(path)], "lines", encoding_errors="replace",
                                           stats=stats))
    assert docs == [["Good line.", "Another good one.", "Caf\ufffd au lait."]]
    assert stats["bad_utf8_lines"] == 1
    docs = list(text_corpus.read_documents([str(path)], "lines", encoding_errors="skip"))
    assert docs == [["Good line.", "Another good one."]]


def test_expand_inputs_globs_and_comma_lists(tmp_path):
    for name in ("a.txt", "b.txt", "c.md"):
        (tmp_path / name).write_text("x\n", encoding="utf-8")
    spec = f"{tmp_path}/*.txt,{tmp_path}/c.md,{tmp_path}/a.txt"
    assert text_corpus.expand_inputs(spec) == [str(tmp_path / n) for n in ("a.txt", "b.txt",
                                                                          "c.md")]
    with pytest.raises(UserError, match=r"--input: '.*nothing\*.txt' matches no file"):
        text_corpus.expand_inputs(f"{tmp_path}/a.txt,{tmp_path}/nothing*.txt")
    with pytest.raises(UserError, match="--input is empty"):
        text_corpus.expand_inputs(" , ")
    with pytest.raises(UserError, match="input_format='xml' is unknown"):
        list(text_corpus.read_documents([str(tmp_path / "a.txt")], "xml"))
