"""Corpus BLEU (`metrics.bleu`): scores checked by hand, the settings that change them, and the
reference layout and argument checks the module adds to sacreBLEU."""

import math

import pytest
import sacrebleu

from bert_trainer.metrics import bleu


def _references(shared_dir, count):
    """Spanish sides of the first `count` dev pairs (header skipped)."""
    path = shared_dir / "data" / "spa_eng" / "dev.tsv"
    lines = path.read_text(encoding="utf-8").splitlines()[1:count + 1]
    return [line.split("\t")[1] for line in lines]


def test_a_sentence_scored_by_hand():
    # hyp:  the cat sat on the mat   ref: the cat sat on a mat   (6 tokens each, BP = 1)
    # 1-grams 5/6 ("the" credited once), 2-grams 3/5, 3-grams 2/4, 4-grams 1/3.
    result = bleu.corpus_bleu(["the cat sat on the mat"], ["the cat sat on a mat"])
    assert list(result.counts) == [5, 3, 2, 1] and list(result.totals) == [6, 5, 4, 3]
    assert result.score == pytest.approx(100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25, abs=1e-6)
    assert result.bp == 1.0 and result.sys_len == result.ref_len == 6


def test_brevity_penalty_by_hand():
    # Every n-gram matches, but the hypothesis has 4 tokens against 6: BP = exp(1 - 6/4).
    result = bleu.corpus_bleu(["a b c d"], ["a b c d e f"])
    assert result.score == pytest.approx(100 * math.exp(1 - 6 / 4), abs=1e-6)


def test_exp_smoothing_by_hand():
    # 1-grams 3/4, 2-grams 1/3, then no 3- or 4-gram matches: exp smoothing gives the k-th
    # unmatched order 1 / (2^k * total), i.e. 1/(2*2) for 3-grams and 1/(4*1) for 4-grams.
    result = bleu.corpus_bleu(["el gato negro come"], ["el gato blanco come"])
    assert result.score == pytest.approx(100 * (3 / 4 * 1 / 3 * 1 / 4 * 1 / 4) ** 0.25, abs=1e-6)


def test_13a_tokenization_splits_punctuation_and_unescapes_entities():
    assert bleu.corpus_bleu(["Hola, mundo."], ["Hola , mundo ."]).score == pytest.approx(100.0)
    assert bleu.corpus_bleu(["&amp; &quot;sí&quot;"], ['& "sí"']).score == pytest.approx(100.0)
    # Without 13a (whitespace tokens) the same pair would score far lower: the choice matters.
    untokenized = sacrebleu.metrics.BLEU(tokenize="none").corpus_score(
        ["Hola, mundo."], [["Hola , mundo ."]])
    assert untokenized.score < 50


def test_case_is_kept():
    assert bleu.corpus_bleu(["hola mundo y adiós"], ["Hola mundo y adiós"]).score < 100 - 1


def test_empty_hypotheses_score_zero():
    result = bleu.corpus_bleu(["", ""], ["Hola mundo .", "Adiós"])
    assert result.score == 0.0 and result.sys_len == 0 and result.ref_len == 4


def test_closest_reference_length_ties_go_to_the_shorter():
    # Hypothesis of 3 tokens, references of 2 and 4: both 1 away, so ref_len is 2.
    assert bleu.corpus_bleu(["a b c"], [["a b", "a b c d"]]).ref_len == 2


def test_variable_reference_counts():
    result = bleu.corpus_bleu(["a b c d", "e f g h"], [["a b c d"], ["e f g x", "e f g h"]])
    assert result.score == pytest.approx(100.0)
    assert bleu.corpus_bleu(["e f g h"], ["e f g x"]).score < 100 - 1


def test_settings_are_sacrebleus_defaults_and_the_layout_is_per_hypothesis(shared_dir):
    # Real references, three per segment: per-hypothesis lists in, sacreBLEU's streams out,
    # and the settings written out in `bleu.SETTINGS` give sacreBLEU's default score.
    references = _references(shared_dir, 200)
    second = [" ".join(reversed(s.split())) for s in references]
    third = [s.lower() for s in references]
    # Each hypothesis is closest to a different one of its references.
    hypotheses = [" ".join(refs[i % 3].split()[:-1] if i % 2 else refs[i % 3].split())
                  for i, refs in enumerate(zip(references, second, third, strict=True))]
    per_segment = [list(refs) for refs in zip(references, second, third, strict=True)]
    ours = bleu.corpus_bleu(hypotheses, per_segment)
    theirs = sacrebleu.corpus_bleu(hypotheses, [references, second, third])
    assert 20 < ours.score < 100 and ours.score == pytest.approx(theirs.score, abs=1e-9)
    assert bleu.corpus_bleu(hypotheses, references).score < ours.score  # fewer references
    metric = sacrebleu.BLEU(**bleu.SETTINGS)
    metric.corpus_score(hypotheses, [references])
    assert "case:mixed|eff:no|tok:13a|smooth:exp" in metric.get_signature().format()


def test_empty_corpus_and_bad_arguments():
    assert bleu.corpus_bleu([], []).score == 0.0
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        bleu.corpus_bleu(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="0 hypotheses but 1 references"):
        bleu.corpus_bleu([], ["a"])
    with pytest.raises(ValueError, match=r"references\[0\] must be"):
        bleu.corpus_bleu(["a"], [[]])
    with pytest.raises(ValueError, match="hypotheses must be strings"):
        bleu.corpus_bleu([b"a"], ["a"])
    assert "BLEU = 100.00" in str(bleu.corpus_bleu(["a b c d"], ["a b c d"]))
