"""A model_dir belongs to one run: the lock file, a second run refused, a dead run's lock taken.

The holders that must be other processes (a live run, a killed one) are small Python
subprocesses that take the lock and wait; a run of the trainer itself is in
test_checkpoint_faults.py and the CLI cases in test_bad_inputs.py.
"""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
from robust_testing import REPO, subprocess_env, tree_digest, wait_for

from bert_trainer.errors import UserError
from bert_trainer.training import run_lock

HOLD = ("import sys, time; sys.path.insert(0, {repo!r}); "
        "from bert_trainer.training import run_lock; "
        "run_lock.acquire(sys.argv[1], 'bert-train finetune'); print('locked', flush=True); "
        "time.sleep(600)")


def hold_in_subprocess(model_dir) -> subprocess.Popen:
    """A process that holds `model_dir`'s lock until killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD.format(repo=str(REPO)), str(model_dir)],
                            stdout=subprocess.PIPE, text=True, env=subprocess_env())
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_lock_names_its_holder_and_is_released(tmp_path):
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / "ckpt-1.index").write_text("x")
    lock = run_lock.acquire(str(model_dir), "bert-train finetune")
    record = json.loads((model_dir / run_lock.LOCK_FILE).read_text())
    assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
    assert record["command"] == "bert-train finetune" and record["started"]
    assert run_lock.holds(str(model_dir))
    with pytest.raises(UserError, match="already in use by this process"):
        run_lock.acquire(str(model_dir), "bert-train pretrain")
    lock.release()
    lock.release()  # idempotent
    assert not run_lock.holds(str(model_dir))
    assert sorted(os.listdir(model_dir)) == ["ckpt-1.index"]  # the run's files stay


def test_a_fresh_model_dir_is_removed_again_when_the_run_wrote_nothing(tmp_path):
    fresh = tmp_path / "a" / "fresh"
    with run_lock.acquire(str(fresh), "bert-train pretrain"):
        assert os.listdir(fresh) == [run_lock.LOCK_FILE]
    assert not fresh.exists() and not fresh.parent.exists()  # both made by the lock, both gone
    with run_lock.acquire(str(fresh), "bert-train pretrain"):
        (fresh / "checkpoint").write_text("kept")
    assert os.listdir(fresh) == ["checkpoint"]


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_second_run_is_refused_while_the_first_lives_and_takes_over_once_it_died(
        tmp_path, caplog):
    model_dir = tmp_path / "run"
    holder = hold_in_subprocess(model_dir)
    try:
        before = tree_digest(model_dir)
        started = json.loads((model_dir / run_lock.LOCK_FILE).read_text())["started"]
        with pytest.raises(UserError) as refused:
            run_lock.acquire(str(model_dir), "bert-train pretrain")
        message = str(refused.value)
        assert message == (
            f"--model_dir={model_dir} is in use by bert-train finetune (pid {holder.pid} on host "
            f"{socket.gethostname()}, since {started}); wait for it or choose another "
            "--model_dir")
        assert "\n" not in message
        assert tree_digest(model_dir) == before  # the refused run touched nothing
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The killed run's lock file is still there, but nobody holds it: taken over, with a warning.
    assert (model_dir / run_lock.LOCK_FILE).exists()
    with caplog.at_level("WARNING"), run_lock.acquire(str(model_dir), "bert-train pretrain"):
        record = json.loads((model_dir / run_lock.LOCK_FILE).read_text())
        assert record["pid"] == os.getpid() and record["command"] == "bert-train pretrain"
    assert f"bert-train finetune (pid {holder.pid}" in caplog.text
    assert "no longer running; taking it over" in caplog.text
    assert not (model_dir / run_lock.LOCK_FILE).exists()


def test_a_lock_file_of_another_host_is_refused_with_the_way_out(tmp_path):
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    lock_file = model_dir / run_lock.LOCK_FILE
    lock_file.write_text(json.dumps({"host": "other-host", "pid": 1, "command": "bert-train "
                                     "finetune", "started": "2026-01-01T00:00:00+00:00"}))
    before = tree_digest(model_dir)
    with pytest.raises(UserError, match=rf"in use by bert-train finetune \(pid 1 on host "
                       rf"other-host, since 2026-01-01T00:00:00\+00:00\); wait for it or choose "
                       rf"another --model_dir \(if that run has ended, delete {lock_file}\)$"):
        run_lock.acquire(str(model_dir), "bert-train pretrain")
    assert tree_digest(model_dir) == before


def test_hold_is_reentrant_in_one_process_and_off_for_non_chief_workers(tmp_path):
    model_dir = str(tmp_path / "run")
    with run_lock.acquire(model_dir, "bert-train finetune"):
        with run_lock.hold(model_dir, "the trainer"):  # the command's lock covers the trainer
            assert run_lock.holds(model_dir)
        assert run_lock.holds(model_dir)
    with run_lock.hold(model_dir, "a worker", enabled=False):
        assert not run_lock.holds(model_dir)
    with run_lock.hold(model_dir, "the trainer"):
        assert run_lock.holds(model_dir)
    assert not run_lock.holds(model_dir)


def test_a_read_only_directory_is_one_line(tmp_path, monkeypatch):
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    real_open = os.open

    def refuse(path, flags, *args, **kwargs):
        if str(path).endswith(run_lock.LOCK_FILE):
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(run_lock.os, "open", refuse)
    with pytest.raises(UserError, match=r"cannot create the lock file .* \(Permission denied\); "
                       "make the directory writable or choose another --model_dir$"):
        run_lock.acquire(str(model_dir), "bert-train finetune")
    assert not run_lock.holds(str(model_dir))


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_trainer_holds_the_lock_while_it_trains(tmp_path):
    from toy_task import ToyConfig, ToyTask  # noqa: PLC0415

    from bert_trainer.training import Trainer, TrainerConfig  # noqa: PLC0415

    model_dir = tmp_path / "run"
    seen = []

    class Watching(ToyTask):
        def write_model_info(self, directory):
            seen.append(run_lock.holds(directory))
            super().write_model_info(directory)

    holder = hold_in_subprocess(model_dir)
    trainer = Trainer(Watching(ToyConfig()), str(model_dir),
                      config=TrainerConfig(train_steps=2, steps_per_loop=1, eval_steps=0))
    try:
        with pytest.raises(UserError, match=f"is in use by bert-train finetune \\(pid "
                           f"{holder.pid} "):
            trainer.train_and_evaluate()
        assert seen == [] and sorted(os.listdir(model_dir)) == [run_lock.LOCK_FILE]
    finally:
        holder.kill()
        holder.wait()
    wait_for(lambda: holder.poll() is not None, 10, "the holder to die")
    assert trainer.train_and_evaluate().step == 2
    assert seen == [True] and not (model_dir / run_lock.LOCK_FILE).exists()


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_the_lock_holds_when_its_file_is_deleted_or_replaced(tmp_path):
    """Issue 33: deleting the lock file used to let a second run train in the same model_dir."""
    model_dir = tmp_path / "run"
    holder = hold_in_subprocess(model_dir)
    lock_file = model_dir / run_lock.LOCK_FILE
    try:
        lock_file.unlink()
        with pytest.raises(UserError, match=rf"^--model_dir={model_dir} is in use by another "
                           "run; wait for it or choose another --model_dir$"):
            run_lock.acquire(str(model_dir), "bert-train pretrain")
        lock_file.write_text(json.dumps({"host": socket.gethostname(), "pid": 1}))  # replaced
        with pytest.raises(UserError, match=rf"^--model_dir={model_dir} is in use by "):
            run_lock.acquire(str(model_dir), "bert-train pretrain")
        assert not run_lock.holds(str(model_dir))
    finally:
        holder.kill()
        holder.wait()
    with run_lock.acquire(str(model_dir), "bert-train pretrain"):  # free once the holder died
        assert json.loads(lock_file.read_text())["pid"] == os.getpid()


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_run_whose_lock_file_goes_stops_at_its_next_checkpoint(tmp_path, how):
    from toy_task import ToyConfig, ToyTask  # noqa: PLC0415

    from bert_trainer.training import Trainer, TrainerConfig  # noqa: PLC0415

    model_dir = tmp_path / "run"
    lock_file = model_dir / run_lock.LOCK_FILE

    class Tampered(ToyTask):
        def write_model_info(self, directory):
            super().write_model_info(directory)
            lock_file.unlink()
            if how == "replaced":
                lock_file.write_text('{"pid": 1}\n')

    trainer = Trainer(Tampered(ToyConfig()), str(model_dir), config=TrainerConfig(
        train_steps=4, steps_per_loop=1, checkpoint_interval=2, eval_steps=0))
    with pytest.raises(UserError) as stopped:
        trainer.train_and_evaluate()
    assert str(stopped.value) == (
        f"the run lock {lock_file} was {how} while this run held it (another run may use "
        f"--model_dir={model_dir}); stopped after writing {model_dir}/ckpt-2: make sure no "
        "other run uses the directory, then run the same command again to resume")
    assert int(trainer.global_step.numpy()) == 2 and (model_dir / "ckpt-2.index").exists()
    assert lock_file.exists() == (how == "replaced")  # another's lock file is not removed
    assert not run_lock.holds(str(model_dir))
