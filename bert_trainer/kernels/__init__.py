"""Fused CPU kernels for the training step, with TensorFlow's own ops as the fallback.

Without XLA, every elementwise op of a TensorFlow step is a separate pass over memory, and
the pip wheel compiles those ops for a baseline x86 CPU. `cpu_kernels.cc` holds one-pass
kernels for the work of a BERT step that `tf.matmul` does not cover: dropout (with a mask
recomputed from its seed instead of stored), LayerNorm, exact GELU, the attention
probabilities (mask, softmax and dropout), the attention heads' layout (split / merge), token
packing (the rows of the real tokens, packed and unpacked) and the masked LM's softmax
cross-entropy, each forward and backward;
and the optimizer's AdamW update (clip scale, weight decay and Adam in one pass).
They are compiled on first use for the machine's own CPU (`build.py`) and used where they can
run:

- `BERT_TRAIN_FUSED_KERNELS=auto` (the default): when the library builds, no GPU or TPU is
  visible, and the code is not being compiled by XLA (`jit_compile=True` or a TPU); else
  TensorFlow's ops, the same computation, are used.
- `off`: never.
- `on`: as `auto`, but a library that cannot be built is an error instead of a warning.

Graphs that are saved for serving are traced inside `disabled()` (the exporter does), so a
SavedModel holds only TensorFlow's own ops and needs no extra library to load.
"""

import contextlib
import os
import threading

from absl import logging

MODE_ENV = "BERT_TRAIN_FUSED_KERNELS"
MODES = ("auto", "on", "off")
# What the elementwise and layout kernels (dropout, GELU, the attention probabilities, the
# heads' layout, token packing) take; LayerNorm and the cross-entropy are float32 (their
# layers compute in float32 under mixed precision).
ELEMENTWISE_DTYPES = ("float32", "bfloat16", "float16")

_state = threading.local()
_lock = threading.Lock()
_library = None
_error: str | None = None


def mode() -> str:
    value = os.environ.get(MODE_ENV, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"{MODE_ENV}={value!r}: expected one of {', '.join(MODES)}")
    return value


@contextlib.contextmanager
def disabled():
    """Within this block (this thread), `active()` is False: TensorFlow's own ops only."""
    depth = getattr(_state, "disabled", 0)
    _state.disabled = depth + 1
    try:
        yield
    finally:
        _state.disabled = depth


def library():
    """The loaded op library, building it on first call; None if it cannot be built."""
    global _library, _error
    with _lock:
        if _library is None and _error is None:
            from bert_trainer.kernels import build  # noqa: PLC0415 - imports TensorFlow

            try:
                lib = build.load()
                _register_gradients(lib)
                _library = lib
                logging.info("Fused CPU kernels loaded from %s", build.library_path())
            except build.BuildError as e:
                _error = str(e)
                if mode() != "on":
                    logging.warning("Fused CPU kernels unavailable, using TensorFlow's ops: "
                                    "%s", _error)
        if _library is None and mode() == "on":
            raise RuntimeError(f"{MODE_ENV}=on but the fused CPU kernels are unavailable: "
                               f"{_error}")
        return _library


def active(dtype=None) -> bool:
    """Whether ops created here, now, should be the fused kernels (Keras on TensorFlow only).

    Args:
      dtype: if given, also require it to be one of `ELEMENTWISE_DTYPES`.
    """
    if getattr(_state, "disabled", 0) or mode() == "off" or _keras_backend() != "tensorflow":
        return False
    if dtype is not None and _dtype_name(dtype) not in ELEMENTWISE_DTYPES:
        return False
    if _under_xla() or _accelerators_visible():
        return False
    return library() is not None


def dynamic_shapes_are_free() -> bool:
    """Whether ops created here, now, run on the CPU outside XLA, where a tensor's shape may
    change from step to step at no cost (on a GPU a data-dependent shape costs a host sync;
    XLA and TPUs need static shapes)."""
    return not _under_xla() and not _accelerators_visible()


def _keras_backend() -> str:
    import keras  # noqa: PLC0415

    return keras.backend.backend()


def _dtype_name(dtype) -> str:
    import tensorflow as tf  # noqa: PLC0415

    return tf.as_dtype(dtype).name


def _under_xla() -> bool:
    """True while tracing for XLA (`jit_compile=True`, TPU): custom ops cannot compile there.

    A decision at trace time: a plain `tf.function` traced outside XLA and later called from
    a `jit_compile=True` one would keep its trace. The trainer traces its XLA step afresh
    inside the compiled function (`TrainStep`), so its layers see the XLA context.
    """
    import tensorflow as tf  # noqa: PLC0415

    try:
        from tensorflow.python.ops import control_flow_util  # noqa: PLC0415
    except ImportError:  # private API gone: do not guess
        return True
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def _accelerators_visible() -> bool:
    import tensorflow as tf  # noqa: PLC0415

    return bool(tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))


# ------------------------------------------------------------------------------- the ops
# Each wrapper emits its op; call it only when `active()`. Gradients are registered by op
# name, so they apply wherever the op appears in a graph.


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
