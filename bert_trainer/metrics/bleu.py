"""Corpus BLEU computed by sacreBLEU (Post 2018, "A Call for Clarity in Reporting BLEU Scores").

The settings are sacreBLEU's defaults, written out so that a sacreBLEU release changing a
default cannot change the score unnoticed; scores are comparable with published WMT-style
numbers (signature `nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.5.1`):
- tokenizer `13a` (mteval-v13a.pl, the WMT reference scorer);
- case kept (`lowercase=False`);
- smoothing `exp` (mteval's NIST smoothing);
- n-grams of order 1-4, no effective order (all four orders always count).

What this module adds to sacreBLEU: the reference layout (one entry per hypothesis rather
than sacreBLEU's reference streams), argument checks with readable messages, and a score of
0 for an empty corpus (sacreBLEU raises IndexError on one).
"""

from collections.abc import Sequence

from sacrebleu.metrics.bleu import BLEU, BLEUScore

# sacreBLEU's `BLEU` keyword arguments for the score this project reports.
SETTINGS = dict(tokenize="13a", lowercase=False, smooth_method="exp", max_ngram_order=4,
                effective_order=False)


def _streams(references, count: int) -> list[list[str | None]]:
    """Per-hypothesis references as sacreBLEU's streams; None pads a segment with fewer."""
    if len(references) != count:
        raise ValueError(f"corpus_bleu got {count} hypotheses but {len(references)} "
                         "references; give one reference (or one list of them) per hypothesis")
    segments = []
    for i, refs in enumerate(references):
        refs = [refs] if isinstance(refs, str) else [r for r in refs if r is not None]
        if not refs or not all(isinstance(r, str) for r in refs):
            raise ValueError(f"corpus_bleu: references[{i}] must be a string or a non-empty "
                             "list of strings")
        segments.append(refs)
    width = max((len(refs) for refs in segments), default=0)
    return [[refs[k] if k < len(refs) else None for refs in segments] for k in range(width)]


def corpus_bleu(hypotheses: Sequence[str],
                references: Sequence[str] | Sequence[Sequence[str]]) -> BLEUScore:
    """Corpus BLEU of hypotheses against their references, with `SETTINGS`.

    Args:
      hypotheses: detokenized system outputs, one per segment ("" for an empty output).
      references: detokenized references, one string or list of strings per hypothesis
        (their number may vary between hypotheses).

    Returns:
      sacreBLEU's `BLEUScore`: `score` (0..100), `precisions`, `bp`, `sys_len`, `ref_len`,
      `counts`, `totals`. An empty corpus scores 0.

    Raises:
      ValueError: the counts of hypotheses and references differ, a hypothesis is not a
        string, or a reference entry is not a string or a non-empty list of strings.
    """
    hypotheses = list(hypotheses)
    for hypothesis in hypotheses:
        if not isinstance(hypothesis, str):
            raise ValueError(f"corpus_bleu: hypotheses must be strings, got {type(hypothesis)}")
    if not hypotheses:
        _streams(list(references), 0)  # still refuses references without hypotheses
        order = SETTINGS["max_ngram_order"]
        return BLEU.compute_bleu([0] * order, [0] * order, 0, 0,
                                 smooth_method=SETTINGS["smooth_method"], max_ngram_order=order)
    streams = _streams(list(references), len(hypotheses))
    return BLEU(**SETTINGS).corpus_score(hypotheses, streams)
