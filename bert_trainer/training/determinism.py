"""Seeds and deterministic kernels: what makes a restarted run end with the same weights.

Exact resume needs three things: the same initial weights (`set_seed` before the model is
built), the same data order (seeded shuffles; the trainer skips the batches a restored run
already consumed) and ops that give the same result every time. On CPU TensorFlow's kernels
are deterministic for a fixed thread count; on GPU some (scatter-add in embedding gradients,
cuDNN autotuning) are not unless `enable_op_determinism` is called, at a speed cost.
"""

import keras
import tensorflow as tf
from absl import logging


def set_seed(seed: int) -> None:
    """Seeds Python, NumPy, TensorFlow and Keras' global seed generator.

    Args:
        seed: any int; the same seed builds the same initial weights and data order.
    """
    keras.utils.set_random_seed(int(seed))


def enable_op_determinism() -> None:
    """Makes every TensorFlow op deterministic (or raise when it cannot be).

    This is process-wide and cannot be undone (TensorFlow has no public switch back), so the
    trainer calls it only when `TrainerConfig.deterministic_ops` asks for it.
    """
    tf.config.experimental.enable_op_determinism()
    logging.info("Op determinism enabled: deterministic kernels only (slower on GPU).")
