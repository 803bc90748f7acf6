"""Stops that lose nothing: SIGTERM/SIGINT mid-loop, SIGKILL at a random moment, then resume.

Each interrupted run is compared with an uninterrupted one: the resumed run must end with the
same weights (dropout on, so the dropout masks must match too), not only the same step.
"""

import os
import random
import signal
import time

import numpy as np
import pytest
import tensorflow as tf
from robust_testing import (
    batches_made,
    checkpoint_steps,
    max_difference,
    probed_task,
    start_toy_run,
    wait_for,
)
from toy_task import ToyConfig, ToyTask

from bert_trainer.errors import EXIT_PREEMPTED, Preempted
from bert_trainer.training import preemption
from bert_trainer.training.optimization import OptimizerConfig
from bert_trainer.training.trainer import Trainer, TrainerConfig

# A schedule that does not depend on train_steps, so a shorter first run is a prefix of a
# longer one.
ADAMW = dict(learning_rate=1e-2, warmup_steps=3, decay_steps=80)
DROPOUT = dict(dropout=0.2)
# One long compiled loop: a stop signal must end it at a step boundary, not after 60 steps.
ONE_LOOP = dict(train_steps=60, steps_per_loop=60, checkpoint_interval=60, summary_interval=60,
                eval_steps=0)
TIMEOUT = 300  # seconds; a busy 2-core machine imports TensorFlow slowly


def weights(trainer):
    return [v.numpy() for v in trainer.model.trainable_variables]


def train(model_dir, task=None, **config) -> Trainer:
    trainer = Trainer(task or ToyTask(ToyConfig(**DROPOUT)), str(model_dir),
                      config=TrainerConfig(**config), optimizer=OptimizerConfig(**ADAMW))
    trainer.train_and_evaluate()
    return trainer


def scalar_steps(directory, tag="loss") -> set[int]:
    steps = set()
    for name in os.listdir(directory):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(directory, name)):
            steps.update(event.step for v in event.summary.value if v.tag == tag)
    return steps


@pytest.mark.slow
def test_sigterm_ends_the_loop_at_a_step_checkpoints_and_resumes_exactly(tmp_path):
    run, probe = tmp_path / "run", tmp_path / "probe"
    spec = {"model_dir": str(run), "trainer": ONE_LOOP, "task": DROPOUT, "optimizer": ADAMW,
            "probe": str(probe), "delay": 0.05}
    proc = start_toy_run(spec, tmp_path / "log")
    try:
        wait_for(lambda: batches_made(probe) >= 10, TIMEOUT, "the run to make 10 batches")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT) == EXIT_PREEMPTED
    finally:
        proc.kill()
    log = (tmp_path / "log").read_text()
    assert "Traceback" not in log
    [line] = [line for line in log.splitlines() if line.startswith("toy: stopped by SIGTERM")]
    [stopped] = checkpoint_steps(run)
    # Stopped inside the 60-step loop, at a step boundary, and said so in one line.
    assert 1 <= stopped < 60
    assert line == (f"toy: stopped by SIGTERM after step {stopped}; checkpoint {run}/ckpt-"
                    f"{stopped} written. Run the same command again to resume from it.")
    assert scalar_steps(run / "train") == {stopped}  # the partial interval was flushed

    resumed = Trainer(ToyTask(ToyConfig(**DROPOUT)), str(run), config=TrainerConfig(**ONE_LOOP),
                      optimizer=OptimizerConfig(**ADAMW))
    assert int(resumed.global_step.numpy()) == stopped
    resumed.train_and_evaluate()
    straight = train(tmp_path / "straight", **ONE_LOOP)
    assert max_difference(weights(straight), weights(resumed)) <= 1e-6


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_sigint_raises_preempted_and_restores_the_handlers(tmp_path):
    # The signal is raised from the input pipeline's thread as it makes batch 6: the compiled
    # loop is running, and the main thread executes no Python until it returns.
    sent = []

    def on_batch(n):
        if n == 6 and not sent:  # once: the resumed run makes its batches from 1 again
            sent.append(n)
            signal.raise_signal(signal.SIGINT)

    task = probed_task(ToyConfig(), on_batch=on_batch)
    config = TrainerConfig(**ONE_LOOP)
    trainer = Trainer(task, str(tmp_path), config=config, optimizer=OptimizerConfig(**ADAMW))
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(Preempted) as caught:
        trainer.train_and_evaluate()
    stopped = caught.value.step
    assert caught.value.signal_name == "SIGINT" and 1 <= stopped < 60
    assert caught.value.checkpoint == str(tmp_path / f"ckpt-{stopped}")
    assert checkpoint_steps(tmp_path) == [stopped]
    assert int(trainer.global_step.numpy()) == stopped
    assert signal.getsignal(signal.SIGINT) is handler
    assert signal.set_wakeup_fd(-1) == -1  # ours was removed
    # The same trainer goes on (the stop flag was cleared) and ends like an uninterrupted run.
    assert trainer.train_and_evaluate().step == 60
    straight = train(tmp_path / "straight", ToyTask(ToyConfig()), **ONE_LOOP)
    assert max_difference(weights(straight), weights(trainer)) <= 1e-6


