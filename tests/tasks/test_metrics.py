"""Metric functions against hand-computed cases and the published counts of real data.

Every expected number below was worked out by hand (the arithmetic is in the comments), not by
running the code.
"""

import json
import math

import numpy as np
import pytest

from bert_trainer.errors import UserError
from bert_trainer.metrics import classification, squad, tagging

# ----------------------------------------------------------------------------- classification

# Binary confusion matrix TP=6, FN=2, TN=3, FP=1 (12 examples).
BINARY_LABELS = [1] * 8 + [0] * 4
BINARY_PREDS = [1] * 6 + [0] * 2 + [0] * 3 + [1]


def test_binary_confusion_matrix_metrics():
    assert classification.accuracy(BINARY_LABELS, BINARY_PREDS) == pytest.approx(9 / 12)
    # F1 = 2TP / (2TP + FP + FN) = 12 / 15.
    assert classification.f1(BINARY_LABELS, BINARY_PREDS) == pytest.approx(0.8)
    # F1 of class 0: TP=3, FP=2, FN=1 -> 6 / 9.
    assert classification.f1(BINARY_LABELS, BINARY_PREDS, pos_label=0) == pytest.approx(2 / 3)
    # (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = 16 / sqrt(7*8*4*5).
    assert classification.matthews_corrcoef(BINARY_LABELS, BINARY_PREDS) == pytest.approx(
        16 / math.sqrt(1120))


def test_multiclass_mcc_and_macro_f1():
    labels = [0, 0, 1, 1, 2, 2]
    preds = [0, 1, 1, 1, 2, 0]
    # n=6, correct c=4, true counts t=(2,2,2), predicted p=(2,3,1):
    # (c*n - t.p) / sqrt((n^2 - p.p)(n^2 - t.t)) = (24 - 12) / sqrt((36 - 14)(36 - 12)).
    assert classification.matthews_corrcoef(labels, preds) == pytest.approx(12 / math.sqrt(528))
    # Per class 2TP/(pred+true): 2/4, 4/5, 2/3.
    assert classification.f1(labels, preds, average="macro") == pytest.approx(
        (0.5 + 0.8 + 2 / 3) / 3)
    with pytest.raises(ValueError, match="3 classes.*average='macro'"):
        classification.f1(labels, preds)


