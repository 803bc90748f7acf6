"""A resume honours its run or refuses it (`checkpoints/run_record.py`): the learning rate and
schedule, sequence length and masking recorded in bert_train.json must not change; another
batch size continues from the first example not trained on; operative_config.gin keeps the
history of the run it describes."""

import json

import numpy as np
import pytest
from robust_testing import tree_digest
from toy_task import ToyConfig, ToyTask

from bert_trainer import features as F
from bert_trainer.checkpoints import run_record
from bert_trainer.errors import UserError
from bert_trainer.training.optimization import OptimizerConfig
from bert_trainer.training.trainer import Trainer, TrainerConfig

ADAMW = dict(learning_rate=1e-2, warmup_steps=2, decay_steps=80)
LOOP = dict(steps_per_loop=5, checkpoint_interval=5, summary_interval=5, eval_steps=0)


class RecordedToyTask(ToyTask):
    """The toy task with a bert_train.json, as every bert-train task writes one."""

    def write_model_info(self, model_dir):
        with open(f"{model_dir}/bert_train.json", "w", encoding="utf-8") as f:
            json.dump({"format": "bert_train", "version": 2, "task": {"name": "toy"}}, f)


def trainer(model_dir, *, steps, batch=8, derived=(), **optimizer) -> Trainer:
    return Trainer(RecordedToyTask(ToyConfig(train_batch_size=batch)), str(model_dir),
                   config=TrainerConfig(train_steps=steps, **LOOP),
                   optimizer=OptimizerConfig(**{**ADAMW, **optimizer}),
                   derived_bindings=derived)


def example_stream(count: int) -> np.ndarray:
    """The first `count` training examples' ids in the order the toy input yields them."""
    dataset = ToyTask(ToyConfig(train_batch_size=1)).build_inputs("train", None,
                                                                  is_training=True)
    return np.concatenate([b[F.INPUT_WORD_IDS].numpy() for b in dataset.take(count)])


def first_batch(run: Trainer) -> np.ndarray:
    return next(run.train_iterator())[F.INPUT_WORD_IDS].numpy()


@pytest.fixture
def five_steps(tmp_path):
    """A run of 5 steps at batch 8 (40 examples), its checkpoint at step 5."""
    run = tmp_path / "run"
    trainer(run, steps=5, derived=("TrainerConfig.train_steps = 5",)).train_and_evaluate()
    return run


def test_a_resume_with_another_learning_rate_is_refused_before_anything_is_written(five_steps):
    before = tree_digest(five_steps)
    with pytest.raises(UserError) as refused:
        trainer(five_steps, steps=10, learning_rate=0.5).train_and_evaluate()
    assert str(refused.value) == (
        f"--model_dir={five_steps} was trained with OptimizerConfig.learning_rate=0.01; this "
        "run asks for OptimizerConfig.learning_rate=0.5; resume with 0.01 (the same flags and "
        "gin files), or train in a new --model_dir")
    with pytest.raises(UserError, match="OptimizerConfig.schedule='bert'"):
        trainer(five_steps, steps=10, schedule="one_cycle").train_and_evaluate()
    with pytest.raises(UserError, match="OptimizerConfig.warmup_steps=2"):
        trainer(five_steps, steps=10, warmup_steps=4).train_and_evaluate()
    assert tree_digest(five_steps) == before  # operative_config.gin, bert_train.json too


def test_an_accepted_resume_keeps_the_original_operative_config(five_steps):
    original = (five_steps / "operative_config.gin").read_text()
    assert "TrainerConfig.train_steps = 5" in original
    # A longer run, as the command derives it: accepted, and the history kept.
    trainer(five_steps, steps=10, derived=("TrainerConfig.train_steps = 10",)
            ).train_and_evaluate()
    assert (five_steps / "operative_config.gin").read_text() == original
    assert "TrainerConfig.train_steps = 10" in (five_steps / "operative_config-5.gin").read_text()
    recorded = json.loads((five_steps / "bert_train.json").read_text())["trained_with"]
    assert recorded["settings"]["OptimizerConfig.learning_rate"] == 0.01
    assert recorded["batches"] == [{"step": 0, "consumed_steps": 0, "examples": 0,
                                    "batch_size": 8}]


def test_another_batch_size_continues_from_the_first_example_not_trained_on(five_steps, caplog):
    stream = example_stream(100)
    # 5 steps x 8 = 40 examples trained: batch 4 starts at example 41 (not at 5 x 4 + 1 = 21).
    halves = trainer(five_steps, steps=10, batch=4)
    np.testing.assert_array_equal(first_batch(halves), stream[40:44])
    assert "Batch size 4 (was 8): resuming at step 5 from example 41" in caplog.text
    halves.train_and_evaluate()  # 5 steps x 4: 60 examples in all
    recorded = json.loads((five_steps / "bert_train.json").read_text())["trained_with"]
    assert recorded["batches"][1:] == [{"step": 5, "consumed_steps": 5, "examples": 40,
                                        "batch_size": 4}]
    twenties = trainer(five_steps, steps=11, batch=20)
    np.testing.assert_array_equal(first_batch(twenties), stream[60:80])
    # 60 examples: a batch of 16 cannot start at example 61 at a batch boundary.
    before = tree_digest(five_steps)
    with pytest.raises(UserError, match=r"has trained on 60 examples \(batch size 4\); a batch "
                                        r"of 16 cannot start at example 61"):
        trainer(five_steps, steps=11, batch=16).train_and_evaluate()
    assert tree_digest(five_steps) == before


def test_an_evaluation_of_the_run_is_not_a_resume(five_steps):
    # `evaluate` builds a Trainer with the default optimizer settings: it trains nothing.
    before = tree_digest(five_steps)
    evaluator = Trainer(RecordedToyTask(ToyConfig(train_batch_size=32)), str(five_steps),
                        config=TrainerConfig(train_steps=1))
    assert evaluator.restored == f"{five_steps}/ckpt-5"
    assert set(evaluator.evaluate()) >= {"loss", "accuracy"}
    assert {k: v for k, v in tree_digest(five_steps).items() if not k.startswith("eval/")} \
        == before


def test_settings_leave_out_what_the_command_derived_from_the_run_length():
    values = run_record.settings(OptimizerConfig(warmup_steps=12), ToyConfig(seq_length=16),
                                 derived=("OptimizerConfig.warmup_steps = 12",))
    assert "OptimizerConfig.warmup_steps" not in values
    assert values["OptimizerConfig.learning_rate"] == OptimizerConfig().learning_rate
    assert values["ToyConfig.seq_length"] == 16
