"""Training telemetry: model FLOPs, the hardware's peak FLOP/s, and the rates TensorBoard shows.

Model FLOPs (a multiply-add is 2 FLOPs; training = forward + backward = 3 x forward; s tokens
per sequence, P masked predictions, L layers, h hidden, f inner, e embedding width, V vocab):

    per token:     L * 2 * (4*h*h + 2*h*f)     Q, K, V, attention output; FFN in and out
                   + 2*e*h                     embedding projection (only when e != h)
    per sequence:  L * 2 * (2*s*s*h)           scores Q.K^T and probs.V over all heads
                   + 2*h*h                     pooler
                   + 2 * head kernel params    classifier heads (once per sequence)
    per prediction: 2*h*e + 2*e*V              MLM transform and (tied) output projection,
                                               on the P gathered positions only (on the
                                               weighted ones where BertPretrainer skips the
                                               others: `computed_predictions`)

When the last layer computes only q of the s rows as queries (BertPretrainer's sparse last
layer: q = 1 + P, [CLS] and the masked positions), its Q projection, attention output, FFN and
attention scores are counted on those q rows; its K and V projections still on all s.

So training costs 6 * N_matmul * tokens + 12 * L * h * s per token, the usual MFU count
(PaLM, appendix B). Padding tokens are counted where the model computes on them; where it
packs the real tokens (BertPretrainer's `pack_tokens`: `computed_tokens` per sequence), the
dense layers and the last layer's K and V are counted on those, attention still on the padded
s x s (its layout).
Embedding lookups, softmax, LayerNorm, GELU and the optimizer update are elementwise and left out.
Token-level heads (tagging, spans: h x labels per token) are counted once per sequence; the
difference is < 0.1 % of the encoder.

MFU = achieved model FLOP/s / peak FLOP/s. The peak is the datasheet number when the user gives
one (`TrainerConfig.peak_flops`), else a short `tf.matmul` measured on the training device in
the run's compute precision at the start of the run.
"""

import dataclasses
import math
import time
from collections.abc import Callable

import tensorflow as tf
from absl import logging

from bert_trainer import features as F


def training_flops_per_example(*, num_layers, hidden_size, inner_dim, seq_length,
                               embedding_width=None, vocab_size=0, num_predictions=0,
                               head_params=0, last_layer_rows=None, computed_predictions=None,
                               computed_tokens=None):
    """Model FLOPs of one training step (forward + backward) per sequence.

    Plain arithmetic: the size arguments may be Python numbers or scalar tensors (the train
    step passes the batch's sequence length and prediction count as float tensors).

    Args:
        num_layers, hidden_size, inner_dim: the encoder's sizes (RFC names).
        seq_length: tokens per sequence, padding included.
        embedding_width: width of the word embeddings; None: `hidden_size` (no projection).
        vocab_size: vocabulary of the MLM output projection (unused without predictions).
        num_predictions: masked positions per sequence fed to the MLM head (0: no MLM).
        head_params: kernel parameters of the other heads, applied once per sequence.
        last_layer_rows: query rows the last layer computes (None: all `seq_length`).
        computed_predictions: predictions per sequence the MLM head computes, when it skips
            some of the `num_predictions` (BertPretrainer in training: the weighted ones,
            a batch's mean); None: all of them.
        computed_tokens: tokens per sequence the layers compute when the model packs the
            real ones (a batch's mean); None: all `seq_length`.

    Returns:
        FLOPs per sequence (same type as the arguments).
    """
    h, f, s = hidden_size, inner_dim, seq_length
    t = s if computed_tokens is None else computed_tokens
    e = embedding_width or h
    per_sequence = t * num_layers * 2 * (4 * h * h + 2 * h * f)
    if e != h:
        per_sequence += s * 2 * e * h  # the embedding projection runs before packing
    per_sequence += num_layers * 2 * (2 * s * s * h) + 2 * h * h + 2 * head_params
    if last_layer_rows is not None:  # the skipped rows: all but the K and V projections
        per_sequence -= ((t - last_layer_rows) * 2 * (2 * h * h + 2 * h * f)
                         + 2 * (2 * (s - last_layer_rows) * s * h))
    per_prediction = 2 * h * e + 2 * e * vocab_size
    if computed_predictions is None:
        computed_predictions = num_predictions
    return 3 * (per_sequence + computed_predictions * per_prediction)


