"""Demo corpus from the standard library: clean prose, bert format, deterministic, usable."""

import importlib.util
import json
import re

import pytest
from conftest import REPO

from bert_trainer.data import text_corpus
from bert_trainer.demo import corpus as demo_corpus


def test_markup_is_unwrapped_and_code_dropped():
    doc = """Return the :func:`len` of *items*, see ``sorted()`` and `the docs <http://x>`_.

    >>> len([1, 2])
    2

Example::

    for x in y:
        pass

:param items: the items.
f(a, b)
Short line.

It also works on :class:`~collections.deque` objects, which is **handy**.
"""
    assert demo_corpus.prose_paragraphs(doc) == [
        "Return the len of items, see sorted() and the docs.",
        "It also works on collections.deque objects, which is handy.",
    ]


def test_corpus_is_clean_deterministic_bert_format(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    stats = demo_corpus.build_demo_corpus(str(a), max_bytes=150_000)
    demo_corpus.build_demo_corpus(str(b), max_bytes=150_000)
    raw = a.read_bytes()
    assert raw == b.read_bytes()
    assert 150_000 <= stats["bytes"] == len(raw) < 250_000
    documents = raw.decode("utf-8").split("\n\n")[:-1]
    assert stats["documents"] == len(documents) >= 20
    sentences = [s for d in documents for s in d.split("\n")]
    assert stats["sentences"] == len(sentences) and all(sentences)
    assert stats["words"] == sum(len(s.split()) for s in sentences)
    # Prose only: no doctest prompts, reST roles, literals or directives survive.
    assert not any(re.search(r">>>|:\w+:`|``|^\.\. ", s) for s in sentences)
    assert all(len(s.split()) >= demo_corpus.MIN_WORDS_PER_SENTENCE for s in sentences)
    assert sum(s[0].isupper() for s in sentences) / len(sentences) > 0.9
    assert text_corpus.detect_format(str(a)) == "lines"


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
def test_script_writes_the_full_corpus(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location(
        "make_demo_corpus", REPO / "scripts" / "make_demo_corpus.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "corpus.txt"
    assert script.main([f"--output={out}"]) == 0
    stats = json.loads(capsys.readouterr().out)
    # The whole standard library: about 1.2 MB on Python 3.11 (pydoc topics + docstrings +
    # comments); bounds leave room for other Python versions.
    assert 800_000 < stats["bytes"] == out.stat().st_size < 4_000_000
    assert stats["documents"] > 200 and stats["words"] > 100_000
