"""A full disk or a refused write while saving: one line, no partial files, the last good
checkpoint intact and resumable.

Disk-full cases run the toy trainer on a small tmpfs (tests/disk_testing.py; skipped with the
reason where tmpfs cannot be mounted): the first run checkpoints at step 2, the disk is then
filled to less than a checkpoint's size, and the next save (step 4) fails. A refused write is
a tmpfs remounted read-only mid-run (root ignores permission bits, not a read-only mount), and
a permission error raised where TensorFlow's saver would raise it.
"""

import os
import subprocess

import numpy as np
import pytest
import tensorflow as tf
from disk_testing import fill_disk, small_disk
from robust_testing import (
    checkpoint_steps,
    probed_task,
    start_toy_run,
    tree_digest,
)
from toy_task import ToyConfig

from bert_trainer.checkpoints import storage
from bert_trainer.errors import EXIT_USER_ERROR, UserError
from bert_trainer.training import OptimizerConfig, Trainer, TrainerConfig, run_lock

# ~1.5 MB per checkpoint (embeddings and their two Adam slots): far more than the small files.
TOY = dict(vocab_size=2000, hidden_size=64)
# A schedule that does not depend on train_steps: the 2-step and 4-step runs share it.
ADAMW = dict(learning_rate=1e-2, warmup_steps=3, decay_steps=80)
LOOP = dict(steps_per_loop=1, checkpoint_interval=2, summary_interval=100, eval_steps=0)
DISK_KB = 8192


def trainer(model_dir, steps, **task) -> Trainer:
    return Trainer(probed_task(ToyConfig(**TOY), **task), str(model_dir),
                   config=TrainerConfig(train_steps=steps, **LOOP),
                   optimizer=OptimizerConfig(**ADAMW))


def weights(t: Trainer) -> list[np.ndarray]:
    return [v.numpy() for v in t.model.trainable_variables]


def leftovers(directory) -> list[str]:
    """Partial files a failed save may leave: *_temp dirs, *.tmp, tempstate files."""
    found = []
    for root, dirs, files in os.walk(directory):
        found += [os.path.join(root, n) for n in dirs + files
                  if "_temp" in n or n.endswith(".tmp") or ".tmp-" in n or "tempstate" in n]
    return found


def good_checkpoint(model_dir) -> dict[str, str]:
    return {k: v for k, v in tree_digest(model_dir).items() if k.startswith("ckpt-2.")}


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_disk_full_during_a_save_leaves_the_last_checkpoint_resumable(tmp_path):
    with small_disk(DISK_KB) as disk:
        model_dir = os.path.join(disk, "run")
        assert trainer(model_dir, 2).train_and_evaluate().step == 2
        intact = good_checkpoint(model_dir)
        assert checkpoint_steps(model_dir) == [2] and intact
        filler = fill_disk(disk, leave_bytes=600_000)

        with pytest.raises(UserError) as failed:
            trainer(model_dir, 4).train_and_evaluate()
        message = str(failed.value)
        assert message.startswith(f"writing checkpoint ckpt-4 to {model_dir} failed: no space "
                                  "left on the device (needs about "), message
        assert message.endswith("free some space and run again; the last good checkpoint "
                                "ckpt-2 is intact; run the same command again to resume from "
                                "it"), message
        assert "\n" not in message
        assert leftovers(disk) == [] and checkpoint_steps(model_dir) == [2]
        assert tf.train.latest_checkpoint(model_dir) == os.path.join(model_dir, "ckpt-2")
        assert good_checkpoint(model_dir) == intact
        assert not os.path.exists(os.path.join(model_dir, run_lock.LOCK_FILE))

        os.remove(filler)
        resumed = trainer(model_dir, 4)
        assert int(resumed.global_step.numpy()) == 2
        assert resumed.train_and_evaluate().step == 4
    straight = trainer(tmp_path / "straight", 4)
    straight.train_and_evaluate()
    difference = max(float(np.max(np.abs(a - b)))
                     for a, b in zip(weights(resumed), weights(straight), strict=True))
    assert difference < 1e-6  # resumed exactly where the uninterrupted run was at step 2


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_read_only_file_system_mid_run(tmp_path, caplog):
    with small_disk(DISK_KB) as disk:
        model_dir = os.path.join(disk, "run")
        assert trainer(model_dir, 2).train_and_evaluate().step == 2
        intact = tree_digest(model_dir)
        mounted = []

        def read_only(batch: int) -> None:  # the 2nd batch of the new run: before the step-4 save
            # A read-only bind mount over model_dir: root's writes are refused (EROFS) from
            # here on, while the files the run holds open stay writable (no "busy" remount).
            if batch == 2:
                subprocess.run(["mount", "--bind", model_dir, model_dir], check=True)
                mounted.append(model_dir)
                subprocess.run(["mount", "-o", "remount,bind,ro", model_dir], check=True)

        try:
            with pytest.raises(UserError, match=(
                    f"^writing checkpoint ckpt-4 to {model_dir} failed: the file system is "
                    r"read-only \(needs about .*\); make it writable \(or choose another path\) "
                    "and run again; the last good checkpoint ckpt-2 is intact; run the same "
                    "command again to resume from it$")):
                # 6 steps: the summary at the last step would be the first write refused.
                trainer(model_dir, 6, on_batch=read_only).train_and_evaluate()
        finally:
            for path in mounted:
                subprocess.run(["umount", path], check=True)
        assert mounted and leftovers(disk) == []
        after = tree_digest(model_dir)
        # The lock file could not be removed from a read-only directory; nothing else changed
        # but the event file of the new run (written before the mount went read-only).
        assert run_lock.LOCK_FILE in after
        assert {k: v for k, v in after.items() if k in intact and not k.startswith("train/")} \
            == {k: v for k, v in intact.items() if not k.startswith("train/")}
        with caplog.at_level("WARNING"):
            assert trainer(model_dir, 6).train_and_evaluate().step == 6
        assert "no longer running; taking it over" in caplog.text  # the lock left behind


