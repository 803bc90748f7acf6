"""Strategies by name, the chief rule, and MirroredStrategy matching one device."""

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf
from conftest import REPO, TESTS

from bert_trainer.errors import UserError
from bert_trainer.training import strategies

# Logical CPU devices must be configured before TensorFlow initializes its devices, which the
# test process has already done: the comparison runs in a fresh interpreter.
MIRRORED_SCRIPT = """
import json, sys
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from toy_task import ToyConfig, ToyTask
from bert_trainer.training.optimization import OptimizerConfig
from bert_trainer.training.trainer import Trainer, TrainerConfig

def run(strategy, model_dir, accumulation_steps):
    # "micro": each batch of 8 in micro-batches of 2 per replica (batch fitting's split).
    micro = dict(micro_batch_size=2) if accumulation_steps == "micro" else dict(
        accumulation_steps=accumulation_steps)
    config = TrainerConfig(train_steps=6, steps_per_loop=3, summary_interval=6, **micro)
    trainer = Trainer(ToyTask(ToyConfig()), model_dir, config=config, strategy=strategy,
                      optimizer=OptimizerConfig(learning_rate=1e-2, warmup_steps=2))
    result = trainer.train_and_evaluate()
    return result, [v.numpy() for v in trainer.model.trainable_variables]

out = {"replicas": tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).num_replicas_in_sync}
for k in (1, 2, "micro"):
    one, w1 = run(None, f"{sys.argv[1]}/one_{k}", k)
    two, w2 = run(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]), f"{sys.argv[1]}/two_{k}", k)
    out[k] = {"loss": [one.train["loss"], two.train["loss"]],
              "eval": [one.eval, two.eval],
              "max_weight_difference": max(float(np.abs(a - b).max()) for a, b in zip(w1, w2))}
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_mirrored_over_two_cpus_matches_one_device(tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([str(TESTS), str(REPO)]))
    proc = subprocess.run([sys.executable, "-c", MIRRORED_SCRIPT, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["replicas"] == 2
    for k in ("1", "2", "micro"):  # plain steps, 2-step accumulation, fitted micro-batches
        one, two = result[k]["loss"]
        assert two == pytest.approx(one, rel=1e-5, abs=1e-6)
        assert result[k]["max_weight_difference"] < 1e-5
        one_eval, two_eval = result[k]["eval"]
        assert two_eval["num_examples"] == one_eval["num_examples"] == 40  # uneven last batch
        for name in ("loss", "accuracy", "host_accuracy"):
            assert two_eval[name] == pytest.approx(one_eval[name], rel=1e-5, abs=1e-6)


def test_default_strategy_and_unknown_names():
    assert strategies.get_strategy("default") is tf.distribute.get_strategy()
    assert isinstance(strategies.get_strategy("one_device"), tf.distribute.OneDeviceStrategy)
    cpu_only = strategies.get_strategy("mirrored", num_gpus=0)
    assert cpu_only.extended.worker_devices == ("/job:localhost/replica:0/task:0/device:CPU:0",)
    names = "default, one_device, mirrored, multi_worker_mirrored, tpu"
    with pytest.raises(UserError, match=f"--strategy='horovod' is unknown; choose one of: {names}"):
        strategies.get_strategy("horovod")
    with pytest.raises(UserError, match="--tpu is only used with --strategy=tpu"):
        strategies.get_strategy("mirrored", tpu_address="grpc://10.0.0.2:8470")
    with pytest.raises(UserError, match="--num_gpus=4 but this machine has 0 GPU"):
        strategies.get_strategy("mirrored", num_gpus=4)


class _FakeMultiWorker:
    """What `is_chief` reads from a MultiWorkerMirroredStrategy: its cluster resolver."""

    def __init__(self, cluster: dict, task_type: str, task_id: int):
        self.cluster_resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster), task_type=task_type, task_id=task_id)


@pytest.mark.parametrize("cluster, task_type, task_id, chief", [
    ({"worker": ["a:1", "b:2"]}, "worker", 0, True),
    ({"worker": ["a:1", "b:2"]}, "worker", 1, False),
    ({"chief": ["c:0"], "worker": ["a:1"]}, "chief", 0, True),
    ({"chief": ["c:0"], "worker": ["a:1"]}, "worker", 0, False),
])
def test_only_the_chief_writes_to_model_dir(tmp_path, cluster, task_type, task_id, chief):
    strategy = _FakeMultiWorker(cluster, task_type, task_id)
    assert strategies.is_chief(strategy) is chief
    directory = strategies.write_dir(str(tmp_path), strategy)
    if chief:
        assert directory == str(tmp_path)
    else:
        assert directory == str(tmp_path / f".worker_{task_type}_{task_id}")
        os.makedirs(directory)
    strategies.remove_write_dir(directory, str(tmp_path))
    assert tmp_path.is_dir() and os.listdir(tmp_path) == []
    assert strategies.is_chief(tf.distribute.get_strategy())
