"""Memory a training step takes: a cheap estimate for BERT encoders, and the CPU's measures
(what is available, the process's RSS and its peak) that batch fitting (`batch_fit.py`)
compares with it. psutil is not a dependency: /proc and os.sysconf are read directly.
"""

import os
import re
import resource
import sys

# ----------------------------------------------------------------------------- the estimate

def activation_bytes_per_example(*, num_layers: int, hidden_size: int, inner_dim: int,
                                 num_attention_heads: int, seq_length: int,
                                 value_bytes: int) -> int:
    """Activation bytes one example keeps for the backward pass of a BERT encoder.

    Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
    section 4.1) count per layer and token, in 16-bit values with 1-byte dropout masks,
    `34 h + 5 a s` bytes for inner_dim 4h. Here by term: attention 5h values + 2as (softmax and
    its dropout) + h + as mask bytes, feed-forward h + 2 inner_dim values + h mask bytes,
    layer norms 2h values; plus the embeddings (3h values + h mask bytes per token).

    Args:
        num_layers, hidden_size, inner_dim, num_attention_heads: the encoder's sizes.
        seq_length: tokens per example.
        value_bytes: 4 for float32, 2 for bfloat16/float16 activations.

    Returns:
        Bytes per example.
    """
    h, a, s = hidden_size, num_attention_heads, seq_length
    per_token_layer = value_bytes * (8 * h + 2 * inner_dim + 2 * a * s) + 2 * h + a * s
    embeddings = value_bytes * 3 * h + h
    return s * (num_layers * per_token_layer + embeddings)


def estimate_step_bytes(*, num_params: int, per_example: int, micro_batch: int,
                        accumulating: bool) -> int:
    """Bytes a training step adds to memory already holding the weights and optimizer slots:
    the float32 gradients (and as many again for the accumulators when accumulating) plus
    the activations of `micro_batch` examples."""
    return 4 * num_params * (2 if accumulating else 1) + micro_batch * per_example


def encoder_activation_bytes(model, seq_length: int | None, mixed_precision: str | None):
    """`activation_bytes_per_example` of a model around a bert-train encoder; None when the
    model has no `encoder` with the RFC sizes (its probe then decides alone)."""
    encoder = getattr(model, "encoder", None)
    config = encoder.get_config() if encoder is not None else {}
    names = ("num_layers", "hidden_size", "inner_dim", "num_attention_heads")
    if seq_length is None or not set(names) <= set(config):
        return None
    return activation_bytes_per_example(**{n: config[n] for n in names}, seq_length=seq_length,
                                        value_bytes=2 if mixed_precision else 4)


# ------------------------------------------------------------------------- CPU memory

def available_bytes() -> int:
    """Memory the process may still take: MemAvailable, bounded by a cgroup v2 limit."""
    try:
        with open("/proc/meminfo") as f:
            available = int(re.search(r"MemAvailable:\s+(\d+) kB", f.read()).group(1)) * 1024
    except (OSError, AttributeError):
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read())
        if limit != "max":
            available = min(available, int(limit) - used)
    except (OSError, ValueError):
        pass  # no cgroup v2 limit
    return max(available, 0)


def _status_bytes(field: str) -> int:
    try:
        with open("/proc/self/status") as f:
            return int(re.search(rf"{field}:\s+(\d+) kB", f.read()).group(1)) * 1024
    except (OSError, AttributeError):  # no /proc: the process's peak (an over-estimate)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes there, else KiB


def rss_bytes() -> int:
    """The process's resident set size now."""
    return _status_bytes("VmRSS")


def measure_peak_rss(fn) -> int:
    """Runs `fn()`; returns the process's peak RSS during it (VmHWM after resetting it to the
    current RSS through /proc/self/clear_refs, Linux >= 4.0; without the reset, the peak of
    the whole process so far: an over-estimate)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    fn()
    return _status_bytes("VmHWM")
