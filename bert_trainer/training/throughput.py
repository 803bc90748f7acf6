"""Training telemetry: the hardware's peak FLOP/s and the rates TensorBoard shows.

The model FLOPs come from the task (`Task.flops_counter`), which asks its model: the count
is the model's business (`bert_trainer.models.flops` for the BERT models), so the trainer runs
any task and reports FLOP rates where the task can count them.

MFU = achieved model FLOP/s / peak FLOP/s. The peak is the datasheet number when the user gives
one (`TrainerConfig.peak_flops`, else `$BERT_TRAIN_PEAK_FLOPS` for every run of a shell or a
cluster job), else a short `tf.matmul` measured on the training device in the run's compute
precision at the start of the run (about half a second).
"""

import dataclasses
import os
import time

import tensorflow as tf
from absl import logging

from bert_trainer.errors import UserError

PEAK_ENV = "BERT_TRAIN_PEAK_FLOPS"


@dataclasses.dataclass(frozen=True)
class Counts:
    """What the train step counted since its last metric reset.

    Attributes:
        examples: sequences trained on.
        tokens: non-padding tokens (None: the batches have no input mask).
        token_slots: tokens including padding, examples x seq_length (None: no input mask).
        flops: model training FLOPs (None: the model's FLOPs are unknown).
    """

    examples: float
    tokens: float | None = None
    token_slots: float | None = None
    flops: float | None = None


def rates(counts: Counts, seconds: float, peak_flops: float | None) -> dict[str, float]:
    """The throughput scalars of one summary interval.

    Args:
        counts: from `TrainStep.counts()` over the interval.
        seconds: the interval's wall time.
        peak_flops: the hardware's peak FLOP/s for all replicas (None: no MFU).

    Returns:
        {"examples_per_second"} plus, where counted, "tokens_per_second",
        "padding_fraction" (1 - real tokens / token slots), "model_gflops_per_second" and "mfu".
    """
    seconds = max(seconds, 1e-9)
    values = {"examples_per_second": counts.examples / seconds}
    if counts.tokens is not None:
        values["tokens_per_second"] = counts.tokens / seconds
    if counts.token_slots:
        values["padding_fraction"] = 1.0 - counts.tokens / counts.token_slots
    if counts.flops is not None:
        values["model_gflops_per_second"] = counts.flops / seconds / 1e9
        if peak_flops:
            values["mfu"] = counts.flops / seconds / peak_flops
    return values


def measure_peak_flops(dtype: str = "float32", device: str | None = None, *, size: int = 1024,
                       seconds: float = 0.3) -> float:
    """The FLOP/s of a square `tf.matmul` on `device`: a reference peak for MFU.

    The best of repeated products within `seconds` (after a warm-up product): the fastest one
    is the least disturbed by other processes.

    Args:
        dtype: the run's compute dtype ("float32", "bfloat16" or "float16").
        device: e.g. "/device:GPU:0"; None: TensorFlow's default placement.
        size: matrix side; 1024 keeps the calibration under a second on a CPU. On GPUs a
            larger side (4096) is needed to saturate the device.
        seconds: how long to keep measuring.

    Returns:
        FLOP/s (2 * size**3 per product).
    """
    with tf.device(device):
        a = tf.cast(tf.random.stateless_uniform((size, size), seed=(1, 2)), dtype)
        b = tf.cast(tf.random.stateless_uniform((size, size), seed=(3, 4)), dtype)
        # One element comes back to the host: the timing is the product, not a copy.
        matmul = tf.function(lambda x, y: tf.reduce_sum(tf.matmul(x, y)[:1, :1]))
        matmul(a, b).numpy()  # tracing and kernel selection
        best = float("inf")
        deadline = time.perf_counter() + seconds
        while True:
            start = time.perf_counter()
            matmul(a, b).numpy()
            best = min(best, time.perf_counter() - start)
            if time.perf_counter() > deadline:
                break
    return 2.0 * size**3 / best


def peak_flops(strategy: tf.distribute.Strategy, configured: float | None,
               mixed_precision: str | None) -> float:
    """The peak FLOP/s of all replicas of a run, for MFU; logged once.

    Args:
        strategy: the run's strategy (its first device is measured; replicas are assumed alike).
        configured: `TrainerConfig.peak_flops`, one device's peak (None: `$BERT_TRAIN_PEAK_FLOPS`
            if set, else measure it).
        mixed_precision: the run's precision (None, "bfloat16" or "float16"): the matmul is
            measured in the compute dtype, as bfloat16 units are often several times faster.

    Returns:
        Peak FLOP/s per replica x replicas in sync.
    """
    peak, source = configured, "TrainerConfig.peak_flops"
    if peak is None and os.environ.get(PEAK_ENV, "").strip():
        peak, source = _peak_from_env(), f"${PEAK_ENV}"
    if peak is None:
        dtype = mixed_precision or "float32"
        device = _first_device(strategy)
        size = 1024 if "CPU" in device.upper() else 4096  # accelerators need more to saturate
        peak = measure_peak_flops(dtype, device, size=size)
        source = f"{dtype} tf.matmul {size}x{size} on {device}"
    replicas = strategy.num_replicas_in_sync
    logging.info("Peak for MFU: %.1f GFLOP/s per replica x %d replica(s) (%s)", peak / 1e9,
                 replicas, source)
    return peak * replicas


def check_peak_env() -> None:
    """Refuses a malformed `$BERT_TRAIN_PEAK_FLOPS` now: the training commands call this before
    they write anything (it is read only when the run starts)."""
    if os.environ.get(PEAK_ENV, "").strip():
        _peak_from_env()


def _peak_from_env() -> float:
    text = os.environ[PEAK_ENV].strip()
    try:
        peak = float(text)
    except ValueError:
        peak = None
    if peak is None or not peak > 0 or peak == float("inf"):
        raise UserError(f"{PEAK_ENV}={text!r} must be a number > 0: one device's peak FLOP/s "
                        f"in the run's precision, e.g. 1e12 (or unset it to measure the peak)")
    return peak


def _first_device(strategy: tf.distribute.Strategy) -> str:
    """The device the strategy's first replica computes on."""
    try:
        return strategy.extended.worker_devices[0]
    except RuntimeError:  # the default strategy: TensorFlow's default placement
        accelerators = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices(
            "TPU")
        return (accelerators or tf.config.list_logical_devices("CPU"))[0].name
