"""nonfinite_policy="rollback": restore the last good checkpoint, skip the bad batch, go on.

The reference for "skip the bad batch" is a run whose input simply lacks that batch: the
rolled-back run must end with exactly its weights (dropout on, so the dropout masks of the
replayed steps must match too), and so must a rolled-back run killed and resumed later.
"""

import numpy as np
import pytest
import tensorflow as tf
from robust_testing import max_difference
from toy_task import ToyConfig, ToyTask

from bert_trainer.errors import UserError
from bert_trainer.training.optimization import OptimizerConfig
from bert_trainer.training.trainer import NonFiniteError, Trainer, TrainerConfig

ADAMW = OptimizerConfig(learning_rate=1e-2, warmup_steps=3, decay_steps=40)
# A float input mask (poisoned batches hold NaN in it); the poison is set per test below.
TASK = ToyConfig(dropout=0.2, poison_batch=10**9)
ROLLBACK = dict(steps_per_loop=5, checkpoint_interval=5, summary_interval=5, eval_steps=0,
                nonfinite_policy="rollback")


class ToyWithBadBatches(ToyTask):
    """The toy task with NaN in the training batches `poisoned`, or without `dropped` ones."""

    def __init__(self, poisoned=(), dropped=()):
        super().__init__(TASK)
        self.poisoned = list(poisoned)
        self.dropped = list(dropped)

    def build_inputs(self, split, input_context, *, is_training):
        dataset = super().build_inputs(split, input_context, is_training=is_training)
        if is_training and self.dropped:
            dropped = tf.constant(self.dropped, tf.int64)
            dataset = dataset.enumerate().filter(
                lambda i, _: tf.logical_not(tf.reduce_any(tf.equal(i, dropped))))
            dataset = dataset.map(lambda _, batch: batch)
        return dataset

    def _poison(self, index, batch):
        batch = dict(batch)
        if self.poisoned:
            bad = tf.reduce_any(tf.equal(index, tf.constant(self.poisoned, tf.int64)))
            nan = tf.fill(tf.shape(batch["input_mask"]), float("nan"))
            batch["input_mask"] = tf.where(bad, nan, batch["input_mask"])
        return batch


def make(model_dir, task, **config) -> Trainer:
    return Trainer(task, str(model_dir), config=TrainerConfig(**config), optimizer=ADAMW)


def weights(trainer):
    return [v.numpy() for v in trainer.model.trainable_variables]


def skipped_in(prefix) -> int:
    return int(tf.train.load_checkpoint(prefix).get_tensor(
        "skipped_steps/.ATTRIBUTES/VARIABLE_VALUE"))


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_rollback_skips_the_bad_batch_and_matches_a_run_without_it(tmp_path, caplog):
    # Batch 7 (0-based) is bad, so step 8 is refused; ckpt-5 is the last good checkpoint.
    caplog.set_level("WARNING")
    run = make(tmp_path / "run", ToyWithBadBatches(poisoned=[7]), train_steps=20,
               max_rollbacks=1, **ROLLBACK)
    result = run.train_and_evaluate()
    assert result.step == 20 and int(run.skipped_steps.numpy()) == 1
    assert all(np.isfinite(w).all() for w in weights(run))
    messages = [r.getMessage() for r in caplog.records]
    assert f"NaN/Inf at step 8: rollback 1 of 1 to {tmp_path}/run/ckpt-5 (step 5); steps 6-7 " \
           "are replayed on the same batches, then the batch(es) of step 8 are skipped" in messages
    assert "Skipped the batch(es) of step 8 (1 step(s) skipped so far)" in messages
    # The skip was checkpointed at step 7; later checkpoints carry the count.
    assert skipped_in(str(tmp_path / "run" / "ckpt-7")) == 1
    assert skipped_in(str(tmp_path / "run" / "ckpt-20")) == 1

    reference = make(tmp_path / "ref", ToyWithBadBatches(dropped=[7]), train_steps=20,
                     **ROLLBACK)
    reference.train_and_evaluate()
    assert max_difference(weights(run), weights(reference)) <= 1e-6


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
def test_consecutive_bad_batches_cost_one_rollback_each_and_stay_bounded(tmp_path, caplog):
    caplog.set_level("WARNING")
    run = make(tmp_path / "run", ToyWithBadBatches(poisoned=[7, 8]), train_steps=12,
               max_rollbacks=2, **ROLLBACK)
    run.train_and_evaluate()
    assert int(run.skipped_steps.numpy()) == 2
    rollbacks = [r.getMessage() for r in caplog.records if "rollback" in r.getMessage()]
    assert [m.split(" to ")[0] for m in rollbacks] == ["NaN/Inf at step 8: rollback 1 of 2",
                                                       "NaN/Inf at step 8: rollback 2 of 2"]
    reference = make(tmp_path / "ref", ToyWithBadBatches(dropped=[7, 8]), train_steps=12,
                     **ROLLBACK)
    reference.train_and_evaluate()
    assert max_difference(weights(run), weights(reference)) <= 1e-6

    # One rollback allowed: the second bad batch stops the run like nonfinite_policy="stop".
    bounded = make(tmp_path / "bounded", ToyWithBadBatches(poisoned=[7, 8]), train_steps=12,
                   max_rollbacks=1, **ROLLBACK)
    with pytest.raises(NonFiniteError, match=r"NaN/Inf at step 8\b") as caught:
        bounded.train_and_evaluate()
    assert caught.value.checkpoint.endswith("ckpt-7")
    assert "NaN/Inf at step 8: max_rollbacks=1 used up, stopping" in [
        r.getMessage() for r in caplog.records]


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
def test_resume_after_a_rollback_keeps_the_data_position(tmp_path):
    # Stop at step 15 (after the rollback at step 8), restart: the input must continue after
    # the skipped batch, not replay it.
    task = ToyWithBadBatches(poisoned=[7])
    make(tmp_path / "run", task, train_steps=15, **ROLLBACK).train_and_evaluate()
    resumed = make(tmp_path / "run", task, train_steps=20, **ROLLBACK)
    assert int(resumed.global_step.numpy()) == 15 and int(resumed.skipped_steps.numpy()) == 1
    resumed.train_and_evaluate()
    reference = make(tmp_path / "ref", ToyWithBadBatches(dropped=[7]), train_steps=20,
                     **ROLLBACK)
    reference.train_and_evaluate()
    assert max_difference(weights(resumed), weights(reference)) <= 1e-6


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_a_fresh_run_writes_a_checkpoint_to_roll_back_to(tmp_path):
    # Batch 1 is bad: step 2 fails before any regular checkpoint exists.
    run = make(tmp_path, ToyWithBadBatches(poisoned=[1]), train_steps=4, max_rollbacks=1,
               **ROLLBACK)
    assert run.train_and_evaluate().step == 4
    assert skipped_in(str(tmp_path / "ckpt-1")) == 1
    assert int(tf.train.load_checkpoint(str(tmp_path / "ckpt-0")).get_tensor(
        "step/.ATTRIBUTES/VARIABLE_VALUE")) == 0


def test_bad_policy_settings_are_user_errors():
    with pytest.raises(UserError, match="nonfinite_policy='retry' must be 'stop' or 'rollback'"):
        TrainerConfig(train_steps=5, nonfinite_policy="retry")
    with pytest.raises(UserError, match="max_rollbacks=-1 must be an integer >= 0"):
        TrainerConfig(train_steps=5, max_rollbacks=-1)
