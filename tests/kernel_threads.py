"""Every fused kernel, forward and backward, on inputs large enough that `ParallelFor` splits
them over the intra-op threads: what `test_kernels`' thread test compares between processes
with different thread counts.

`python tests/kernel_threads.py OUT.npz` writes the results (run with `TF_NUM_INTRAOP_THREADS`
set); `results()` computes them in the calling process.
"""

import sys

import numpy as np


def results() -> dict[str, np.ndarray]:
    """{name: array} for each kernel's outputs and gradients, from fixed inputs."""
    import tensorflow as tf  # noqa: PLC0415

    from bert_trainer import kernels  # noqa: PLC0415

    rng = np.random.default_rng(7)

    def const(*shape, scale=1.0):
        return tf.constant(rng.standard_normal(shape).astype("float32") * scale)

    out = {}
    batch, heads, seq, dim = 4, 4, 128, 32
    x = const(batch, seq, heads * dim, scale=2.0)
    gamma, beta = const(heads * dim), const(heads * dim)
    scores = const(batch, heads, seq, seq, scale=3.0)
    bias = tf.constant(np.where(rng.random((batch, 1, seq)) < 0.2, -1e4, 0.0).astype("float32"))
    fused = const(batch, seq, 3 * heads * dim)
    lengths = rng.integers(1, seq + 1, batch)
    mask = np.arange(seq)[None, :] < lengths[:, None]
    index = tf.constant(np.where(mask, np.cumsum(mask).reshape(mask.shape) - 1, -1), tf.int32)
    rows = tf.constant(np.flatnonzero(mask), tf.int32)
    packed = const(int(mask.sum()), 3 * heads * dim)
    logits = const(batch * seq, 3000, scale=4.0)
    labels = tf.constant(rng.integers(0, 3000, batch * seq), tf.int64)
    seed = tf.constant([3, 11], tf.int64)
    watched = [x, gamma, beta, scores, fused, packed, logits]
    with tf.GradientTape() as tape:
        tape.watch(watched)
        terms = {
            "dropout": kernels.dropout(x, 0.1, seed),
            "layer_norm": kernels.layer_norm(x, gamma, beta, 1e-12),
            "gelu": kernels.gelu(x),
            "attention_softmax": kernels.attention_softmax(scores, bias, 0.1, seed),
            "split_heads": tf.stack(kernels.split_heads(fused, 3, heads)),
            "split_heads_packed": tf.stack(kernels.split_heads_packed(packed, index, 3, heads)),
            "pack_rows": kernels.pack_rows(tf.reshape(x, [batch * seq, -1]), rows),
            "xent": kernels.sparse_softmax_cross_entropy(labels, logits)[0],
        }
        terms["merge_heads"] = kernels.merge_heads(
            tf.unstack(terms["split_heads"] * 1.5))
        terms["merge_heads_packed"] = kernels.merge_heads_packed(
            tf.unstack(terms["split_heads_packed"] * 0.5), index)
        terms["unpack_rows"] = kernels.unpack_rows(terms["pack_rows"] * 2.0, rows, batch * seq)
        # A nonlinear loss: each element's upstream gradient differs (cos(t + i)).
        loss = tf.add_n([tf.reduce_sum(tf.sin(t + float(i)))
                         for i, t in enumerate(terms.values())])
    grads = tape.gradient(loss, watched)
    for name, value in terms.items():
        out[name] = value.numpy()
    for name, grad in zip(("x", "gamma", "beta", "scores", "fused", "packed", "logits"), grads,
                          strict=True):
        out[f"grad_{name}"] = grad.numpy()
    variable, m, v = (tf.Variable(const(4096, 64)) for _ in range(3))
    v.assign(tf.abs(v))
    f32 = lambda value: tf.constant(value, tf.float32)  # noqa: E731
    kernels.apply_adamw(variable, m, v, const(4096, 64), lr=f32(1e-3), beta1_power=f32(0.9),
                        beta2_power=f32(0.999), beta1=f32(0.9), beta2=f32(0.999),
                        epsilon=f32(1e-6), weight_decay=f32(0.01), grad_scale=f32(0.5))
    out["adamw_variable"], out["adamw_m"], out["adamw_v"] = (
        variable.numpy(), m.numpy(), v.numpy())
    return out


if __name__ == "__main__":
    np.savez(sys.argv[1], **results())
