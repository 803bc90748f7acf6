"""Corpus BLEU equals sacreBLEU's `corpus_bleu` (13a tokenizer, exp smoothing) to 0.01 BLEU."""

import random

import pytest

from bert_trainer.metrics import bleu

sacrebleu = pytest.importorskip("sacrebleu")

# Text 13a treats specially: HTML entities, ASCII symbols, numbers with . , and -, quotes.
_NOISE = ["&amp;", "&quot;hola&quot;", "&lt;b&gt;", "3.5", "1,000", "10-20", "$5", "50%",
          "\"sí\"", "(así)", "¿qué?", "¡ya!", "mañana", "él", "O'Brien", "e-mail", "<skipped>",
          "...", "a/b", "#1", "x@y.com", "Él,", "3.", ",5"]


def _references(shared_dir, count=400):
    """Spanish sides of the first `count` dev pairs (header skipped)."""
    path = shared_dir / "data" / "spa_eng" / "dev.tsv"
    lines = path.read_text(encoding="utf-8").splitlines()[1:count + 1]
    return [line.split("\t")[1] for line in lines]


def _perturb(sentence: str, rng: random.Random, vocabulary: list[str]) -> str:
    """A deterministic 'system output': words dropped, swapped, replaced, noise added."""
    words = sentence.split()
    kind = rng.random()
    if kind < 0.05:
        return ""
    if kind < 0.1:
        return sentence  # perfect
    out = []
    for word in words:
        r = rng.random()
        if r < 0.1:
            continue  # dropped
        if r < 0.2:
            out.append(rng.choice(vocabulary))  # replaced
        elif r < 0.25:
            out.append(rng.choice(_NOISE))
        else:
            out.append(word)
        if rng.random() < 0.05:
            out.append(rng.choice(vocabulary))  # inserted: longer than the reference
    if len(out) > 1 and rng.random() < 0.3:
        i = rng.randrange(len(out) - 1)
        out[i], out[i + 1] = out[i + 1], out[i]  # swapped
    if rng.random() < 0.1:
        out = [w.lower() for w in out]  # case counts in sacreBLEU's default
    return " ".join(out)


def _assert_same(hypotheses, references_per_segment):
    ours = bleu.corpus_bleu(hypotheses, references_per_segment)
    streams = [list(s) for s in zip(*[[r] if isinstance(r, str) else r
                                      for r in references_per_segment], strict=True)]
    theirs = sacrebleu.corpus_bleu(hypotheses, streams)
    assert ours.score == pytest.approx(theirs.score, abs=0.01)
    assert ours.sys_len == theirs.sys_len and ours.ref_len == theirs.ref_len
    assert list(ours.counts) == list(theirs.counts)
    assert list(ours.totals) == list(theirs.totals)
    assert ours.brevity_penalty == pytest.approx(theirs.bp, abs=1e-9)
    assert list(ours.precisions) == pytest.approx(list(theirs.precisions), abs=1e-9)
    return ours, theirs


def test_tokenize_13a_matches_sacrebleu():
    tokenizer = sacrebleu.BLEU().tokenizer
    texts = _NOISE + ["¿Dónde está el baño?", "Tom dijo: \"No, gracias.\"", "Es 3.14, no 3,15.",
                      "Cuesta 1.000-2.000 $ (aprox.)", "A&amp;B &quot;x&quot;  ", "fin-\nde",
                      "  spaced   out\t", "Hola.Adiós", "¡Qué día!", "x -- y", "[a]{b}~c^d_e`f"]
    for text in texts:
        assert " ".join(bleu.tokenize_13a(text)) == tokenizer(text.rstrip()), text


def test_real_pairs_with_perturbed_hypotheses(shared_dir):
    references = _references(shared_dir)
    vocabulary = sorted({w for s in references for w in s.split()})
    rng = random.Random(19)
    hypotheses = [_perturb(s, rng, vocabulary) for s in references]
    assert sum(h == "" for h in hypotheses) > 5  # the corpus has empty outputs
    ours, _ = _assert_same(hypotheses, references)
    assert 20 < ours.score < 90  # a realistic, not degenerate, score
    perfect, _ = _assert_same(references, references)
    assert perfect.score == pytest.approx(100.0, abs=1e-9)


def test_multiple_references(shared_dir):
    references = _references(shared_dir, 200)
    vocabulary = sorted({w for s in references for w in s.split()})
    rng = random.Random(7)
    second = [_perturb(s, rng, vocabulary) or s for s in references]
    third = [s.lower() for s in references]
    hypotheses = [_perturb(s, rng, vocabulary) for s in references]
    per_segment = [list(refs) for refs in zip(references, second, third, strict=True)]
    multi, _ = _assert_same(hypotheses, per_segment)
    single = bleu.corpus_bleu(hypotheses, references)
    assert multi.score > single.score  # more references can only match more


@pytest.mark.parametrize("hypotheses,references", [
    (["", ""], ["Hola mundo .", "Adiós"]),  # empty hypothesis corpus
    (["a b c d"], ["e f g h"]),  # nothing matches
    (["el perro come"], ["el gato bebe"]),  # only unigrams match
    (["el gato negro come"], ["el gato blanco come"]),  # no 3- or 4-gram matches
    (["a b"], ["a b"]),  # no 3-grams at all: log(0) floor
    (["el gato come pescado y carne todos los días en casa"], ["el gato come"]),  # longer
    (["el gato"], ["el gato come pescado en casa"]),  # brevity penalty
    (["&amp; &quot;sí&quot;"], ['& "sí"']),  # entities unescaped on both sides
])
def test_edge_cases(hypotheses, references):
    _assert_same(hypotheses, references)


def test_closest_reference_length_ties_go_to_the_shorter():
    # Hypothesis of 3 tokens, references of 2 and 4: both 1 away, so ref_len is 2.
    result, theirs = _assert_same(["a b c"], [["a b", "a b c d"]])
    assert result.ref_len == 2 == theirs.ref_len


def test_variable_reference_counts():
    result = bleu.corpus_bleu(["a b c d", "e f g h"], [["a b c d"], ["e f g x", "e f g h"]])
    assert result.score == pytest.approx(100.0)


def test_empty_corpus_and_bad_arguments():
    assert bleu.corpus_bleu([], []).score == 0.0
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        bleu.corpus_bleu(["a", "b"], ["a"])
    with pytest.raises(ValueError, match=r"references\[0\] must be"):
        bleu.corpus_bleu(["a"], [[]])
    assert "BLEU = 100.00" in str(bleu.corpus_bleu(["a b c d"], ["a b c d"]))