def test_mcc_extremes_and_constant_predictions():
    assert classification.matthews_corrcoef([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)
    assert classification.matthews_corrcoef([0, 1, 0, 1], [0, 1, 0, 1]) == pytest.approx(1.0)
    # A constant prediction: 0/0, documented as 0.0.
    assert classification.matthews_corrcoef([0, 1, 1, 0], [1, 1, 1, 1]) == 0.0
    assert classification.pearson([1.0, 2.0, 3.0], [4.0, 4.0, 4.0]) == 0.0
    assert classification.spearman([5.0, 5.0, 5.0], [1.0, 2.0, 3.0]) == 0.0


def test_pearson_hand_computed():
    # dx = (-1.5, -.5, .5, 1.5), dy = (-3, -1, 0, 4): sum dx*dy = 11, sum dx^2 = 5, sum dy^2 = 26.
    assert classification.pearson([1, 2, 3, 4], [2, 4, 5, 9]) == pytest.approx(
        11 / math.sqrt(130))


def test_spearman_average_ranks_for_ties():
    np.testing.assert_array_equal(
        classification.average_ranks([10, 20, 20, 5]), [2.0, 3.5, 3.5, 1.0])
    # Ranks (2, 3.5, 3.5, 1) vs (1, 2, 3, 4): deviations (-.5, 1, 1, -1.5) and (-1.5, -.5, .5,
    # 1.5); sum of products -1.5, sums of squares 4.5 and 5 -> -1.5 / sqrt(22.5) = -sqrt(0.1).
    assert classification.spearman([10, 20, 20, 5], [1, 2, 3, 4]) == pytest.approx(
        -math.sqrt(0.1))
    # Monotone but not linear: Spearman is exactly 1, Pearson is not.
    cubes = [1.0, 8.0, 27.0, 64.0]
    assert classification.spearman([1, 2, 3, 4], cubes) == pytest.approx(1.0)
    assert classification.pearson([1, 2, 3, 4], cubes) < 0.99


def test_classification_input_validation():
    with pytest.raises(ValueError, match="labels has 3 values but predictions has 2"):
        classification.accuracy([0, 1, 1], [0, 1])
    with pytest.raises(ValueError, match=r"predictions \(2, 2\).*argmax"):
        classification.accuracy([0, 1], [[0.1, 0.9], [0.8, 0.2]])
    with pytest.raises(ValueError, match="empty"):
        classification.matthews_corrcoef([], [])
    with pytest.raises(ValueError, match="predictions holds NaN"):
        classification.pearson([1.0, 2.0], [1.0, float("nan")])
    with pytest.raises(ValueError, match="'binary' or 'macro'"):
        classification.f1([0, 1], [0, 1], average="micro")


def test_compute_returns_named_metrics_and_rejects_unknown_names():
    result = classification.compute(
        ["matthews_corrcoef", "accuracy", "f1"], BINARY_LABELS, BINARY_PREDS)
    assert list(result) == ["matthews_corrcoef", "accuracy", "f1"]
    assert result["accuracy"] == pytest.approx(0.75)
    assert result["f1"] == pytest.approx(0.8)
    macro = classification.compute(iter(["macro_f1"]), [0, 1, 2], [0, 1, 1])
    assert macro["macro_f1"] == pytest.approx((1 + 2 / 3 + 0) / 3)
    with pytest.raises(UserError, match="unknown metric 'auc': choose from accuracy, f1"):
        classification.compute(["accuracy", "auc"], [0], [0])


# ----------------------------------------------------------------------------- SQuAD


@pytest.mark.parametrize("text, expected", [
    ("The Cat!", "cat"),
    ("  A  quick, brown-fox ", "quick brownfox"),  # hyphen is punctuation: words join
    ("theater of an apple", "theater of apple"),   # articles only as whole words
    ("THE", ""),
])
def test_normalize_answer(text, expected):
    assert squad.normalize_answer(text) == expected


def test_exact_match_and_token_f1():
    assert squad.exact_match("The Cat!", "cat") == 1.0
    assert squad.exact_match("cats", "cat") == 0.0
    # Tokens (big, red, dog) vs (red, dog, barked): 2 shared, P = R = 2/3.
    assert squad.f1("the big red dog", "a red dog barked") == pytest.approx(2 / 3)
    # A repeated token counts only as often as the gold holds it: P = 1/3, R = 1 -> 0.5.
    assert squad.f1("dog dog dog", "dog") == pytest.approx(0.5)
    assert squad.f1("", "dog") == 0.0
    # Both empty: v1.1 scores 0, v2.0 scores 1.
    assert squad.f1("", "the") == 0.0
    assert squad.f1("", "the", version_2=True) == 1.0
    assert squad.f1("Paris", "", version_2=True) == 0.0


def test_squad_v1_evaluate_max_over_gold_and_missing():
    gold = {"q1": ["Denver Broncos", "The Denver Broncos"],
            "q2": ["Santa Clara, California"],
            "q3": ["1990"]}
    predictions = {"q1": "the Denver Broncos.", "q2": "Santa Clara", "extra": "ignored"}
    result = squad.squad_evaluate(gold, predictions)
    # q1: EM 1, F1 1. q2: EM 0, F1 with P = 1, R = 2/3 -> 0.8. q3 missing: 0, 0.
    assert result["exact_match"] == pytest.approx(100 / 3)
    assert result["f1"] == pytest.approx(60.0)
    assert (result["total"], result["missing"]) == (3, 1)
    assert "HasAns_f1" not in result


def test_squad_v2_no_answer_breakdown():
    gold = {"a": ["Paris"], "b": [], "c": [], "d": ["The"]}  # "The" normalizes to no answer
    predictions = {"a": "paris", "b": "", "c": "London", "d": ""}
    result = squad.squad_evaluate(gold, predictions)  # v2.0 inferred from the empty golds
    # a right (has answer); b and d right (""), c wrong: 3 of 4.
    assert result["exact_match"] == pytest.approx(75.0)
    assert result["f1"] == pytest.approx(75.0)
    assert (result["HasAns_exact_match"], result["HasAns_total"]) == (100.0, 1)
    assert result["NoAns_f1"] == pytest.approx(200 / 3)
    assert result["NoAns_total"] == 3


def test_squad_accepts_dataset_json_and_rejects_malformed():
    dataset = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": "c", "qas": [
        {"id": "q1", "question": "?", "answers": [{"text": "x y", "answer_start": 0}]}]}]}]}
    result = squad.squad_evaluate(dataset, {"q1": "x"})
    # "version" says v2.0 though no question is unanswerable: P = 1, R = 1/2 -> F1 2/3.
    assert result["f1"] == pytest.approx(200 / 3)
    assert result["HasAns_total"] == 1 and "NoAns_total" not in result
    with pytest.raises(UserError, match="SQuAD dataset is malformed.*'answers'"):
        squad.squad_evaluate({"data": [{"paragraphs": [{"qas": [{"id": "q"}]}]}]}, {})
    with pytest.raises(UserError, match="question 'q' must be a list of strings"):
        squad.squad_evaluate({"q": "answer"}, {})
    with pytest.raises(UserError, match="has no gold answer: pass version_2=True"):
        squad.squad_evaluate({"q": []}, {"q": ""}, version_2=False)


