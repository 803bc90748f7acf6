"""TaggingTask on real CoNLL-2003 (eng.testa): masked loss, entity F1, training from a checkpoint.
"""

import numpy as np
import pytest
import tensorflow as tf
from finetune_testing import assert_encoder_equals, make_task, scalar_history, shared_file, train

from bert_trainer import features as F
from bert_trainer.features import LOGITS
from bert_trainer.tasks.tagging.family import CONLL2003_LABELS
from bert_trainer.tasks.tagging.task import PREDICTIONS

CONLL = "conll2003/eng.testa"
IGNORE = F.IGNORE_LABEL


def conll_task(pretrained, **kwargs):
    return make_task("conll2003", pretrained, train_file=shared_file(CONLL),
                     eval_file=shared_file(CONLL), seq_length=64, **kwargs)


def test_loss_averages_over_labelled_pieces_only(tiny_pretrained):
    task = conll_task(tiny_pretrained)
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 9)).astype(np.float32)
    labels = np.array([[IGNORE, 3, IGNORE, 0, IGNORE],
                       [IGNORE, IGNORE, IGNORE, IGNORE, IGNORE]], np.int32)
    loss = task.build_losses({F.LABEL_IDS: labels}, {LOGITS: tf.constant(logits)})["loss"]
    log_p = logits[0] - np.log(np.exp(logits[0]).sum(axis=1, keepdims=True))
    expected_first = -(log_p[1, 3] + log_p[3, 0]) / 2
    # A sentence without labelled pieces adds nothing (0, not 0/0 = NaN).
    np.testing.assert_allclose(loss.numpy(), [expected_first, 0.0], rtol=1e-5)


def test_entity_f1_over_words_from_first_pieces(tiny_pretrained):
    task = conll_task(tiny_pretrained)
    names = list(CONLL2003_LABELS)
    b_per, i_per, b_loc = names.index("B-PER"), names.index("I-PER"), names.index("B-LOC")
    # Sentence 1: "[CLS] John Smith ##s visits Paris [SEP]"; sentence 2: "[CLS] Rome [SEP]".
    labels = np.array([[IGNORE, b_per, i_per, IGNORE, 0, b_loc, IGNORE],
                       [IGNORE, b_loc, IGNORE, IGNORE, IGNORE, IGNORE, IGNORE]])
    perfect = np.where(labels == IGNORE, 7, labels)  # Ignored pieces' predictions do not count.
    results = task.aggregate_eval({F.LABEL_IDS: labels, PREDICTIONS: perfect})
    assert results == pytest.approx({"precision": 1.0, "recall": 1.0, "f1": 1.0,
                                     "num_sentences": 2, "num_entities": 3})
    # "Smith" tagged O: the PER entity becomes "John" alone, which is not the gold span.
    wrong = perfect.copy()
    wrong[0, 2] = 0
    results = task.aggregate_eval({F.LABEL_IDS: labels, PREDICTIONS: wrong})
    # 2 of 3 gold entities found, 2 of 3 predicted right: P = R = F1 = 2/3.
    assert results["f1"] == pytest.approx(2 / 3) and results["precision"] == pytest.approx(2 / 3)


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
def test_fine_tunes_conll_from_the_checkpoint(tiny_pretrained, tmp_path):
    task = conll_task(tiny_pretrained, max_train_examples=160, max_eval_examples=64)
    assert task.label_names == CONLL2003_LABELS and task.best_metric == "f1"
    assert task.num_examples("train") == 160
    model_dir = str(tmp_path / "run")
    trainer, result = train(task, model_dir, tiny_pretrained["prefix"], steps=30,
                            learning_rate=3e-3)
    losses = scalar_history(model_dir, "loss")
    assert len(losses) == 6 and all(np.isfinite(losses))
    assert losses[-1] < 0.6 * losses[0], losses  # Most words are "O": learned first.
    assert scalar_history(model_dir, "token_accuracy")[-1] > 0.75
    assert set(result.eval) == {"loss", "token_accuracy", "precision", "recall", "f1",
                                "num_sentences", "num_entities", "cut_sentences"}
    assert result.eval["cut_sentences"] == 0  # windows (the default) never cut
    assert result.eval["num_sentences"] == 64 and result.eval["num_entities"] > 50
    assert 0.0 <= result.eval["f1"] <= 1.0


def test_initialize_restores_only_the_encoder(tiny_pretrained):
    task = conll_task(tiny_pretrained)
    model = task.build_model()
    head = [v.numpy().copy() for v in model.classifier.weights]
    task.initialize(model, tiny_pretrained["prefix"])
    assert_encoder_equals(model.encoder, tiny_pretrained["encoder_weights"])
    for variable, before in zip(model.classifier.weights, head, strict=True):
        np.testing.assert_array_equal(variable.numpy(), before)


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_your_own_conll_file_gets_its_tags_from_the_training_file(tiny_pretrained, tmp_path):
    conll = tmp_path / "ner.txt"
    conll.write_text("Ann B-PER\nlives O\nin O\nOslo I-LOC\n\nBob I-PER\nSmith I-PER\n",
                     encoding="utf-8")
    task = make_task("tagging", tiny_pretrained, train_file=str(conll), eval_file=str(conll))
    # IOB1 "I-LOC" opening an entity is read as B-LOC; tags: O, then B-/I- per type, sorted.
    assert task.label_names == ("O", "B-LOC", "B-PER", "I-PER")
    batch = next(iter(task.build_inputs("eval", None, is_training=False)))
    words = [[task.label_names[t] for t in row if t != IGNORE]
             for row in batch[F.LABEL_IDS].numpy()]
    assert words == [["B-PER", "O", "O", "B-LOC"], ["B-PER", "I-PER"]]
