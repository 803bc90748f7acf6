"""SIGHUP (a closed terminal, a dropped ssh session) stops a run as SIGTERM does: the step
ends, a checkpoint is written, one line says so and the exit code says "resumable". A run
started with SIGHUP ignored (`nohup`) is left to train."""

import signal

import pytest
import tensorflow as tf
from robust_testing import batches_made, checkpoint_steps, start_toy_run, wait_for

from bert_trainer.errors import EXIT_PREEMPTED
from bert_trainer.training import preemption

# One long compiled loop: the signal must end it at a step boundary, with a checkpoint there.
ONE_LOOP = dict(train_steps=60, steps_per_loop=60, checkpoint_interval=60, summary_interval=60,
                eval_steps=0)
TIMEOUT = 300  # seconds; a busy 2-core machine imports TensorFlow slowly


@pytest.mark.slow  # a subprocess that imports TensorFlow and trains
def test_sighup_checkpoints_then_exits_resumable(tmp_path):
    run, probe = tmp_path / "run", tmp_path / "probe"
    spec = {"model_dir": str(run), "trainer": ONE_LOOP, "probe": str(probe), "delay": 0.05}
    proc = start_toy_run(spec, tmp_path / "log")
    try:
        wait_for(lambda: batches_made(probe) >= 10, TIMEOUT, "the run to make 10 batches")
        proc.send_signal(signal.SIGHUP)
        rc = proc.wait(TIMEOUT)
    finally:
        proc.kill()
    log = (tmp_path / "log").read_text()
    assert rc == EXIT_PREEMPTED, log[-2000:]  # was -SIGHUP: killed at once, nothing saved
    assert "Traceback" not in log
    [stopped] = checkpoint_steps(run)
    assert 1 <= stopped < 60
    [line] = [line for line in log.splitlines() if line.startswith("toy: stopped by")]
    assert line == (f"toy: stopped by SIGHUP after step {stopped}; checkpoint {run}/ckpt-"
                    f"{stopped} written. Run the same command again to resume from it.")


def test_sighup_requests_a_stop_like_sigterm():
    handler = signal.getsignal(signal.SIGHUP)
    with preemption.StopSignals(tf.Variable(False)) as signals:
        signal.raise_signal(signal.SIGHUP)
        wait_for(lambda: signals.stop_flag.numpy(), 10, "the stop flag")
        assert signals.requested == "SIGHUP"
    assert signal.getsignal(signal.SIGHUP) is handler


def test_a_nohup_run_keeps_sighup_ignored():
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what nohup does
    try:
        with preemption.StopSignals(tf.Variable(False)) as signals:
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            signal.raise_signal(signal.SIGHUP)  # ignored: no stop
            assert signals.requested is None and not signals.stop_flag.numpy()
        assert signal.SIGHUP not in signals.signals
    finally:
        signal.signal(signal.SIGHUP, previous)
