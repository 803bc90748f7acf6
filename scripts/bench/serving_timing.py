"""The serving benchmark's clocks: throughput over batches, latency one input at a time.

Shared by the bert-train worker (`serving.py`) and the bare TensorFlow one
(`serving_bare_tf.py`), so both time the same way; numpy and time only.
"""

import time

import numpy as np


def throughput(call, inputs: list, batch_size: int) -> dict:
    """Inputs/s of `call` over `inputs` in batches of `batch_size`, in their order (after one
    warm-up batch, which traces and loads what a first call does)."""
    call(inputs[:batch_size])
    start = time.perf_counter()
    for first in range(0, len(inputs), batch_size):
        call(inputs[first:first + batch_size])
    seconds = time.perf_counter() - start
    return {"inputs": len(inputs), "batch_size": batch_size, "seconds": seconds,
            "inputs_per_s": len(inputs) / seconds}


def latency(call, inputs: list) -> dict:
    """p50 and p99 milliseconds of `call` on one input at a time (after one warm-up call)."""
    call(inputs[:1])
    times = []
    for item in inputs:
        start = time.perf_counter()
        call([item])
        times.append(1000 * (time.perf_counter() - start))
    return {"inputs": len(inputs), "p50_ms": float(np.percentile(times, 50)),
            "p99_ms": float(np.percentile(times, 99))}
