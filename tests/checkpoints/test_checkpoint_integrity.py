"""A damaged latest checkpoint is detected, reported in one line, and the previous one is used.

Damage: a truncated .data file, a deleted .index, flipped bytes inside a tensor (caught by the
restore's CRC check), a garbage .index. A run resumed from the fallback ends with exactly the
weights of the undamaged run, because the data position comes with the checkpoint.
"""

import os
import re
import shutil

import pytest
import tensorflow as tf
from robust_testing import max_difference, tree_digest
from toy_task import ToyConfig, ToyTask

from bert_trainer.checkpoints.select import checkpoint_problem
from bert_trainer.errors import UserError
from bert_trainer.training.optimization import OptimizerConfig
from bert_trainer.training.trainer import Trainer, TrainerConfig

CONFIG = dict(train_steps=20, steps_per_loop=5, checkpoint_interval=10, summary_interval=10,
              eval_steps=0)
ADAMW = OptimizerConfig(learning_rate=1e-2, warmup_steps=3, decay_steps=40)


def make(model_dir, **config) -> Trainer:
    return Trainer(ToyTask(ToyConfig(dropout=0.2)), str(model_dir),
                   config=TrainerConfig(**{**CONFIG, **config}), optimizer=ADAMW)


def weights(trainer):
    return [v.numpy() for v in trainer.model.trainable_variables]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A model_dir trained to step 20 (ckpt-10, ckpt-20) and its final weights."""
    directory = tmp_path_factory.mktemp("finished") / "run"
    trainer = make(directory)
    trainer.train_and_evaluate()
    return directory, weights(trainer)


def data_file(prefix) -> str:
    return f"{prefix}.data-00000-of-00001"


def truncate(prefix):
    size = os.path.getsize(data_file(prefix))
    with open(data_file(prefix), "r+b") as f:
        f.truncate(size // 2)


def delete_index(prefix):
    os.remove(f"{prefix}.index")


def flip_bytes(prefix):
    # Inside the first tensor's values: the size check passes, the CRC check does not.
    with open(data_file(prefix), "r+b") as f:
        f.seek(64)
        chunk = f.read(16)
        f.seek(64)
        f.write(bytes(b ^ 0xFF for b in chunk))


@pytest.mark.parametrize("damage, reported", [
    (truncate, r"ckpt-20 is unusable: ckpt-20\.data holds \d+ bytes but its tensors need \d+ "
               r"\(truncated\); falling back to the previous one"),
    (delete_index, "ckpt-20 is unusable: ckpt-20.index is missing; falling back to the "
                   "previous one"),
    (flip_bytes, r"ckpt-20 failed to restore \(.*Checksum does not match.*\); falling back to "
                 "the previous one"),
])
@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(
        finished_run, tmp_path, caplog, damage, reported):
    source, final_weights = finished_run
    run = tmp_path / "run"
    shutil.copytree(source, run)
    damage(str(run / "ckpt-20"))
    caplog.set_level("WARNING")
    resumed = make(run)
    assert int(resumed.global_step.numpy()) == 10
    messages = [r.getMessage() for r in caplog.records]
    damaged = [m for m in messages if "ckpt-20" in m and "falling back" in m]
    assert len(damaged) == 1 and "\n" not in damaged[0], messages
    assert re.search(reported, damaged[0]), damaged[0]
    assert any(m.endswith("ckpt-10 instead (the newest usable one)") or
               m.endswith(f"Restored {run}/ckpt-10 instead of {run}/ckpt-20") for m in messages)
    # Resumed from step 10 at the right data position: steps 11-20 are redone identically.
    resumed.train_and_evaluate()
    assert max_difference(weights(resumed), final_weights) <= 1e-6
    assert tf.train.latest_checkpoint(str(run)).endswith("ckpt-20")
    assert checkpoint_problem(str(run / "ckpt-20")) is None  # rewritten whole


def test_no_usable_checkpoint_is_a_user_error_and_changes_nothing(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run[0], run)
    truncate(str(run / "ckpt-20"))
    delete_index(str(run / "ckpt-10"))
    before = tree_digest(run)
    with pytest.raises(UserError) as caught:
        make(run)
    size = os.path.getsize(data_file(run / "ckpt-20"))
    assert re.fullmatch(
        re.escape(f"{run}/checkpoint lists 2 checkpoint(s) and none is usable (ckpt-20.data "
                  f"holds {size} bytes but its tensors need ") + r"\d+" +
        re.escape(" (truncated)); restore them or delete that file to start the run afresh"),
        str(caught.value)), str(caught.value)
    assert tree_digest(run) == before


def test_unpublished_checkpoint_is_ignored(finished_run, tmp_path):
    # A crash after the tensor files of ckpt-30 were written but before the `checkpoint` file
    # named it: the published latest (ckpt-20) is what a restart uses.
    run = tmp_path / "run"
    shutil.copytree(finished_run[0], run)
    for suffix in (".index", ".data-00000-of-00001"):
        shutil.copy(run / f"ckpt-10{suffix}", run / f"ckpt-30{suffix}")
    assert int(make(run, train_steps=40).global_step.numpy()) == 20


def test_checkpoint_problem_names_what_is_wrong(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run[0], run)
    assert checkpoint_problem(str(run / "ckpt-10")) is None
    os.remove(data_file(run / "ckpt-10"))
    assert checkpoint_problem(str(run / "ckpt-10")) == "ckpt-10 has no .data file"
    (run / "ckpt-20.index").write_bytes(b"not a table" * 10)
    problem = checkpoint_problem(str(run / "ckpt-20"))
    assert problem.startswith("ckpt-20.index is unreadable (") and "\n" not in problem
    assert checkpoint_problem(str(run / "ckpt-7")) == "ckpt-7.index is missing"
