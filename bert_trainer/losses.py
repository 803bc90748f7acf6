"""The masked LM's loss and accuracy: softmax cross-entropy over a large vocabulary, and
whether the label scored highest (no argmax).

Both are ops with a fused CPU kernel; `bert_trainer.ops.cross_entropy` holds them (the kernel
where it runs, else TensorFlow's ops with a gradient that reuses the forward pass) and says why
they are shaped as they are.
"""

from bert_trainer.ops import label_is_top, sparse_softmax_cross_entropy

__all__ = ["label_is_top", "sparse_softmax_cross_entropy"]
