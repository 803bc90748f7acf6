"""The hardware reference for MFU: `tf.matmul` throughput measured in the same run."""

import tensorflow as tf


def build(n: int = 2048, dtype: str = "float32"):
    """Two random [n, n] matrices and a runner that multiplies them.

    Args:
      n: matrix side; 2048 is large enough for oneDNN to reach its peak on CPU.
      dtype: "float32", or "bfloat16" (the reference for bfloat16 steps).

    Returns:
      (info, run): run(k) does k matmuls and returns {"flops": 2 * n**3 * k}.
    """
    a = tf.cast(tf.random.stateless_uniform((n, n), seed=(1, 2)), dtype)
    b = tf.cast(tf.random.stateless_uniform((n, n), seed=(3, 4)), dtype)
    matmul = tf.function(tf.matmul)
    matmul(a, b).numpy()  # Warm-up: tracing and oneDNN primitive creation.

    def run(k: int) -> dict:
        c = None
        for _ in range(k):
            c = matmul(a, b)
        c[0, 0].numpy()  # Waits for the last product.
        return {"flops": 2 * n**3 * k}

    return {"n": n, "dtype": dtype,
            "threads": tf.config.threading.get_intra_op_parallelism_threads()}, run
