"""QuestionAnsweringTask on the real SQuAD v1.1 sample: loss, decoding to answer text, training."""

import numpy as np
import pytest
import tensorflow as tf
from finetune_testing import assert_encoder_equals, make_task, scalar_history, shared_file, train

from bert_trainer import features as F
from bert_trainer.errors import UserError
from bert_trainer.features import END_LOGITS, START_LOGITS
from bert_trainer.tasks.squad import data as squad_data
from bert_trainer.tasks.squad.task import SquadConfig

SQUAD = "squad/dev-v1.1-sample.json"
OPTIONS = {"squad": SquadConfig(doc_stride=32, max_query_length=24)}


def squad_task(pretrained, **kwargs):
    return make_task("squad", pretrained, train_file=shared_file(SQUAD),
                     eval_file=shared_file(SQUAD), seq_length=64, task_options=OPTIONS, **kwargs)


def test_loss_is_the_mean_of_start_and_end_cross_entropy(tiny_pretrained):
    task = squad_task(tiny_pretrained)
    start = np.array([[1.0, 2.0, 0.5], [0.0, 0.0, 3.0]], np.float32)
    end = np.array([[0.2, 0.1, 4.0], [1.0, -1.0, 0.0]], np.float32)
    positions = {F.START_POSITIONS: np.array([1, 2]), F.END_POSITIONS: np.array([2, 0])}
    loss = task.build_losses(positions, {START_LOGITS: tf.constant(start),
                                         END_LOGITS: tf.constant(end)})["loss"].numpy()

    def xent(logits, labels):
        log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        return -log_p[np.arange(len(labels)), labels]

    expected = (xent(start, positions[F.START_POSITIONS])
                + xent(end, positions[F.END_POSITIONS])) / 2
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_gold_logits_decode_to_the_gold_answers(tiny_pretrained):
    """Logits peaked on each window's gold span score (nearly) 100 EM; shifted ones do not."""
    task = squad_task(tiny_pretrained, max_eval_examples=60)
    batches = list(task.build_inputs(task.eval_split, None, is_training=False))
    ids = np.concatenate([b[squad_data.UNIQUE_IDS].numpy() for b in batches])
    starts = np.concatenate([b[F.START_POSITIONS].numpy() for b in batches])
    ends = np.concatenate([b[F.END_POSITIONS].numpy() for b in batches])
    assert len(ids) == len(task._eval_data.features) > 60  # Long contexts span several windows.
    rows = np.arange(len(ids))
    start_logits = np.zeros((len(ids), 64), np.float32)
    end_logits = np.zeros((len(ids), 64), np.float32)
    start_logits[rows, starts] = np.where(starts > 0, 10.0, 0.0)
    end_logits[rows, ends] = np.where(ends > 0, 10.0, 0.0)
    gathered = {squad_data.UNIQUE_IDS: ids, START_LOGITS: start_logits, END_LOGITS: end_logits}
    results = task.aggregate_eval(gathered)
    assert results["num_questions"] == 60
    assert results["exact_match"] >= 98.0 and results["f1"] >= 98.0, results
    assert len(task.last_predictions) == 60

    # One piece too far at the end: answers get a piece longer, still exact only when that piece
    # is punctuation or an article, which the official normalization drops (35 % here).
    end_logits = np.roll(end_logits, 1, axis=1)
    shifted = task.aggregate_eval({**gathered, END_LOGITS: end_logits})
    assert shifted["exact_match"] < 50.0 and 50.0 < shifted["f1"] < 90.0, shifted


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_partial_evaluation_scores_only_complete_questions(tiny_pretrained):
    task = squad_task(tiny_pretrained, max_eval_examples=20)
    batches = list(task.build_inputs(task.eval_split, None, is_training=False))
    first = batches[0]  # Only the first batch was evaluated (e.g. eval_steps=1).
    size = len(first[squad_data.UNIQUE_IDS])
    gathered = {squad_data.UNIQUE_IDS: first[squad_data.UNIQUE_IDS].numpy(),
                START_LOGITS: np.zeros((size, 64), np.float32),
                END_LOGITS: np.zeros((size, 64), np.float32)}
    windows = task._eval_data.features
    seen = set(gathered[squad_data.UNIQUE_IDS].tolist())
    complete = {w.example_index for w in windows} - {
        w.example_index for w in windows if w.unique_id not in seen}
    results = task.aggregate_eval(gathered)
    assert 0 < len(complete) < 20
    assert results["num_questions"] == len(complete)


def test_query_length_must_leave_room_for_context(tiny_pretrained):
    with pytest.raises(UserError, match=r"seq_length=32 leaves no room for the context after "
                                        r"max_query_length=64"):
        make_task("squad", tiny_pretrained, train_file=shared_file(SQUAD), seq_length=32)


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
def test_fine_tunes_from_the_checkpoint(tiny_pretrained, tmp_path):
    task = squad_task(tiny_pretrained, max_train_examples=48, max_eval_examples=24)
    assert task.num_examples("train") == 48 and not task.version_2
    model_dir = str(tmp_path / "run")
    trainer, result = train(task, model_dir, tiny_pretrained["prefix"], steps=30,
                            learning_rate=3e-3)
    assert len(task.warm_start_report["loaded"]) == len(trainer.model.encoder.weights)
    losses = scalar_history(model_dir, "loss")
    assert len(losses) == 6 and all(np.isfinite(losses))
    assert losses[-1] < 0.8 * losses[0], losses  # 48 questions' windows, memorized a bit
    assert set(result.eval) >= {"loss", "start_accuracy", "end_accuracy", "exact_match", "f1",
                                "num_questions"}
    assert result.eval["num_questions"] == 24
    assert 0.0 <= result.eval["exact_match"] <= result.eval["f1"] <= 100.0


def test_initialize_restores_only_the_encoder(tiny_pretrained):
    task = squad_task(tiny_pretrained)
    model = task.build_model()
    head = [v.numpy().copy() for v in model.span_labeling.weights]
    task.initialize(model, tiny_pretrained["dir"])
    assert_encoder_equals(model.encoder, tiny_pretrained["encoder_weights"])
    for variable, before in zip(model.span_labeling.weights, head, strict=True):
        np.testing.assert_array_equal(variable.numpy(), before)
