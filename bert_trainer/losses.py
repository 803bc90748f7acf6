"""Softmax cross-entropy over a large vocabulary, and whether the label scored highest.

Both are ops with a fused CPU kernel (`bert_trainer.ops.cross_entropy`, where the speed
choices are described): the kernel where it runs, else TensorFlow's ops with a gradient
that reuses the forward pass.
"""

from bert_trainer import ops


def sparse_softmax_cross_entropy(labels, logits):
    """`-log softmax(logits)[label]` per row, with a gradient that reuses the forward pass.

    Args:
      labels: int `[...]`, each in `[0, num_classes)`.
      logits: float32 `[..., num_classes]`.

    Returns:
      float32 `[...]`, as `tf.nn.sparse_softmax_cross_entropy_with_logits`.
    """
    return ops.sparse_softmax_cross_entropy(labels, logits)


def label_is_top(labels, logits):
    """1.0 where the label's logit is the row's highest, else 0.0 (float32 `[...]`).

    Accuracy without an argmax: one max and one gather. A tie with the label counts as a hit
    (argmax would pick the lowest index).
    """
    return ops.label_is_top(labels, logits)