def test_squad_real_dev_sample_with_gold_predictions(shared_dir):
    with open(shared_dir / "data/squad/dev-v1.1-sample.json", encoding="utf-8") as f:
        dataset = json.load(f)
    qas = [qa for article in dataset["data"] for p in article["paragraphs"] for qa in p["qas"]]
    perfect = {qa["id"]: qa["answers"][0]["text"] for qa in qas}
    result = squad.squad_evaluate(dataset, perfect)
    assert result == {"exact_match": 100.0, "f1": 100.0, "total": 1449, "missing": 0}
    # Only every other question answered (725 of 1449): the rest score 0.
    half = {qa["id"]: qa["answers"][0]["text"] for qa in qas[::2]}
    assert squad.squad_evaluate(dataset, half)["exact_match"] == pytest.approx(100 * 725 / 1449)


# ----------------------------------------------------------------------------- tagging


@pytest.mark.parametrize("tags, scheme, expected", [
    (["B-PER", "I-PER", "O", "B-LOC"], "IOB2", [("PER", 0, 2), ("LOC", 3, 4)]),
    (["O", "I-PER", "I-PER", "O"], "IOB2", [("PER", 1, 3)]),         # I- after O starts one
    (["B-PER", "I-LOC"], "IOB2", [("PER", 0, 1), ("LOC", 1, 2)]),     # type change splits
    (["O", "B-MISC"], "IOB2", [("MISC", 1, 2)]),                      # entity at the end
    (["I-ORG", "I-ORG", "B-ORG", "I-ORG", "O", "I-PER"], "IOB1",
     [("ORG", 0, 2), ("ORG", 2, 4), ("PER", 5, 6)]),                  # IOB1 B- separates
    (["S-PER", "B-LOC", "I-LOC", "E-LOC", "E-LOC", "O"], "BIOES",
     [("PER", 0, 1), ("LOC", 1, 4), ("LOC", 4, 5)]),                  # E- after E- is new
    (["O", "O"], "IOB1", []),
])
def test_get_entities(tags, scheme, expected):
    assert tagging.get_entities(tags, scheme) == expected


def test_get_entities_rejects_tags_outside_the_scheme():
    with pytest.raises(ValueError, match="tag 'E-PER' is not valid in scheme IOB2"):
        tagging.get_entities(["B-PER", "E-PER"], "IOB2")
    with pytest.raises(ValueError, match="tag 'PER' is not valid"):
        tagging.get_entities(["PER"])
    with pytest.raises(ValueError, match="unknown tagging scheme 'BILOU'"):
        tagging.get_entities(["O"], "BILOU")


def test_iob1_to_iob2():
    assert tagging.iob1_to_iob2(["I-ORG", "I-ORG", "B-ORG", "I-ORG", "O", "I-PER", "I-LOC"]) == [
        "B-ORG", "I-ORG", "B-ORG", "I-ORG", "O", "B-PER", "B-LOC"]


def test_entity_f1_micro_and_per_type():
    true = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O"]]
    result = tagging.entity_f1(true, pred)
    # Gold PER, LOC, ORG; predicted PER, ORG, ORG; PER and the second-sentence ORG match.
    assert (result["num_true"], result["num_predicted"], result["num_correct"]) == (3, 3, 2)
    assert result["f1"] == pytest.approx(2 / 3)
    assert result["per_type"]["PER"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0,
                                         "support": 1}
    assert result["per_type"]["LOC"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0,
                                         "support": 1}
    assert result["per_type"]["ORG"]["precision"] == pytest.approx(0.5)
    assert result["per_type"]["ORG"]["f1"] == pytest.approx(2 / 3)


