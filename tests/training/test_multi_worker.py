"""Two MultiWorkerMirroredStrategy workers on 127.0.0.1: they train like one process, only the
chief writes, a killed worker costs only the steps since the last checkpoint, and a SIGTERM to
one worker stops both at the same step. Plus the scripts/launch_workers.py launcher.

Each worker is a subprocess (tests/robust_testing.py): the strategy must be created at
program start. The toy input is unshuffled so that the two workers' shards of a global
batch hold exactly the examples of the single-process batch.
"""

import json
import os
import signal
import subprocess
import sys

import pytest
from robust_testing import (
    REPO,
    checkpoint_steps,
    load_weights,
    max_difference,
    result_line,
    start_toy_run,
    wait_for,
)
from toy_task import ToyConfig, ToyTask

sys.path.insert(0, str(REPO / "scripts"))
import launch_workers  # noqa: E402

from bert_trainer.errors import EXIT_PREEMPTED  # noqa: E402
from bert_trainer.training.optimization import OptimizerConfig  # noqa: E402
from bert_trainer.training.trainer import Trainer, TrainerConfig  # noqa: E402

TASK = dict(shuffle=False)
ADAMW = dict(learning_rate=1e-2, warmup_steps=3, decay_steps=80)
CONFIG = dict(train_steps=24, steps_per_loop=2, checkpoint_interval=4, summary_interval=4,
              eval_steps=0)
TIMEOUT = 300  # seconds; two TensorFlow imports on a busy 2-core machine are slow


def start_workers(tmp_path, phase: str, **spec) -> list[subprocess.Popen]:
    """Starts the two workers of one phase; their logs are tmp_path/<phase>_<i>.log."""
    addresses = [f"127.0.0.1:{port}" for port in launch_workers.free_ports(2)]
    spec = {"model_dir": str(tmp_path / "run"), "trainer": CONFIG, "task": TASK,
            "optimizer": ADAMW, "strategy": "multi_worker_mirrored", **spec}
    return [start_toy_run({**spec, "weights": str(tmp_path / f"{phase}_{i}.npz")},
                          tmp_path / f"{phase}_{i}.log",
                          TF_CONFIG=launch_workers.tf_config(addresses, i)) for i in range(2)]


def finish(workers, timeout=TIMEOUT) -> list[int]:
    """Waits for the workers (killing any left after `timeout`); returns their exit codes."""
    codes = []
    for worker in workers:
        try:
            codes.append(worker.wait(timeout))
        except subprocess.TimeoutExpired:
            worker.kill()
            codes.append(worker.wait())
    return codes


def log(tmp_path, name) -> str:
    return (tmp_path / f"{name}.log").read_text()


@pytest.mark.slow
def test_two_workers_match_one_process_and_resume_after_a_worker_is_killed(tmp_path):
    run = tmp_path / "run"
    workers = start_workers(tmp_path, "first", delay=0.05)
    try:
        wait_for(lambda: [s for s in checkpoint_steps(run) if s >= 8], TIMEOUT, "ckpt-8")
        workers[1].kill()
    finally:
        codes = finish(workers, timeout=120)  # the survivor's collectives fail; it exits
    assert codes[1] == -signal.SIGKILL and codes[0] != 0
    interrupted_at = checkpoint_steps(run)[-1]
    assert 8 <= interrupted_at < 24

    workers = start_workers(tmp_path, "again")
    assert finish(workers) == [0, 0], log(tmp_path, "again_0")[-3000:]
    for i in range(2):
        assert f"STARTED at step {interrupted_at}" in log(tmp_path, f"again_{i}")
        assert result_line(tmp_path / f"again_{i}.log") == {
            "step": 24, "loss": pytest.approx(result_line(tmp_path / "again_0.log")["loss"]),
            "chief": i == 0}
    chief, other = (load_weights(tmp_path / f"again_{i}.npz") for i in range(2))
    assert max_difference(chief, other) == 0  # mirrored variables

    # Only the chief's files are in model_dir; the other worker's scratch dir is gone.
    assert checkpoint_steps(run)[-1] == 24
    assert not [n for n in os.listdir(run) if n.startswith((".worker", "workertemp"))]

    # The same global batch of 8 in one process gives the same weights (float tolerance: the
    # all-reduce sums in another order).
    single = Trainer(ToyTask(ToyConfig(**TASK)), str(tmp_path / "single"),
                     config=TrainerConfig(**CONFIG), optimizer=OptimizerConfig(**ADAMW))
    single.train_and_evaluate()
    difference = max_difference([v.numpy() for v in single.model.trainable_variables], chief)
    print(f"two workers (killed at step > {interrupted_at}, resumed) vs one process: max |dw| = "
          f"{difference:.3g}")
    assert difference < 1e-5


@pytest.mark.slow
def test_sigterm_to_one_worker_stops_both_at_the_same_step(tmp_path):
    run = tmp_path / "run"
    workers = start_workers(tmp_path, "stop", delay=0.05)
    try:
        wait_for(lambda: checkpoint_steps(run), TIMEOUT, "the first checkpoint")
        workers[1].send_signal(signal.SIGTERM)
    finally:
        codes = finish(workers)
    assert codes == [EXIT_PREEMPTED, EXIT_PREEMPTED]
    stopped = checkpoint_steps(run)[-1]
    assert 4 <= stopped < 24
    expected = {0: f"toy: stopped by a peer worker's stop signal after step {stopped}; ",
                1: f"toy: stopped by SIGTERM after step {stopped}; "}
    for i, start in expected.items():
        text = log(tmp_path, f"stop_{i}")
        assert "Traceback" not in text
        assert start + f"checkpoint {run}/ckpt-{stopped} written. Run the same command again " \
                       "to resume from it." in text.splitlines()
    assert not [n for n in os.listdir(run) if n.startswith((".worker", "workertemp"))]


@pytest.mark.slow
def test_launcher_sets_tf_config_prefixes_output_and_passes_failures_on(tmp_path):
    script = str(REPO / "scripts" / "launch_workers.py")
    show = ("import json, os, sys; c = json.loads(os.environ['TF_CONFIG']); "
            "print(c['task']['index'], c['task']['type'], *c['cluster']['worker']); "
            "sys.exit(7 if c['task']['index'] == 2 else 0)")
    proc = subprocess.run([sys.executable, script, "--num_workers=3", "--", sys.executable,
                           "-c", show], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 7
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("[worker"))
    assert len(lines) == 3
    addresses = lines[0].split()[4:]
    assert len(set(addresses)) == 3 and all(a.startswith("127.0.0.1:") for a in addresses)
    assert lines == [f"[worker {i}] {i} worker {' '.join(addresses)}" for i in range(3)]
    assert "launch_workers: worker 2 exited with 7" in proc.stderr

    # SIGTERM to the launcher reaches every worker (they exit by that signal: 128 + 15).
    wait = "import signal, sys, time; print('up', flush=True); time.sleep(60)"
    launcher = subprocess.Popen([sys.executable, script, "--num_workers=2", "--",
                                 sys.executable, "-c", wait], stdout=subprocess.PIPE, text=True)
    ups = 0
    for line in launcher.stdout:
        ups += line.rstrip().endswith("] up")
        if ups == 2:
            break
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(60) == 128 + signal.SIGTERM


def test_tf_config_names_the_cluster_and_the_task():
    config = json.loads(launch_workers.tf_config(["127.0.0.1:1", "127.0.0.1:2"], 1))
    assert config == {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                      "task": {"type": "worker", "index": 1}}
    ports = launch_workers.free_ports(4)
    assert len(set(ports)) == 4 and all(p > 0 for p in ports)
