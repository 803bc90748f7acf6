"""The fused kernels under several buffer alignments, for `test_kernel_bits`.

A TensorFlow tensor starts 64-byte aligned, so where a row starts is set by its index: with
rows of WIDTH = 101 floats (404 bytes), the rows of `x[k:k + ROWS]` start 404 * k bytes away
from where they lie in `x`, and the OFFSETS k = 0 .. 15 put each row at every alignment mod
64 (and the elementwise kernels' 1024-element chunks at 16 other places). Each kernel computes
a row, or an element, from that row or element alone, so each slice's outputs must equal the
full tensor's rows bit for bit. The sums over rows (LayerNorm's dgamma and dbeta) are
repeated between allocations of other sizes, which move the heap.

`python tests/kernels/kernel_bits.py OUT.npz` writes `full_outputs()` and the mismatches of
`alignment_mismatches()` (run with `TF_NUM_INTRAOP_THREADS` set).
"""

import sys

import numpy as np

ROWS, WIDTH, OFFSETS = 999, 101, range(16)  # ROWS * WIDTH leaves a partial last chunk
REPEATS = 6


def _inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    rows = ROWS + len(OFFSETS)

    def normal(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return {"x": normal(rows, WIDTH, scale=2.0), "dy": normal(rows, WIDTH),
            "other": normal(rows, WIDTH), "gamma": normal(WIDTH), "beta": normal(WIDTH),
            "bias": np.where(rng.random(WIDTH) < 0.2, -1e4, 0.0).astype(np.float32),
            "labels": rng.integers(0, WIDTH, rows), "upstream": normal(rows)}


def _row_outputs(inputs: dict, lo: int, hi: int) -> dict[str, np.ndarray]:
    """Every kernel's outputs that follow from each row (or element) alone, on rows [lo, hi)
    of the inputs as a tensor of their own: {name: array whose first axis is the row}."""
    import tensorflow as tf  # noqa: PLC0415

    from bert_trainer import kernels  # noqa: PLC0415

    lib = kernels.library(required=True)
    x, dy, other = (tf.constant(inputs[n][lo:hi]) for n in ("x", "dy", "other"))
    gamma, beta = tf.constant(inputs["gamma"]), tf.constant(inputs["beta"])
    seed = tf.constant([3, 11], tf.int64)
    out = {}
    y, mean, rstd = lib.bert_layer_norm(x, gamma, beta, epsilon=1e-12)
    out.update(layer_norm=y, layer_norm_mean=mean, layer_norm_rstd=rstd)
    out["layer_norm_dx"] = lib.bert_layer_norm_grad(dy, x, gamma, mean, rstd)[0]
    out["gelu"], out["gelu_grad"] = lib.bert_gelu(x), lib.bert_gelu_grad(dy, x)
    scores = 3.0 * x[None, None]  # [1, 1, queries, keys]: a row is a query
    probs = lib.bert_attention_softmax(scores, tf.constant(inputs["bias"])[None, None], seed,
                                       rate=0.0)[0]
    out["attention_softmax"] = probs[0, 0]
    out["attention_softmax_grad"] = lib.bert_attention_softmax_grad(dy[None, None], probs,
                                                                    seed, rate=0.0)[0, 0]
    logits, labels = 4.0 * x, tf.constant(inputs["labels"][lo:hi], tf.int64)
    loss, top, row_max, log_sum = lib.bert_sparse_softmax_xent(logits, labels)
    out.update(xent=loss, xent_top=top, xent_max=row_max, xent_log_sum=log_sum)
    out["xent_grad"] = lib.bert_sparse_softmax_xent_grad(
        logits, labels, row_max, log_sum, tf.constant(inputs["upstream"][lo:hi]))
    variable, m, v = tf.Variable(x), tf.Variable(dy), tf.Variable(tf.abs(other))
    f32 = lambda value: tf.constant(value, tf.float32)  # noqa: E731
    kernels.apply_adamw(variable, m, v, other * 0.1, lr=f32(1e-3), beta1_power=f32(0.9),
                        beta2_power=f32(0.999), beta1=f32(0.9), beta2=f32(0.999),
                        epsilon=f32(1e-6), weight_decay=f32(0.01), grad_scale=f32(0.5))
    out.update(adamw_variable=variable, adamw_m=m, adamw_v=v)
    return {name: np.asarray(value) for name, value in out.items()}


def _row_sums(inputs: dict) -> dict[str, np.ndarray]:
    """LayerNorm's dgamma and dbeta (sums over rows) on the full inputs, REPEATS times, with
    allocations of other sizes in between: {name: [REPEATS, WIDTH]}."""
    import tensorflow as tf  # noqa: PLC0415

    from bert_trainer import kernels  # noqa: PLC0415

    lib = kernels.library(required=True)
    x, dy = tf.constant(inputs["x"]), tf.constant(inputs["dy"])
    gamma, beta = tf.constant(inputs["gamma"]), tf.constant(inputs["beta"])
    _, mean, rstd = lib.bert_layer_norm(x, gamma, beta, epsilon=1e-12)
    ballast, found = [], {"layer_norm_dgamma": [], "layer_norm_dbeta": []}
    for size in [int(s) for s in np.random.default_rng(5).integers(1, 6000, REPEATS)]:
        ballast.append(np.ones(size, np.float32))  # moves where the next malloc lands
        _, dgamma, dbeta = lib.bert_layer_norm_grad(dy, x, gamma, mean, rstd)
        found["layer_norm_dgamma"].append(dgamma.numpy())
        found["layer_norm_dbeta"].append(dbeta.numpy())
    return {name: np.stack(values) for name, values in found.items()}


def full_outputs() -> dict[str, np.ndarray]:
    """Every kernel output on the full inputs, and the repeated sums over rows."""
    inputs = _inputs()
    return {**_row_outputs(inputs, 0, len(inputs["x"])), **_row_sums(inputs)}


def alignment_mismatches(full: dict[str, np.ndarray]) -> list[str]:
    """'name at offset k: n elements differ' for each slice output that is not bit for bit
    the full tensor's rows; `full` is `full_outputs()`."""
    inputs, found = _inputs(), []
    for k in OFFSETS:
        for name, value in _row_outputs(inputs, k, k + ROWS).items():
            expected = full[name][k:k + ROWS]
            differ = int(np.sum(value.view(np.uint32) != expected.view(np.uint32)))
            if differ:
                found.append(f"{name} at offset {k}: {differ} of {value.size} elements differ")
    return found


if __name__ == "__main__":
    outputs = full_outputs()
    np.savez(sys.argv[1], mismatches=np.array(alignment_mismatches(outputs), dtype=str),
             **outputs)
