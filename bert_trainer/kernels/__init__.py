"""Fused CPU kernels for the training step: the op library, its gradients and its ops.

Without XLA, every elementwise op of a TensorFlow step is a separate pass over memory, and
the pip wheel compiles those ops for a baseline x86 CPU. The C++ sources here (one file per
op family, `build.py` compiles them) hold one-pass kernels for the work of a BERT step that
`tf.matmul` does not cover: dropout (with a mask recomputed from its seed instead of stored),
LayerNorm, exact GELU, the attention probabilities (mask, softmax and dropout), the attention
heads' layout (split / merge), token packing (the rows of the real tokens, packed and
unpacked) and the masked LM's softmax cross-entropy, each forward and backward; and the
optimizer's AdamW update (clip scale, weight decay and Adam in one pass). They are compiled on
first use for the machine's own CPU.

Nothing outside `bert_trainer.ops` calls this package: each op there chooses between these
kernels and TensorFlow's own ops (`bert_trainer.ops.switch`).
"""

import threading

from absl import logging

# What the elementwise and layout kernels (dropout, GELU, the attention probabilities, the
# heads' layout, token packing) take; LayerNorm and the cross-entropy are float32 (their
# layers compute in float32 under mixed precision).
ELEMENTWISE_DTYPES = ("float32", "bfloat16", "float16")

# What running without the kernels costs, as measured (benchmarks/README.md: the mini
# pretraining step with and without them; MiniLM fine-tuning on SST-2, "Without the fused
# kernels"): said in the one warning a run logs when they cannot be built.
COST_WITHOUT_KERNELS = "a pretraining step takes about 1.2x as long, a fine-tuning step 1.3x"

_lock = threading.Lock()
_library = None
_built = None  # build.Build of the loaded library
_error: str | None = None


def library(required: bool = False):
    """The loaded op library, building it on first call; None if it cannot be built.

    The first call that finds them unavailable logs one warning naming the cause, the cost
    and the fix; a build that failed is remembered on disk (`build.py`), so later processes
    do not compile again.

    Args:
      required: raise instead of returning None (`BERT_TRAIN_FUSED_KERNELS=on`).

    Raises:
      RuntimeError: `required` and the library cannot be built or loaded.
    """
    global _library, _built, _error
    with _lock:
        if _library is None and _error is None:
            from bert_trainer.kernels import build  # noqa: PLC0415 - imports TensorFlow

            try:
                found = build.build()
                lib = build.load(found)
                _register_gradients(lib)
                _library, _built = lib, found
                logging.info("Fused CPU kernels loaded from %s (-march %s)", found.path,
                             found.target)
                if found.note:
                    logging.warning("Fused CPU kernels %s", found.note)
            except build.BuildError as e:
                _error = str(e)
                if not required:
                    logging.warning(unavailable_message(_error))
        if _library is None and required:
            raise RuntimeError(f"BERT_TRAIN_FUSED_KERNELS=on but the fused CPU kernels are "
                               f"unavailable: {_error}")
        return _library


def unavailable_message(cause: str) -> str:
    """The one warning of a run without the kernels: cause, cost, fix."""
    return (f"Fused CPU kernels unavailable, using TensorFlow's ops: {cause}. Without them "
            f"{COST_WITHOUT_KERNELS}. Fix the cause above (`bert-train doctor` shows the "
            "details), or set BERT_TRAIN_FUSED_KERNELS=off to choose TensorFlow's ops without "
            "this warning")


def status() -> dict:
    """What `library()` found, building if no call has yet: {"loaded", "path", "target",
    "note", "error"} (for `bert-train doctor`)."""
    library()
    return {"loaded": _library is not None, "path": _built and str(_built.path),
            "target": _built and _built.target, "note": _built and _built.note,
            "error": _error}


# ------------------------------------------------------------------------------- the ops
# Each wrapper emits its op; `bert_trainer.ops` calls it where the kernels run. Gradients
# are registered by op name, so they apply wherever the op appears in a graph.