def model_flops_function(model) -> Callable | None:
    """Binds `training_flops_per_example` to a model built around a bert-train encoder.

    Reads the RFC sizes from `model.encoder.get_config()`; the MLM head is `model.masked_lm`
    (BertPretrainer's public sublayer); every other trainable kernel outside the encoder counts
    as a per-sequence head. A model whose `sparse_last_layer_active` is true is counted with
    its last layer on `1 + num_predictions` query rows: the FLOPs it executes.

    Args:
        model: a task model with an `encoder` attribute.

    Returns:
        fn(seq_length, num_predictions, computed_predictions=None, computed_tokens=None) ->
        training FLOPs per sequence, or None when the model has no encoder with those sizes
        (telemetry then leaves the FLOP figures out).
    """
    encoder = getattr(model, "encoder", None)
    config = encoder.get_config() if encoder is not None else {}
    if not {"num_layers", "hidden_size", "inner_dim", "vocab_size"} <= set(config):
        return None
    masked_lm = getattr(model, "masked_lm", None)
    inside = {id(v) for v in encoder.weights}
    if masked_lm is not None:
        inside |= {id(v) for v in masked_lm.weights}
    head_params = sum(math.prod(v.shape) for v in model.trainable_weights
                      if len(v.shape) >= 2 and id(v) not in inside)
    sizes = dict(num_layers=config["num_layers"], hidden_size=config["hidden_size"],
                 inner_dim=config["inner_dim"], embedding_width=config.get("embedding_width"),
                 vocab_size=config["vocab_size"] if masked_lm is not None else 0,
                 head_params=head_params)

    sparse = bool(getattr(model, "sparse_last_layer_active", False))

    def flops(seq_length, num_predictions=0, computed_predictions=None, computed_tokens=None):
        return training_flops_per_example(
            seq_length=seq_length, num_predictions=num_predictions,
            computed_predictions=computed_predictions, computed_tokens=computed_tokens,
            last_layer_rows=1 + num_predictions if sparse else None, **sizes)

    return flops


def batch_flops(flops_fn: Callable, features: dict, mlm_rows=None, packed_tokens=None):
    """Training FLOPs of one batch (float32 scalar tensor), from its dynamic shapes.

    Args:
        flops_fn: from `model_flops_function`.
        features: the batch.
        mlm_rows: predictions the MLM head computed for the whole batch, when it skipped
            some (the length of BertPretrainer's `mlm_rows` output); None: every slot.
        packed_tokens: tokens per layer the encoder computed for the whole batch, when it
            packed the real ones (`BertPretrainer.packed_tokens`); None: every slot.
    """
    ids = features[F.INPUT_WORD_IDS]
    batch = tf.cast(tf.shape(ids)[0], tf.float32)
    seq_length = tf.cast(tf.shape(ids)[1], tf.float32)
    predictions = 0.0
    if F.MASKED_LM_POSITIONS in features:
        predictions = tf.cast(tf.shape(features[F.MASKED_LM_POSITIONS])[1], tf.float32)
    computed = None if mlm_rows is None else tf.cast(mlm_rows, tf.float32) / batch
    tokens = None if packed_tokens is None else tf.cast(packed_tokens, tf.float32) / batch
    return batch * flops_fn(seq_length, predictions, computed, tokens)


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
        configured: `TrainerConfig.peak_flops`, one device's peak (None: measure it).
        mixed_precision: the run's precision (None, "bfloat16" or "float16"): the matmul is
            measured in the compute dtype, as bfloat16 units are often several times faster.

    Returns:
        Peak FLOP/s per replica x replicas in sync.
    """
    peak, source = configured, "TrainerConfig.peak_flops"
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


def _first_device(strategy: tf.distribute.Strategy) -> str:
    """The device the strategy's first replica computes on."""
    try:
        return strategy.extended.worker_devices[0]
    except RuntimeError:  # the default strategy: TensorFlow's default placement
        accelerators = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices(
            "TPU")
        return (accelerators or tf.config.list_logical_devices("CPU"))[0].name