def test_entity_f1_counts_only_exact_spans_of_the_same_sentence():
    # A wrong boundary earns nothing.
    assert tagging.entity_f1([["B-PER", "I-PER"]], [["B-PER", "O"]])["f1"] == 0.0
    # The same span in another sentence earns nothing.
    assert tagging.entity_f1([["B-PER"], ["O"]], [["O"], ["B-PER"]])["f1"] == 0.0
    # 4 gold, 2 predicted, 1 right: P = 1/2, R = 1/4, F1 = 2 * (1/8) / (3/4) = 1/3.
    true = [["B-PER", "O", "B-LOC", "O", "B-ORG", "B-MISC"]]
    pred = [["B-PER", "O", "O", "O", "B-LOC", "O"]]
    result = tagging.entity_f1(true, pred)
    assert (result["precision"], result["recall"]) == (0.5, 0.25)
    assert result["f1"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="sentence 0: true_seqs has 2 tags but pred_seqs has 1"):
        tagging.entity_f1([["O", "O"]], [["O"]])
    with pytest.raises(ValueError, match="true_seqs has 1 sentences but pred_seqs has 0"):
        tagging.entity_f1([["O"]], [])


def test_tags_to_entities_character_spans():
    words = ["John", "lives", "in", "New", "York"]
    tags = ["B-PER", "O", "O", "B-LOC", "I-LOC"]
    # " ".join(words) = "John lives in New York": John [0, 4), New York [14, 22).
    expected = [{"type": "PER", "text": "John", "start": 0, "end": 4},
                {"type": "LOC", "text": "New York", "start": 14, "end": 22}]
    assert tagging.tags_to_entities(words, tags) == expected
    offsets = [(0, 4), (5, 10), (11, 13), (14, 17), (18, 22)]
    assert tagging.tags_to_entities(words, tags, offsets) == expected
    # Located in the original text: "New\tYork" spans [15, 23).
    located = tagging.tags_to_entities(words, tags, text="John  lives in New\tYork.")
    assert located[1] == {"type": "LOC", "text": "New\tYork", "start": 15, "end": 23}
    # "New" ends at character 17 of "John lives in New Jersey"; no "York" follows it.
    with pytest.raises(ValueError, match="word 'York' is not in text after character 17"):
        tagging.tags_to_entities(words, tags, text="John lives in New Jersey")
    with pytest.raises(ValueError, match="words has 5 items but tags has 1"):
        tagging.tags_to_entities(words, ["O"])


def _read_conll_tags(path):
    """NER tag sequences of a CoNLL-2003 file (last column), one list per sentence."""
    sentences, current = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("-DOCSTART-"):
            if current:
                sentences.append(current)
            current = []
        else:
            current.append(line.split()[-1])
    if current:
        sentences.append(current)
    return sentences


@pytest.mark.parametrize("filename, num_sentences, counts", [
    # Entity counts from Tjong Kim Sang & De Meulder (2003), Table 2.
    ("eng.testa", 3250, {"LOC": 1837, "MISC": 922, "ORG": 1341, "PER": 1842}),
    ("eng.train", 14041, {"LOC": 7140, "MISC": 3438, "ORG": 6321, "PER": 6600}),
])
def test_conll2003_iob1_entity_counts(shared_dir, filename, num_sentences, counts):
    iob1 = _read_conll_tags(shared_dir / "data/conll2003" / filename)
    assert len(iob1) == num_sentences
    result = tagging.entity_f1(iob1, iob1, scheme="IOB1")
    assert result["f1"] == 1.0
    assert {t: s["support"] for t, s in result["per_type"].items()} == counts
    iob2 = [tagging.iob1_to_iob2(tags) for tags in iob1]
    assert all(tagging.get_entities(a, "IOB1") == tagging.get_entities(b, "IOB2")
               for a, b in zip(iob1, iob2, strict=True))
    # In IOB2 every entity starts with B-: no I- follows O or another type.
    for tags in iob2:
        for prev, tag in zip(["O", *tags], tags, strict=False):
            assert not (tag.startswith("I-") and prev[2:] != tag[2:]), tags
