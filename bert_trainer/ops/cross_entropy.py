"""Softmax cross-entropy over a large vocabulary and whether the label scored highest: the
fused kernel or TensorFlow's ops (`switch`).

The masked LM's loss is a softmax over 30k+ classes at every predicted position: for the mini
benchmark step that is a [640, 30522] logits matrix, and TensorFlow's fused
`SparseSoftmaxCrossEntropyWithLogits` plus the accuracy metric's `argmax` are a sizeable share
of the step on CPU (benchmarks/README.md has the measurement). TensorFlow's path here: max,
exp, sum and one gather forward; the backward pass reuses the forward's exponentials
(`softmax - one_hot` as a scale and one scatter), and the hits take one max and one gather
instead of an argmax (faster on that matrix: benchmarks/README.md), the same values to float32
round-off. The kernel computes the loss and the hits together, and its gradient recomputes the
softmax from the logits and each row's saved max and log-sum: no `[rows, classes]` tensor is
kept from the forward pass.
"""

import tensorflow as tf

from bert_trainer.ops.switch import fused


def sparse_softmax_cross_entropy(labels, logits):
    """`-log softmax(logits)[label]` per row.

    Args:
      labels: int `[...]`, each in `[0, num_classes)`.
      logits: float32 `[..., num_classes]`.

    Returns:
      float32 `[...]`, as `tf.nn.sparse_softmax_cross_entropy_with_logits`.
    """
    logits = tf.convert_to_tensor(logits, tf.float32)
    flat_labels, flat_logits = _rows(labels, logits)
    if fused():
        from bert_trainer import kernels  # noqa: PLC0415

        flat_xent = kernels.sparse_softmax_cross_entropy(flat_labels, flat_logits)[0]
    else:
        flat_xent = _xent(flat_logits, flat_labels)
    return tf.reshape(flat_xent, tf.shape(logits)[:-1])


def _rows(labels, logits):
    """int32 labels `[rows]` and logits `[rows, classes]` from `[...]` and `[..., classes]`."""
    flat_logits = tf.reshape(logits, [-1, tf.shape(logits)[-1]])
    return tf.reshape(tf.cast(labels, tf.int32), [-1]), flat_logits


@tf.custom_gradient
def _xent(logits, labels):
    """[rows, classes], [rows] -> [rows]."""
    row_max = tf.reduce_max(logits, axis=-1, keepdims=True)
    exp = tf.exp(logits - row_max)
    total = tf.reduce_sum(exp, axis=-1, keepdims=True)
    label_logit = tf.gather(logits, labels, batch_dims=1)
    xent = tf.squeeze(row_max + tf.math.log(total), -1) - label_logit

    def grad(upstream):
        softmax_scaled = exp * (upstream[:, None] / total)
        rows = tf.range(tf.shape(labels)[0])
        one_hot_scaled = tf.stack([rows, labels], axis=1)
        return tf.tensor_scatter_nd_sub(softmax_scaled, one_hot_scaled, upstream), None

    return xent, grad


def label_is_top(labels, logits):
    """1.0 where the label's logit is the row's highest, else 0.0 (float32 `[...]`).

    A tie with the label counts as a hit (argmax would pick the lowest index). With float32
    logits ties do not occur in practice; bfloat16-rounded logits can tie, rarely.
    """
    logits = tf.convert_to_tensor(logits, tf.float32)
    if fused():  # the loss's op: graph optimization computes it once
        from bert_trainer import kernels  # noqa: PLC0415

        hits = kernels.sparse_softmax_cross_entropy(*_rows(labels, logits))[1]
        return tf.reshape(hits, tf.shape(logits)[:-1])
    label_logit = tf.gather(logits, tf.cast(labels, tf.int32), batch_dims=len(labels.shape))
    return tf.cast(label_logit >= tf.reduce_max(logits, axis=-1), tf.float32)


def smoothed_cross_entropy(labels, logits, smoothing):
    """Cross-entropy against the label smoothed toward uniform: `(1 - s)` on the label and
    `s / num_classes` on every class (Szegedy et al.; the Transformer's 0.1).

    `-(1 - s) log p[label] - s mean(log p)` rewritten with `log p = logits - logsumexp`:
    `xent + s (logits[label] - mean(logits))`, so the softmax part is
    `sparse_softmax_cross_entropy` (the fused kernel where on) and no `[rows, classes]`
    log-probabilities are made.

    Args:
      labels: int `[...]`, each in `[0, num_classes)`.
      logits: float32 `[..., num_classes]`.
      smoothing: python float in `[0, 1)`.

    Returns:
      float32 `[...]`.
    """
    logits = tf.convert_to_tensor(logits, tf.float32)
    xent = sparse_softmax_cross_entropy(labels, logits)
    if not smoothing:
        return xent
    label_logit = tf.gather(logits, tf.cast(labels, tf.int32), batch_dims=len(labels.shape))
    return xent + smoothing * (label_logit - tf.reduce_mean(logits, axis=-1))