class _FailingManager:
    """A CheckpointManager whose save leaves what TensorFlow's does and is refused."""

    def __init__(self, directory, error):
        self.directory = str(directory)
        self.latest_checkpoint = os.path.join(self.directory, "ckpt-2")
        self.error = error

    def save(self, checkpoint_number):
        temp = os.path.join(self.directory, f"ckpt-{checkpoint_number}_temp")
        os.makedirs(temp)
        with open(os.path.join(temp, "part-00000-of-00001.data-00000-of-00001"), "wb") as f:
            f.write(b"\0" * 100)
        with open(os.path.join(self.directory, f"ckpt-{checkpoint_number}.index"), "wb") as f:
            f.write(b"half")
        raise self.error


@pytest.mark.parametrize("error, cause, fix", [
    (tf.errors.PermissionDeniedError(None, None, "ckpt-4_temp/part-0; Permission denied"),
     "permission denied", "make it writable (or choose another path)"),
    (PermissionError(13, "Permission denied"), "permission denied",
     "make it writable (or choose another path)"),
    (tf.errors.ResourceExhaustedError(None, None, "x; No space left on device"),
     "no space left on the device", "free some space")])
def test_a_refused_save_removes_its_partial_files_only(tmp_path, error, cause, fix):
    for name in ("ckpt-2.index", "ckpt-2.data-00000-of-00001", "checkpoint", "ckpt-40.index"):
        (tmp_path / name).write_text(name)
    before = tree_digest(tmp_path)
    with pytest.raises(UserError) as failed:
        storage.save_checkpoint(_FailingManager(tmp_path, error), 4)
    assert str(failed.value) == (
        f"writing checkpoint ckpt-4 to {tmp_path} failed: {cause} (needs about 0.0 MB, "
        f"{str(failed.value).split(', ')[1].split(')')[0]}); {fix} and run again; the last good "
        "checkpoint ckpt-2 is intact; run the same command again to resume from it")
    assert tree_digest(tmp_path) == before  # ckpt-40 (another number) and ckpt-2 kept


def test_other_save_errors_pass_unchanged(tmp_path):
    with pytest.raises(tf.errors.InternalError):
        storage.save_checkpoint(_FailingManager(tmp_path, tf.errors.InternalError(
            None, None, "boom")), 4)
    assert leftovers(tmp_path) == []  # cleaned up all the same


