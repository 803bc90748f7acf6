"""Corpus BLEU as sacreBLEU defines it (Post 2018, "A Call for Clarity in Reporting BLEU Scores").

`corpus_bleu` reproduces `sacrebleu.corpus_bleu(hypotheses, references)` with its defaults,
so scores are comparable with published WMT-style numbers:
- tokenization `13a` (mteval-v13a.pl, the WMT reference scorer): `<skipped>` markers removed,
  `-` + newline joined, the HTML entities `&quot; &amp; &lt; &gt;` unescaped, ASCII
  punctuation and symbols split off, `.` and `,` split off unless between digits, `-` split
  off after a digit; case is kept (sacreBLEU's default);
- n-grams of order 1-4, clipped by the largest count in any reference of the segment;
- brevity penalty over the corpus: each hypothesis is compared with its reference whose
  length is closest (ties: the shorter), and `bp = exp(1 - ref_len / sys_len)` when the
  corpus is shorter than its references;
- smoothing `exp` (mteval's NIST smoothing, sacreBLEU's default): the k-th order with no
  match gets precision `1 / (2^k * total)`; an order with no hypothesis n-grams at all
  contributes log(0) (floored, as sacreBLEU does), which makes BLEU ~0;
- no effective order (sacreBLEU's corpus default): all four orders always count.
It is plain Python; the `sacrebleu` package is only a test dependency (tests compare the two).
"""

import collections
import dataclasses
import math
import re
from collections.abc import Sequence

MAX_ORDER = 4
# sacreBLEU's `my_log`: log(0) is floored to this instead of raising, so a corpus with no
# n-grams of some order scores exp(-huge) = 0 rather than failing.
_LOG_ZERO = -9999999999

# mteval-v13a's language-dependent rules, in order (sacrebleu.tokenizers.tokenizer_re).
_13A_RULES = (
    # ASCII punctuation and symbols: { | } ~ [ \ ] ^ _ ` space ! " # $ % & ( ) * + : ; < = > ? @ /
    (re.compile(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])"), r" \1 "),
    # a period or comma not preceded by a digit
    (re.compile(r"([^0-9])([\.,])"), r"\1 \2 "),
    # a period or comma not followed by a digit
    (re.compile(r"([\.,])([^0-9])"), r" \1 \2"),
    # a dash after a digit
    (re.compile(r"([0-9])(-)"), r"\1 \2 "),
)


@dataclasses.dataclass(frozen=True)
class BleuResult:
    """A corpus BLEU score and the statistics it was computed from.

    Attributes:
      score: BLEU in 0..100.
      precisions: the (smoothed) n-gram precisions of orders 1..4, in percent.
      brevity_penalty: in 0..1.
      sys_len: hypothesis tokens in the corpus.
      ref_len: reference tokens in the corpus (closest reference per segment).
      counts: matched n-grams per order.
      totals: hypothesis n-grams per order.
    """

    score: float
    precisions: tuple[float, ...]
    brevity_penalty: float
    sys_len: int
    ref_len: int
    counts: tuple[int, ...]
    totals: tuple[int, ...]

    def __str__(self) -> str:
        precisions = "/".join(f"{p:.1f}" for p in self.precisions)
        return (f"BLEU = {self.score:.2f} {precisions} (BP = {self.brevity_penalty:.3f} "
                f"hyp_len = {self.sys_len} ref_len = {self.ref_len})")


def tokenize_13a(line: str) -> list[str]:
    """Tokens of one segment under mteval-v13a's rules (sacreBLEU's default tokenizer).

    Args:
      line: a detokenized segment.

    Returns:
      The tokens; BLEU counts n-grams of these.
    """
    line = line.rstrip()  # sacreBLEU strips trailing whitespace before tokenizing.
    line = line.replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
    if "&" in line:
        line = (line.replace("&quot;", '"').replace("&amp;", "&")
                .replace("&lt;", "<").replace("&gt;", ">"))
    line = f" {line} "
    for pattern, replacement in _13A_RULES:
        line = pattern.sub(replacement, line)
    return line.split()


def _ngrams(tokens: list[str], max_order: int) -> collections.Counter:
    return collections.Counter(
        tuple(tokens[i:i + n]) for n in range(1, max_order + 1)
        for i in range(len(tokens) - n + 1))