def dropout(x, rate: float, seed):
    """`x * keep / (1 - rate)`, keep ~ Bernoulli(1 - rate) from a hash of (seed, index).

    Args:
      x: float32, bfloat16 or float16 tensor.
      rate: the drop probability, in [0, 1).
      seed: 2 integers; the same seed gives the same mask.
    """
    import tensorflow as tf  # noqa: PLC0415

    return library().bert_fused_dropout(x, tf.cast(tf.reshape(seed, [2]), tf.int64),
                                        rate=float(rate))


def attention_softmax(scores, bias, rate: float, seed=None):
    """`dropout(softmax(scores + bias))` over the last axis, in one pass per row: the
    attention probabilities. The dropout is `dropout(probs, rate, seed)`'s (the same mask).

    Args:
      scores: `[batch, heads, queries, keys]`, float32, bfloat16 or float16.
      bias: additive, of the scores' dtype, `[batch or 1, queries or 1, keys]`, broadcast
        over the heads: a mask's `0` / large negative values. It gets no gradient.
      rate: the drop probability, in [0, 1); 0 applies no dropout (and ignores `seed`).
      seed: 2 integers (see `dropout`); may be None when `rate` is 0.
    """
    import tensorflow as tf  # noqa: PLC0415

    seed = tf.zeros([2], tf.int64) if seed is None else tf.cast(tf.reshape(seed, [2]), tf.int64)
    return library().bert_attention_softmax(scores, bias, seed, rate=float(rate))[0]


def layer_norm(x, gamma, beta, epsilon: float):
    """float32 LayerNorm over the last axis of `x`, `gamma` and `beta` `[width]`."""
    return library().bert_layer_norm(x, gamma, beta, epsilon=float(epsilon))[0]


def gelu(x):
    """Exact GELU, `x * Phi(x)`."""
    return library().bert_gelu(x)


def split_heads(x, num_splits: int, num_heads: int) -> list:
    """`[batch, seq, num_splits * num_heads * dim]` -> num_splits x `[batch, heads, seq, dim]`."""
    return library().bert_split_heads(x, N=num_splits, num_heads=num_heads)


def merge_heads(heads: list):
    """n x `[batch, heads, seq, dim]` -> `[batch, seq, n * heads * dim]` (`split_heads`'
    inverse); the head count must be static."""
    num_heads = heads[0].shape[1]
    if num_heads is None:
        raise ValueError("merge_heads: the head axis (1) must have a static size")
    return library().bert_merge_heads(heads, num_heads=int(num_heads))


def split_heads_packed(x, index, num_splits: int, num_heads: int) -> list:
    """`split_heads` of packed rows: `x` `[tokens, num_splits * num_heads * dim]` holds the
    slots of `index` (int32 `[batch, seq]`, the kept slots numbered 0, 1, ... in order, -1
    elsewhere); the outputs `[batch, heads, seq, dim]` are zero at the other slots."""
    return library().bert_split_heads_packed(x, index, N=num_splits, num_heads=num_heads)


def merge_heads_packed(heads: list, index):
    """`merge_heads` keeping only `index`'s slots: -> `[tokens, n * heads * dim]`."""
    num_heads = heads[0].shape[1]
    if num_heads is None:
        raise ValueError("merge_heads_packed: the head axis (1) must have a static size")
    return library().bert_merge_heads_packed(heads, index, num_heads=int(num_heads))


def pack_rows(x, rows):
    """`x[rows]`: `[slots, width]` -> `[tokens, width]`; `rows` int32, strictly increasing."""
    return library().bert_pack_rows(x, rows)


def unpack_rows(y, rows, slots):
    """`pack_rows`' inverse: `[tokens, width]` -> `[slots, width]`, zeros at the other slots."""
    import tensorflow as tf  # noqa: PLC0415

    return library().bert_unpack_rows(y, rows, tf.cast(slots, tf.int32))


def sparse_softmax_cross_entropy(labels, logits):
    """(`-log softmax(logits)[label]`, 1.0 where the label's logit is the highest) per row.

    Args:
      labels: int32 or int64 `[rows]`, each in `[0, classes)`.
      logits: float32 `[rows, classes]`.
    """
    loss, label_is_top, _, _ = library().bert_sparse_softmax_xent(logits, labels)
    return loss, label_is_top