@pytest.mark.slow
def test_disk_full_run_exits_2_with_one_line(tmp_path):
    with small_disk(DISK_KB) as disk:
        model_dir = os.path.join(disk, "run")
        spec = {"model_dir": model_dir, "task": TOY, "trainer": {**LOOP, "train_steps": 4},
                "optimizer": ADAMW}
        # The first run and the resume after it train in this process (the same toy task,
        # loop and schedule as the spec): the process under test is the one the full disk stops.
        assert trainer(model_dir, 2).train_and_evaluate().step == 2
        intact = good_checkpoint(model_dir)
        filler = fill_disk(disk, leave_bytes=600_000)
        full = start_toy_run(spec, tmp_path / "full.log")
        assert full.wait(300) == EXIT_USER_ERROR
        log = (tmp_path / "full.log").read_text()
        assert "Traceback" not in log
        lines = [line for line in log.splitlines() if line.startswith("toy: ")]
        assert len(lines) == 1 and lines[0].startswith(
            f"toy: error: writing checkpoint ckpt-4 to {model_dir} failed: no space left"), log
        assert leftovers(disk) == [] and good_checkpoint(model_dir) == intact
        os.remove(filler)
        again = trainer(model_dir, 4)
        assert int(again.global_step.numpy()) == 2  # resumed from the intact ckpt-2
        assert again.train_and_evaluate().step == 4


class _Writes:
    def __init__(self, error):
        self.error = error

    def main(self, argv):
        raise self.error


def test_run_command_maps_a_storage_fault_no_write_site_caught(capsys):
    from bert_trainer.commands import run_command  # noqa: PLC0415

    error = tf.errors.ResourceExhaustedError(
        None, None, "/data/run/train/events.out.tfevents.1; No space left on device")
    assert run_command(_Writes(error), ["bert-train pretrain"]) == EXIT_USER_ERROR
    assert capsys.readouterr().err == (
        "bert-train pretrain: error: writing files to /data/run/train/events.out.tfevents.1 "
        "failed: no space left on the device; free some space and run again\n")
    error = PermissionError(13, "Permission denied", "/data/run/x.json")
    assert run_command(_Writes(error), ["bert-train pretrain"]) == EXIT_USER_ERROR
    assert capsys.readouterr().err.startswith("bert-train pretrain: error: writing files to "
                                              "/data/run/x.json failed: permission denied; ")
    with pytest.raises(tf.errors.ResourceExhaustedError):  # out of memory is not a disk fault
        run_command(_Writes(tf.errors.ResourceExhaustedError(None, None, "OOM when allocating")),
                    ["bert-train pretrain"])


def test_disk_full_while_keeping_the_best_checkpoint_keeps_the_previous_best():
    from bert_trainer.checkpoints import best  # noqa: PLC0415

    with small_disk(4096) as disk:
        best_dir = os.path.join(disk, "run", "best")
        root = tf.train.Checkpoint(v=tf.Variable(tf.zeros([250_000])))  # 1 MB
        keeper = best.BestCheckpointKeeper(root, best_dir, "accuracy")
        assert keeper.update({"accuracy": 0.5}, step=2)
        before = tree_digest(best_dir)
        filler = fill_disk(disk, leave_bytes=300_000)
        with pytest.raises(UserError, match=(
                f"^writing best checkpoint ckpt-4 to {best_dir} failed: no space left on the "
                r"device \(needs about 1.0 MB, 0.[0-9] MB free\); free some space and run again; "
                "the last good checkpoint ckpt-3 is intact; run the same command again to "
                "resume from it$")):
            keeper.update({"accuracy": 0.9}, step=4, resume_from="/x/ckpt-3")
        assert tree_digest(best_dir) == before and leftovers(disk) == []
        assert keeper.best == 0.5  # a retry can still improve on the kept best
        os.remove(filler)
        assert keeper.update({"accuracy": 0.9}, step=4)
        assert sorted(os.listdir(best_dir)) == ["best_metric.json", "checkpoint",
                                                "ckpt-4.data-00000-of-00001", "ckpt-4.index"]


def test_disk_full_while_writing_the_model_info_keeps_the_old_one(tmp_path):
    from bert_trainer.checkpoints import model_dir  # noqa: PLC0415
    from bert_trainer.encoders import BertEncoder  # noqa: PLC0415

    encoder = BertEncoder(vocab_size=50, hidden_size=16, num_layers=1, num_attention_heads=2,
                          inner_dim=32, max_sequence_length=8)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"token{i:05d}\n" for i in range(20_000)))  # 240 KB
    with small_disk(1024) as disk:
        run = os.path.join(disk, "run")
        model_dir.write_model_info(run, encoder, vocab_file=str(vocab), task={"name": "a"})
        before = tree_digest(run)
        filler = fill_disk(disk, leave_bytes=100_000)
        vocab.write_text("".join(f"other{i:05d}\n" for i in range(20_000)))
        with pytest.raises(OSError, match="No space left on device"):
            model_dir.write_model_info(run, encoder, vocab_file=str(vocab), task={"name": "b"})
        assert tree_digest(run) == before and leftovers(disk) == []
        os.remove(filler)