def test_a_second_signal_interrupts_at_once():
    handler = signal.getsignal(signal.SIGTERM)
    with preemption.StopSignals(tf.Variable(False)) as signals:
        signal.raise_signal(signal.SIGTERM)
        wait_for(lambda: signals.stop_flag.numpy(), 10, "the stop flag")
        assert signals.requested == "SIGTERM"
        with pytest.raises(KeyboardInterrupt, match="second stop signal"):
            signal.raise_signal(signal.SIGTERM)
            time.sleep(1)  # the handler runs at the next bytecode; never reached
    assert signal.getsignal(signal.SIGTERM) is handler


@pytest.mark.slow
def test_sigkill_at_a_random_moment_then_resume_gives_the_same_weights(tmp_path):
    config = dict(train_steps=60, steps_per_loop=4, checkpoint_interval=8, summary_interval=8,
                  eval_steps=0, accumulation_steps=2)
    run = tmp_path / "run"
    spec = {"model_dir": str(run), "trainer": config, "task": DROPOUT, "optimizer": ADAMW,
            "delay": 0.02}
    proc = start_toy_run(spec, tmp_path / "log")
    try:
        wait_for(lambda: checkpoint_steps(run), TIMEOUT, "the first checkpoint")
        time.sleep(random.uniform(0.0, 1.0))
        proc.kill()  # SIGKILL: nothing runs after it
        assert proc.wait(TIMEOUT) == -signal.SIGKILL
    finally:
        proc.kill()
    latest = tf.train.latest_checkpoint(str(run))
    killed_after = int(latest.rsplit("-", 1)[1])
    assert 8 <= killed_after < 60, checkpoint_steps(run)

    resumed = Trainer(ToyTask(ToyConfig(**DROPOUT)), str(run), config=TrainerConfig(**config),
                      optimizer=OptimizerConfig(**ADAMW))
    assert int(resumed.global_step.numpy()) == killed_after
    resumed.train_and_evaluate()
    straight = train(tmp_path / "straight", **config)
    difference = max_difference(weights(straight), weights(resumed))
    print(f"SIGKILL after checkpoint {killed_after}: max |dw| after resume = {difference:.3g}")
    assert difference <= 1e-6
    assert all(np.isfinite(w).all() for w in weights(resumed))


def test_handle_signals_false_leaves_the_handlers_alone(tmp_path):
    # Compare with the handlers the process had (pytest-xdist workers ignore SIGINT).
    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    trainer = Trainer(probed_task(ToyConfig(), on_batch=lambda n: _check_handlers(before)),
                      str(tmp_path), config=TrainerConfig(**{**ONE_LOOP, "train_steps": 3},
                                                          handle_signals=False))
    assert trainer.train_and_evaluate().step == 3


def _check_handlers(expected):
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == expected
