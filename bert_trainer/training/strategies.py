"""`tf.distribute` strategies by name, and the chief-only-writes rule of multi-worker runs.

In a multi-worker run every worker must take part in writing a checkpoint (the variables are
read with collective ops), but only the chief's files may land in `model_dir`. The standard
pattern, used here: the chief writes to `model_dir`; every other worker writes to a private
temporary directory inside it and deletes that directory when done.
"""

import json
import os
import shutil

import tensorflow as tf
from absl import logging

from bert_trainer.errors import UserError

STRATEGY_NAMES = ("default", "one_device", "mirrored", "multi_worker_mirrored", "tpu")


def tf_config() -> tuple[dict, dict]:
    """(cluster, task) of the `TF_CONFIG` environment variable; empty where it is unset or
    not a JSON object (`check_tf_config` refuses a malformed one)."""
    try:
        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
        return dict(config.get("cluster", {})), dict(config.get("task", {}))
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        return {}, {}


_TF_CONFIG_EXAMPLE = ('{"cluster": {"worker": ["host1:2222", "host2:2222"]}, '
                      '"task": {"type": "worker", "index": 0}}')


def check_tf_config() -> None:
    """Refuses, in one line, a set `TF_CONFIG` that is not a JSON object whose "cluster" and
    "task" are objects (TensorFlow's own parse ends in a 48-line traceback)."""
    text = os.environ.get("TF_CONFIG")
    if not text:
        return
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"TF_CONFIG is not valid JSON ({e.msg} at character {e.pos}); set it "
                        f"as in {_TF_CONFIG_EXAMPLE}, or unset it") from None
    if not (isinstance(config, dict) and isinstance(config.get("cluster", {}), dict)
            and isinstance(config.get("task", {}), dict)):
        raise UserError("TF_CONFIG must be a JSON object whose \"cluster\" and \"task\" are "
                        f"objects, as in {_TF_CONFIG_EXAMPLE}; it is {text[:80]!r}")


def get_strategy(name: str = "default", *, tpu_address: str | None = None,
                 num_gpus: int | None = None) -> tf.distribute.Strategy:
    """Builds a distribution strategy.

    Args:
        name: one of `STRATEGY_NAMES`. "default" is TensorFlow's no-op strategy (one device);
            "one_device" pins to the first GPU (or the CPU); "mirrored" replicates over the local
            GPUs (or the CPU); "multi_worker_mirrored" reads the cluster from `TF_CONFIG`;
            "tpu" connects to `tpu_address`.
        tpu_address: the TPU's name or grpc address, for "tpu" only ("" means the local TPU).
        num_gpus: how many local GPUs "mirrored"/"one_device" use; None: all (mirrored) or
            the first (one_device); 0, or no GPU: the CPU.

    Returns:
        The strategy. Its `scope()` must be entered to build models and optimizers.

    Raises:
        UserError: an unknown name, or options that do not fit the strategy.
    """
    if name not in STRATEGY_NAMES:
        raise UserError(f"--strategy={name!r} is unknown; choose one of: "
                        f"{', '.join(STRATEGY_NAMES)}")
    if tpu_address is not None and name != "tpu":
        raise UserError(f"--tpu is only used with --strategy=tpu, not --strategy={name}")
    if num_gpus is not None and num_gpus < 0:
        raise UserError(f"--num_gpus={num_gpus} must be >= 0")
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "tpu":
        return _tpu_strategy(tpu_address or "")
    if name == "multi_worker_mirrored":
        check_tf_config()
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    if num_gpus is not None and num_gpus > len(gpus):
        raise UserError(f"--num_gpus={num_gpus} but this machine has {len(gpus)} GPU(s)")
    # No GPU (or --num_gpus=0): the CPU.
    devices = (gpus if num_gpus is None else gpus[:num_gpus]) or ["/cpu:0"]
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(devices[0])
    return tf.distribute.MirroredStrategy(devices)


def _tpu_strategy(tpu_address: str) -> tf.distribute.TPUStrategy:
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu_address)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, tf.errors.OpError) as e:
        raise UserError(f"--tpu={tpu_address!r}: cannot connect to the TPU ({e})") from None
    return tf.distribute.TPUStrategy(resolver)


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True for the worker that owns `model_dir` (always true outside multi-worker runs).

    The chief is the task of type "chief", or worker 0 when the cluster names no chief.
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    if resolver.task_type == "chief":
        return True
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    return resolver.task_type == "worker" and resolver.task_id == 0 and not has_chief


def write_dir(model_dir: str, strategy: tf.distribute.Strategy) -> str:
    """Where this worker writes checkpoints: `model_dir` for the chief, a private dir otherwise.

    Args:
        model_dir: the run's directory.
        strategy: the run's strategy.

    Returns:
        A directory path; for a non-chief worker, `model_dir/.worker_<type>_<id>` (remove it
        with `remove_write_dir` at the end of the run).
    """
    if is_chief(strategy):
        return model_dir
    resolver = strategy.cluster_resolver
    return os.path.join(model_dir, f".worker_{resolver.task_type}_{resolver.task_id}")


def remove_write_dir(directory: str, model_dir: str) -> None:
    """Deletes a non-chief worker's private directory (no-op for the chief's `model_dir`)."""
    if os.path.abspath(directory) != os.path.abspath(model_dir):
        shutil.rmtree(directory, ignore_errors=True)
        logging.info("Removed this worker's temporary directory %s", directory)