def apply_adamw(variable, m, v, grad, *, lr, beta1_power, beta2_power, beta1, beta2, epsilon,
                weight_decay, grad_scale):
    """One AdamW step of float32 `variable` (with its moments `m`, `v`) in one pass:
    `g = grad * grad_scale`; `variable -= variable * weight_decay * lr` (Keras' decoupled
    decay); then `ResourceApplyAdam`'s update with `g`. The scalars are float32 tensors.

    Returns:
      The op (it has no outputs).
    """
    return library().bert_apply_adam_w(
        variable.handle, m.handle, v.handle, grad, lr, beta1_power, beta2_power, beta1, beta2,
        epsilon, weight_decay, grad_scale)


def _register_gradients(lib) -> None:
    """Gradients by op name (TensorFlow's registry), once, when the library loads."""
    import tensorflow as tf  # noqa: PLC0415

    @tf.RegisterGradient("BertFusedDropout")
    def _dropout_grad(op, dy):
        return [lib.bert_fused_dropout(dy, op.inputs[1], rate=op.get_attr("rate")), None]

    @tf.RegisterGradient("BertAttentionSoftmax")
    def _attention_softmax_grad(op, dy, *_):  # probs is an internal output; bias is a mask
        return [lib.bert_attention_softmax_grad(dy, op.outputs[1], op.inputs[2],
                                                rate=op.get_attr("rate")), None, None]

    @tf.RegisterGradient("BertLayerNorm")
    def _layer_norm_grad(op, dy, *_):  # mean and rstd are internal outputs
        dx, dgamma, dbeta = lib.bert_layer_norm_grad(
            dy, op.inputs[0], op.inputs[1], op.outputs[1], op.outputs[2])
        return [dx, dgamma, dbeta]

    @tf.RegisterGradient("BertGelu")
    def _gelu_grad(op, dy):
        return [lib.bert_gelu_grad(dy, op.inputs[0])]

    @tf.RegisterGradient("BertSplitHeads")
    def _split_heads_grad(op, *dys):
        dys = [tf.zeros_like(y) if dy is None else dy
               for y, dy in zip(op.outputs, dys, strict=True)]
        return [lib.bert_merge_heads(dys, num_heads=op.get_attr("num_heads"))]

    @tf.RegisterGradient("BertMergeHeads")
    def _merge_heads_grad(op, dx):
        return lib.bert_split_heads(dx, N=len(op.inputs), num_heads=op.get_attr("num_heads"))

    @tf.RegisterGradient("BertSplitHeadsPacked")
    def _split_heads_packed_grad(op, *dys):
        dys = [tf.zeros_like(y) if dy is None else dy
               for y, dy in zip(op.outputs, dys, strict=True)]
        return [lib.bert_merge_heads_packed(dys, op.inputs[1],
                                            num_heads=op.get_attr("num_heads")), None]

    @tf.RegisterGradient("BertMergeHeadsPacked")
    def _merge_heads_packed_grad(op, dx):
        *heads, index = op.inputs
        return [*lib.bert_split_heads_packed(dx, index, N=len(heads),
                                             num_heads=op.get_attr("num_heads")), None]

    @tf.RegisterGradient("BertPackRows")
    def _pack_rows_grad(op, dy):
        return [lib.bert_unpack_rows(dy, op.inputs[1], tf.shape(op.inputs[0])[0]), None]

    @tf.RegisterGradient("BertUnpackRows")
    def _unpack_rows_grad(op, dx):
        return [lib.bert_pack_rows(dx, op.inputs[1]), None, None]

    @tf.RegisterGradient("BertSparseSoftmaxXent")
    def _xent_grad(op, dloss, *_):  # label_is_top, row_max and log_sum have no gradient
        logits, labels = op.inputs
        if dloss is None:
            return [tf.zeros_like(logits), None]
        return [lib.bert_sparse_softmax_xent_grad(
            logits, labels, op.outputs[2], op.outputs[3], dloss), None]
