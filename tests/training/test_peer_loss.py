"""A multi-worker peer that dies: the survivor exits with one line naming the lost worker.

The slow test runs two MultiWorkerMirroredStrategy workers (tests/training/test_multi_worker.py's
machinery) and kills the chief, which holds the coordination service: tf.distribute's
preemption watcher threads on the survivor then fail too, and used to print a traceback.
"""

import json
import signal
import threading

import pytest
import tensorflow as tf
from robust_testing import checkpoint_steps, wait_for
from test_multi_worker import TIMEOUT, finish, log, start_workers

from bert_trainer import commands
from bert_trainer.commands import faults
from bert_trainer.errors import EXIT_PEER_LOST

GRPC = ("recvmsg:Connection reset by peer\nAdditional GRPC error information from remote "
        "target /job:worker/replica:0/task:{} while calling /tensorflow.WorkerService/RecvBuf:")
ABORTED = ("{{function_node __wrapped__CollectiveReduceV2_device_/job:worker/replica:0/task:1/"
           "device:CPU:0}} Collective ops is aborted by: recvmsg:Connection reset by peer")


class _Fails:
    def __init__(self, error):
        self.error = error

    def main(self, argv):
        raise self.error


@pytest.fixture
def cluster(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]},
        "task": {"type": "worker", "index": 1}}))
    monkeypatch.setattr(faults, "_peers_lost", [])


def test_the_lost_worker_is_named_from_the_grpc_text(cluster, capsys):
    error = tf.errors.UnavailableError(None, None, GRPC.format(0))
    assert commands.run_command(_Fails(error), ["bert-train finetune"]) == EXIT_PEER_LOST
    err = capsys.readouterr().err
    assert err == ("bert-train finetune: error: lost contact with worker 0 (10.0.0.1:2222) "
                   "(UnavailableError: recvmsg:Connection reset by peer). The last checkpoint "
                   "is intact: restart every worker with the same command to resume from it.\n")


def test_a_watcher_thread_s_error_is_recorded_not_printed(cluster, capsys):
    # What the survivor's PeerTerminationWatcher thread raises when the chief dies.
    def watcher():
        raise tf.errors.UnavailableError(None, None, GRPC.format(0))

    commands.run_command(_Fails(KeyboardInterrupt()), ["bert-train finetune"])  # installs it
    thread = threading.Thread(target=watcher)
    thread.start()
    thread.join()
    assert "Traceback" not in capsys.readouterr().err
    # The main thread's own error names only itself; the thread's says which peer went away.
    error = tf.errors.AbortedError(None, None, ABORTED)
    assert commands.run_command(_Fails(error), ["bert-train finetune"]) == EXIT_PEER_LOST
    assert "lost contact with worker 0 (10.0.0.1:2222) (AbortedError: " in capsys.readouterr().err


def test_in_a_cluster_of_two_the_other_worker_is_the_lost_one(cluster, capsys):
    error = tf.errors.AbortedError(None, None, ABORTED)
    assert commands.run_command(_Fails(error), ["bert-train finetune"]) == EXIT_PEER_LOST
    assert "lost contact with worker 0 (10.0.0.1:2222)" in capsys.readouterr().err


def test_other_thread_errors_still_print(capsys):
    commands.run_command(_Fails(KeyboardInterrupt()), ["bert-train finetune"])
    thread = threading.Thread(target=lambda: 1 / 0)
    thread.start()
    thread.join()
    assert "ZeroDivisionError" in capsys.readouterr().err


@pytest.mark.slow
def test_killing_the_chief_leaves_a_survivor_with_one_line(tmp_path):
    run = tmp_path / "run"
    workers = start_workers(tmp_path, "lost", delay=0.05)
    try:
        wait_for(lambda: [s for s in checkpoint_steps(run) if s >= 4], TIMEOUT, "ckpt-4")
        workers[0].kill()
    finally:
        codes = finish(workers, timeout=180)
    assert codes == [-signal.SIGKILL, EXIT_PEER_LOST]
    text = log(tmp_path, "lost_1")
    assert "Traceback" not in text, text[-3000:]
    lines = [line for line in text.splitlines() if line.startswith("toy: ")]
    assert len(lines) == 1 and lines[0].startswith("toy: error: lost contact with worker 0 "
                                                   "(127.0.0.1:"), text[-3000:]
    assert lines[0].endswith("restart every worker with the same command to resume from it.")
