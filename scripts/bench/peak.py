"""The hardware reference for MFU: fp32 `tf.matmul` throughput measured in the same run."""

import tensorflow as tf


def build(n: int = 2048):
    """Two random [n, n] float32 matrices and a runner that multiplies them.

    Args:
      n: matrix side; 2048 is large enough for oneDNN to reach its peak on CPU.

    Returns:
      (info, run): run(k) does k matmuls and returns {"flops": 2 * n**3 * k}.
    """
    a = tf.random.stateless_uniform((n, n), seed=(1, 2))
    b = tf.random.stateless_uniform((n, n), seed=(3, 4))
    matmul = tf.function(tf.matmul)
    matmul(a, b).numpy()  # Warm-up: tracing and oneDNN primitive creation.

    def run(k: int) -> dict:
        c = None
        for _ in range(k):
            c = matmul(a, b)
        c[0, 0].numpy()  # Waits for the last product.
        return {"flops": 2 * n**3 * k}

    return {"n": n, "threads": tf.config.threading.get_intra_op_parallelism_threads()}, run
