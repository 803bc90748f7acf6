"""The official SQuAD evaluation (v1.1, and v2.0 with unanswerable questions).

Follows the definitions of the official `evaluate-v1.1.py` / `evaluate-v2.0.py` scripts so
that numbers are comparable with published ones:
- answers are normalized: lower-cased, punctuation removed, the articles a/an/the removed,
  whitespace collapsed;
- exact match: the normalized strings are equal; F1: bag-of-tokens overlap of the normalized
  strings; each question takes its best score over its gold answers;
- totals are percentages over all questions of the gold set.
v2.0 differences: gold answers that normalize to "" are dropped, and a question left with
none (unanswerable) has the single gold answer "", so only an empty prediction is right; F1
is 1 when both token lists are empty. A question the predictions lack scores 0 (the v1.1
script's rule; the v2.0 script drops it from the totals, which flatters a partial run).
The v2.0 no-answer probability threshold search is not implemented.
"""

import collections
import re
import string

from bert_trainer.errors import UserError

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text):
    """Lower-cases, drops punctuation and the articles a/an/the, collapses whitespace.

    Args:
      text: an answer string.

    Returns:
      The normalized string, e.g. "The Cat!" -> "cat".
    """
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction, ground_truth):
    """1.0 if the normalized prediction equals the normalized gold answer, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1(prediction, ground_truth, version_2=False):
    """Token-overlap F1 of the normalized answers.

    Args:
      prediction: the predicted answer text.
      ground_truth: one gold answer text.
      version_2: use the v2.0 rule for empty answers (1.0 when both are empty); v1.1
        scores any empty side 0.0.

    Returns:
      A float in [0, 1]: 2PR/(P+R) with P, R the shared-token fractions of the prediction's
      and the gold answer's tokens (a token shared twice counts twice).
    """
    prediction_tokens = normalize_answer(prediction).split()
    truth_tokens = normalize_answer(ground_truth).split()
    if version_2 and (not prediction_tokens or not truth_tokens):
        return float(prediction_tokens == truth_tokens)
    common = collections.Counter(prediction_tokens) & collections.Counter(truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)


def _gold_from_articles(articles):
    """{qid: [answer texts]} from the "data" list of a SQuAD JSON file."""
    gold = {}
    try:
        for article in articles:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    gold[qa["id"]] = [answer["text"] for answer in qa["answers"]]
    except (KeyError, TypeError) as e:
        raise UserError(
            f"SQuAD dataset is malformed (missing or wrong {e}): expected "
            "data[].paragraphs[].qas[] with 'id' and 'answers': [{'text': ...}]") from e
    return gold


def gold_answers(dataset_or_gold):
    """Normalizes the accepted gold formats to {qid: [answer texts]}.

    Args:
      dataset_or_gold: a parsed SQuAD JSON file ({"version", "data"}), its "data" list of
        articles, or a dict {qid: [answer texts]}.

    Returns:
      (gold, version_2): the dict, and whether the data is SQuAD v2.0 (its "version" says
      so, or some question has no gold answer).
    """
    version = ""
    if isinstance(dataset_or_gold, dict) and "data" in dataset_or_gold:
        version = str(dataset_or_gold.get("version", ""))
        gold = _gold_from_articles(dataset_or_gold["data"])
    elif isinstance(dataset_or_gold, list):
        gold = _gold_from_articles(dataset_or_gold)
    elif isinstance(dataset_or_gold, dict):
        gold = dataset_or_gold
        for qid, answers in gold.items():
            if isinstance(answers, str) or not all(isinstance(a, str) for a in answers):
                raise UserError(
                    f"gold answers for question {qid!r} must be a list of strings, "
                    f"got {answers!r}")
    else:
        raise UserError(
            "SQuAD gold must be a dataset dict, its 'data' list or {qid: [answers]}, "
            f"got {type(dataset_or_gold).__name__}")
    version_2 = version.lstrip("v").startswith("2") or any(not a for a in gold.values())
    return gold, version_2


def _score_question(prediction, answers, version_2):
    """(exact match, F1) of one prediction against its gold answers, each in [0, 1]."""
    if version_2:
        answers = [a for a in answers if normalize_answer(a)] or [""]
    elif not answers:
        raise UserError("a SQuAD v1.1 question has no gold answer: pass version_2=True")
    return (max(exact_match(prediction, a) for a in answers),
            max(f1(prediction, a, version_2) for a in answers))


def squad_evaluate(dataset_or_gold, predictions, *, version_2=None):
    """The official SQuAD exact match and F1 over a gold set.

    Args:
      dataset_or_gold: see `gold_answers`.
      predictions: dict {qid: predicted answer text}; "" predicts "no answer" (v2.0).
        Questions it lacks score 0; ids not in the gold set are ignored.
      version_2: score with the v2.0 rules; None infers it from the data.

    Returns:
      dict with "exact_match" and "f1" (percentages, 0-100), "total" (questions scored) and
      "missing" (questions without a prediction). For v2.0 also "HasAns_exact_match",
      "HasAns_f1", "HasAns_total" and the "NoAns_" equivalents, for each non-empty group.
    """
    gold, inferred_version_2 = gold_answers(dataset_or_gold)
    version_2 = inferred_version_2 if version_2 is None else version_2
    if not isinstance(predictions, dict):
        raise UserError(
            f"SQuAD predictions must be a dict {{qid: answer text}}, got "
            f"{type(predictions).__name__}")
    if not gold:
        raise UserError("the SQuAD gold set holds no question")
    scores = {}  # qid -> (exact match, F1)
    for qid, answers in gold.items():
        if qid in predictions:
            scores[qid] = _score_question(str(predictions[qid]), answers, version_2)
        else:
            scores[qid] = (0.0, 0.0)
    result = _totals(scores, "")
    result["missing"] = sum(qid not in predictions for qid in gold)
    if version_2:
        has_answer = {qid: s for qid, s in scores.items()
                      if any(normalize_answer(a) for a in gold[qid])}
        no_answer = {qid: s for qid, s in scores.items() if qid not in has_answer}
        for prefix, group in (("HasAns_", has_answer), ("NoAns_", no_answer)):
            if group:
                result.update(_totals(group, prefix))
    return result


def _totals(scores, prefix):
    """Percentage exact match and F1 of {qid: (em, f1)}, keys prefixed by `prefix`."""
    total = len(scores)
    return {
        prefix + "exact_match": 100.0 * sum(em for em, _ in scores.values()) / total,
        prefix + "f1": 100.0 * sum(f for _, f in scores.values()) / total,
        prefix + "total": total,
    }
