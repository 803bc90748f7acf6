"""Checkpoint checks: another architecture, the best checkpoint."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from robust_testing import tree_digest
from toy_task import ToyConfig, ToyTask

from bert_trainer.checkpoints import best as best_checkpoint
from bert_trainer.checkpoints import resume
from bert_trainer.errors import UserError
from bert_trainer.training.optimization import OptimizerConfig
from bert_trainer.training.trainer import Trainer, TrainerConfig

TOY = ToyConfig()


def make(model_dir, task_config=TOY, **config):
    config = {"train_steps": 4, "steps_per_loop": 2, "eval_steps": 0, **config}
    return Trainer(ToyTask(task_config), str(model_dir), config=TrainerConfig(**config),
                   optimizer=OptimizerConfig(learning_rate=1e-2))


def test_checkpoint_of_another_architecture_is_refused_untouched(tmp_path):
    make(tmp_path).train_and_evaluate()
    before = tree_digest(tmp_path)
    with pytest.raises(UserError) as caught:
        make(tmp_path, ToyConfig(hidden_size=24), train_steps=8)
    message = str(caught.value)
    assert message.startswith(f"model_dir {tmp_path} holds a checkpoint of another architecture")
    assert "embedding/embeddings is [32, 16] in" in message
    assert "but [32, 24] in this model" in message
    assert "\n" not in message
    assert tree_digest(tmp_path) == before


def test_checkpoint_with_missing_and_extra_variables_is_refused(tmp_path):
    a = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="one")])
    b = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="one"),
                          keras.layers.Dense(2, name="two")])
    path = tf.train.Checkpoint(model=b).write(str(tmp_path / "b"))
    with pytest.raises(UserError, match=r"has 2 variable\(s\) this model lacks"):
        resume.check_compatible(tf.train.Checkpoint(model=a), path, "runs/x")
    path = tf.train.Checkpoint(model=a).write(str(tmp_path / "a"))
    with pytest.raises(UserError, match=r"has no value for .*kernel \[2, 2\]"):
        resume.check_compatible(tf.train.Checkpoint(model=b), path, "runs/x")


def test_expected_variables_match_the_saved_keys(tmp_path):
    trainer = make(tmp_path)
    trainer.train_and_evaluate()
    saved = dict(tf.train.list_variables(tf.train.latest_checkpoint(str(tmp_path))))
    expected = resume.expected_variables(trainer.checkpoint)
    assert set(expected) == set(saved) - {"_CHECKPOINTABLE_OBJECT_GRAPH"}
    assert all(tuple(saved[k]) == shape for k, (_, shape) in expected.items())


def test_dangling_checkpoint_state_is_not_silently_restarted(tmp_path):
    make(tmp_path).train_and_evaluate()
    for name in os.listdir(tmp_path):
        if name.startswith("ckpt-"):
            os.remove(tmp_path / name)
    with pytest.raises(UserError, match="names a checkpoint whose files are missing"):
        make(tmp_path)


def test_best_keeper_max_and_min(tmp_path):
    checkpoint = tf.train.Checkpoint(v=tf.Variable(0.0))
    best = best_checkpoint.BestCheckpointKeeper(checkpoint, str(tmp_path / "best"), "f1", "max")
    assert best.update({"f1": 0.5, "loss": 1.0}, step=10)
    assert not best.update({"f1": 0.4}, step=20)
    assert not best.update({"f1": float("nan")}, step=30)
    checkpoint.v.assign(3.0)
    assert best.update({"f1": 0.7}, step=40)
    record = json.loads((tmp_path / "best" / "best_metric.json").read_text())
    assert record == {"metric": "f1", "mode": "max", "value": 0.7, "step": 40,
                      "checkpoint": "ckpt-40", "metrics": {"f1": 0.7}}
    assert tf.train.latest_checkpoint(str(tmp_path / "best")).endswith("ckpt-40")
    assert not (tmp_path / "best" / "ckpt-10.index").exists()  # only the best is kept
    # A restarted run knows the best so far.
    again = best_checkpoint.BestCheckpointKeeper(checkpoint, str(tmp_path / "best"), "f1", "max")
    assert again.best == 0.7 and not again.update({"f1": 0.6}, step=50)
    lowest = best_checkpoint.BestCheckpointKeeper(checkpoint, str(tmp_path / "low"), "loss", "min")
    assert lowest.update({"loss": 2.0}, 1) and lowest.update({"loss": 1.5}, 2)
    assert not lowest.update({"loss": 1.6}, 3)
    with pytest.raises(UserError, match="best_metric='acc' is not an eval metric; choose one "
                                        "of: f1, loss"):
        best_checkpoint.BestCheckpointKeeper(checkpoint, str(tmp_path / "x"), "acc").update(
            {"loss": 1.0, "f1": 0.1}, step=1)


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_best_checkpoint_kept_apart_during_training(tmp_path):
    trainer = make(tmp_path, train_steps=12, steps_per_loop=4, eval_interval=4, eval_steps=None,
                   best_metric="loss", best_metric_mode="min", max_checkpoints=1)
    trainer.train_and_evaluate()
    record = json.loads((tmp_path / "best" / "best_metric.json").read_text())
    eval_losses = {}
    for name in os.listdir(tmp_path / "eval"):
        for event in tf.compat.v1.train.summary_iterator(str(tmp_path / "eval" / name)):
            for value in event.summary.value:
                if value.tag == "loss":
                    eval_losses[event.step] = float(tf.make_ndarray(value.tensor))
    assert set(eval_losses) == {4, 8, 12}
    best_step = min(eval_losses, key=eval_losses.get)
    assert record["step"] == best_step
    assert record["value"] == pytest.approx(eval_losses[best_step])
    # The best checkpoint holds the weights that scored it: restore and re-evaluate.
    restored = make(tmp_path / "fresh")
    restored.checkpoint.restore(str(tmp_path / "best" / record["checkpoint"])).expect_partial()
    assert restored.evaluate()["loss"] == pytest.approx(record["value"], rel=1e-5)
    assert sorted(os.listdir(tmp_path / "best")) == sorted(
        ["best_metric.json", "checkpoint", f"ckpt-{best_step}.index",
         f"ckpt-{best_step}.data-00000-of-00001"])
    assert np.isfinite(record["metrics"]["accuracy"])