def _closest_length(hyp_len: int, ref_lens: list[int]) -> int:
    """The reference length closest to the hypothesis length; ties go to the shorter one."""
    return min(ref_lens, key=lambda r: (abs(hyp_len - r), r))


def _segment_references(references, count: int) -> list[list[str]]:
    """References as one list per hypothesis (a single string becomes a list of one)."""
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
    return segments


def bleu_from_statistics(counts: Sequence[int], totals: Sequence[int], sys_len: int,
                         ref_len: int) -> BleuResult:
    """BLEU from corpus statistics with sacreBLEU's `exp` smoothing and no effective order.

    Args:
      counts: matched n-grams per order (1..max order).
      totals: hypothesis n-grams per order.
      sys_len: hypothesis tokens.
      ref_len: closest-reference tokens.

    Returns:
      The `BleuResult`.
    """
    max_order = len(counts)
    if sys_len < ref_len:
        bp = math.exp(1 - ref_len / sys_len) if sys_len > 0 else 0.0
    else:
        bp = 1.0
    precisions = [0.0] * max_order
    result = dict(brevity_penalty=bp, sys_len=int(sys_len), ref_len=int(ref_len),
                  counts=tuple(int(c) for c in counts), totals=tuple(int(t) for t in totals))
    if not any(counts):  # nothing matched at all: 0, not a smoothed near-zero
        return BleuResult(score=0.0, precisions=tuple(precisions), **result)
    smooth = 1.0
    for n in range(max_order):
        if totals[n] == 0:  # no n-grams this long: this and higher orders stay at 0
            break
        if counts[n] == 0:
            smooth *= 2  # exp smoothing: each further unmatched order halves again
            precisions[n] = 100.0 / (smooth * totals[n])
        else:
            precisions[n] = 100.0 * counts[n] / totals[n]
    log_sum = sum(math.log(p) if p > 0 else _LOG_ZERO for p in precisions)
    score = bp * math.exp(log_sum / max_order)
    return BleuResult(score=score, precisions=tuple(precisions), **result)


def corpus_bleu(hypotheses: Sequence[str],
                references: Sequence[str] | Sequence[Sequence[str]]) -> BleuResult:
    """Corpus BLEU of hypotheses against their references, equal to sacreBLEU's default.

    Note the reference layout: one entry per hypothesis (a string, or a list of strings for
    several references of that hypothesis, their number may vary). sacreBLEU takes reference
    *streams* instead; `sacrebleu.corpus_bleu(hyps, [list(s) for s in zip(*refs)])` is the
    same score when every hypothesis has the same number of references.

    Args:
      hypotheses: detokenized system outputs, one per segment ("" for an empty output).
      references: detokenized references, one string or list of strings per hypothesis.

    Returns:
      `BleuResult` (score 0..100). An empty corpus scores 0.

    Raises:
      ValueError: the counts of hypotheses and references differ, or a reference entry is
        not a string or a non-empty list of strings.
    """
    hypotheses = list(hypotheses)
    segments = _segment_references(list(references), len(hypotheses))
    counts = [0] * MAX_ORDER
    totals = [0] * MAX_ORDER
    sys_len = ref_len = 0
    for hypothesis, refs in zip(hypotheses, segments, strict=True):
        if not isinstance(hypothesis, str):
            raise ValueError(f"corpus_bleu: hypotheses must be strings, got {type(hypothesis)}")
        hyp_tokens = tokenize_13a(hypothesis)
        # A hypothesis n-gram is credited up to its largest count in any one reference.
        ref_ngrams = collections.Counter()
        ref_lens = []
        for ref in refs:
            ref_tokens = tokenize_13a(ref)
            ref_lens.append(len(ref_tokens))
            ref_ngrams |= _ngrams(ref_tokens, MAX_ORDER)  # | keeps the max count
        sys_len += len(hyp_tokens)
        ref_len += _closest_length(len(hyp_tokens), ref_lens)
        for ngram, count in _ngrams(hyp_tokens, MAX_ORDER).items():
            order = len(ngram) - 1
            totals[order] += count
            counts[order] += min(count, ref_ngrams[ngram])
    return bleu_from_statistics(counts, totals, sys_len, ref_len)
