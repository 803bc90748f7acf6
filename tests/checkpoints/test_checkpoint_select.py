"""`select_checkpoint`: latest, best, a step or a prefix, one contract; refusals are one line."""

import logging
import os
import re

import pytest
import tensorflow as tf

from bert_trainer.checkpoints.select import select_checkpoint
from bert_trainer.errors import UserError


def save(directory, *steps) -> list[str]:
    """Saves one small checkpoint per step into `directory` the way the trainer does."""
    root = tf.train.Checkpoint(v=tf.Variable(tf.zeros([64])))
    manager = tf.train.CheckpointManager(root, str(directory), max_to_keep=5,
                                         checkpoint_name="ckpt")
    prefixes = []
    for step in steps:
        root.v.assign(tf.fill([64], float(step)))
        prefixes.append(manager.save(checkpoint_number=step))
    return prefixes


def value(prefix) -> float:
    return float(tf.train.load_checkpoint(prefix).get_tensor("v/.ATTRIBUTES/VARIABLE_VALUE")[0])


def truncate(prefix) -> None:
    data = f"{prefix}.data-00000-of-00001"
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)


def refusal(call) -> str:
    """The one-line message of the UserError `call` raises."""
    with pytest.raises(UserError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.fixture
def run(tmp_path):
    """A model_dir with ckpt-10, ckpt-20, ckpt-30 and best/ckpt-20."""
    model_dir = tmp_path / "run"
    save(model_dir, 10, 20, 30)
    save(model_dir / "best", 20)
    return str(model_dir)


def test_each_kind_names_its_checkpoint(run):
    assert select_checkpoint(run, "latest") == f"{run}/ckpt-30"
    assert select_checkpoint(run, "best") == f"{run}/best/ckpt-20"
    assert select_checkpoint(run, None) == f"{run}/best/ckpt-20"  # best when recorded
    assert select_checkpoint(run, "10") == f"{run}/ckpt-10"
    assert select_checkpoint(run, f"{run}/ckpt-20") == f"{run}/ckpt-20"
    assert select_checkpoint(run, f"{run}/best") == f"{run}/best/ckpt-20"  # a directory: latest
    assert [value(select_checkpoint(run, w)) for w in ("latest", "best", "10")] == [30, 20, 10]


def test_without_a_best_checkpoint_the_default_is_latest_and_best_is_refused(tmp_path):
    save(tmp_path, 5)
    assert select_checkpoint(str(tmp_path), None) == f"{tmp_path}/ckpt-5"
    assert refusal(lambda: select_checkpoint(str(tmp_path), "best", flag="--checkpoint")) == (
        f"--checkpoint=best: {tmp_path}/best holds no checkpoint (no 'ckpt-N.index'); it is "
        "written when fine-tuning evaluates; use --checkpoint=latest")


def test_a_missing_checkpoint_names_the_directory_and_the_fix(tmp_path):
    assert refusal(lambda: select_checkpoint(str(tmp_path), "latest")) == (
        f"--checkpoint=latest: {tmp_path} holds no checkpoint (no 'ckpt-N.index'); train there "
        "first")
    assert refusal(lambda: select_checkpoint(None, str(tmp_path), flag="--init_checkpoint")) == (
        f"--init_checkpoint={tmp_path} holds no checkpoint (no 'ckpt-N.index'); give a prefix "
        "like dir/ckpt-1000 or its directory")


def test_a_step_that_does_not_exist_lists_the_steps_there(run):
    assert refusal(lambda: select_checkpoint(run, "25")) == (
        f"--checkpoint=25: {run} has no checkpoint of step 25 (it holds steps 10, 20, 30); pass "
        "one of those, latest or best")
    assert select_checkpoint(run, "20") == f"{run}/ckpt-20"  # model_dir's before best/'s
    empty = os.path.join(run, "empty")
    os.mkdir(empty)
    assert refusal(lambda: select_checkpoint(empty, "25")) == (
        f"--checkpoint=25: {empty} holds no checkpoint (no 'ckpt-N.index'); train there first")


def test_a_step_kept_only_as_best_is_found_there(tmp_path):
    save(tmp_path, 40, 50)
    save(tmp_path / "best", 7)
    assert select_checkpoint(str(tmp_path), "7") == f"{tmp_path}/best/ckpt-7"


def test_a_prefix_outside_the_model_dir_is_refused(run, tmp_path):
    other = save(tmp_path / "other", 3)[0]
    assert refusal(lambda: select_checkpoint(run, other)) == (
        f"--checkpoint={other} lies outside {run}; pass a checkpoint of that directory "
        "(latest, best, a step, or a prefix in it)")
    # ".." is resolved: the path leaves the model_dir, whatever it starts with.
    sneaky = f"{run}/../other/ckpt-3"
    assert "lies outside" in refusal(lambda: select_checkpoint(run, sneaky))


def test_a_prefix_that_does_not_exist_says_what_to_give(run):
    assert refusal(lambda: select_checkpoint(run, f"{run}/ckpt-9")) == (
        f"--checkpoint={run}/ckpt-9: no checkpoint there ({run}/ckpt-9.index is missing); give "
        f"latest, best, a step or a prefix like {run}/ckpt-1000")
    # A typo of a kind's name is a path like any other, and fails the same way.
    assert "lies outside" in refusal(lambda: select_checkpoint(run, "lastest"))


def test_latest_skips_an_unusable_checkpoint_and_says_so(run, caplog):
    truncate(f"{run}/ckpt-30")
    with caplog.at_level(logging.WARNING):
        assert select_checkpoint(run, "latest") == f"{run}/ckpt-20"
    assert any(re.search(r"ckpt-30 is unusable: ckpt-30\.data holds \d+ bytes", r.getMessage())
               for r in caplog.records)
    # A checkpoint asked for by step or prefix is not swapped for another.
    message = refusal(lambda: select_checkpoint(run, "30"))
    assert message.startswith(f"--checkpoint=30: {run}/ckpt-30 is unusable (ckpt-30.data holds ")
    message = refusal(lambda: select_checkpoint(run, f"{run}/ckpt-30"))
    assert message.startswith(f"--checkpoint={run}/ckpt-30 is unusable: ckpt-30.data holds ")


def test_only_unusable_checkpoints_name_the_newest_and_the_flag(tmp_path):
    prefixes = save(tmp_path, 1, 2)
    for prefix in prefixes:
        truncate(prefix)
    message = refusal(lambda: select_checkpoint(None, str(tmp_path), flag="--init_checkpoint"))
    assert re.fullmatch(re.escape(f"{tmp_path}/checkpoint lists 2 checkpoint(s) and none is "
                                  "usable (ckpt-2.data holds ") + r"\d+ bytes but its tensors need "
                        r"\d+ \(truncated\)\); " + re.escape(f"restore {tmp_path}/ckpt-2 or pass "
                                                           "another --init_checkpoint"), message)


def test_without_a_state_file_the_highest_step_is_latest(run):
    os.remove(f"{run}/checkpoint")  # e.g. a directory copied without it
    assert select_checkpoint(run, "latest") == f"{run}/ckpt-30"


def test_a_warm_start_names_a_directory_or_a_prefix(run, tmp_path):
    assert select_checkpoint(None, run, flag="--init_checkpoint") == f"{run}/ckpt-30"
    assert select_checkpoint(None, f"{run}/ckpt-10", flag="--init_checkpoint") == (
        f"{run}/ckpt-10")
    assert refusal(lambda: select_checkpoint(None, f"{tmp_path}/nowhere",
                                             flag="--init_checkpoint")) == (
        f"--init_checkpoint={tmp_path}/nowhere: no checkpoint there ({tmp_path}/nowhere.index is "
        "missing); give a prefix like dir/ckpt-1000 or its directory")
