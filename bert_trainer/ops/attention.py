"""Attention's probabilities and heads' layout, and token packing's row copies: each the fused
kernel or TensorFlow's ops (`switch`)."""

from keras import ops

from bert_trainer.ops.switch import fused


def attention_probabilities(scores, bias, dropout, training):
    """`dropout(softmax(scores + bias))` over the last axis: one kernel (the add, the softmax
    and the dropout, with `dropout`'s rate, seed and mask), or TensorFlow's three ops.

    Args:
      scores: `[batch, heads, queries, keys]`.
      bias: None, or additive `[batch or 1, queries or 1, keys]` in the scores' dtype,
        broadcast over the heads (a mask's `0` / large negative values).
      dropout: the `bert_trainer.layers.Dropout` of the probabilities.
      training: whether dropout applies.

    Returns:
      `[batch, heads, queries, keys]`.
    """
    rate_and_seed = _dropout_rate_and_seed(dropout, training) if fused(scores.dtype) else None
    if rate_and_seed is not None:
        from bert_trainer import kernels  # noqa: PLC0415

        if bias is None:
            bias = ops.zeros((1, 1, ops.shape(scores)[-1]), scores.dtype)
        return kernels.attention_softmax(scores, bias, *rate_and_seed)
    if bias is not None:
        scores = scores + ops.expand_dims(bias, axis=-3)  # broadcast over the heads
    return dropout(ops.softmax(scores, axis=-1), training=training)


def _dropout_rate_and_seed(dropout, training):
    """(rate, seed) for the kernel to apply `dropout` as its own call would on the kernel
    path, drawing the seed that call would: rate 0 and no seed where the call passes its
    input through; None where it would take another path (`noise_shape`, a rate of 1)."""
    if not training or dropout.rate == 0.0:
        return 0.0, None
    if not 0.0 < dropout.rate < 1.0 or dropout.noise_shape is not None:
        return None
    return dropout.rate, dropout.seed_generator.next()


def split_heads(x, num_splits: int, num_heads: int, packing=None) -> list:
    """`[batch, seq, num_splits * num_heads * dim]` -> num_splits x `[batch, heads, seq, dim]`:
    the reshape, transpose and split (and unpack) as one copy, or TensorFlow's ops.

    Args:
      x: the projections side by side; with `packing`, its packed `[tokens, width]` rows.
      num_splits, num_heads: static sizes.
      packing: a `layers.packing.TokenPacking` of `x`, or None.

    Returns:
      num_splits tensors `[batch, heads, seq, dim]` (zeros at the slots `packing` leaves out).
    """
    if fused(x.dtype):
        from bert_trainer import kernels  # noqa: PLC0415

        if packing is not None:
            return kernels.split_heads_packed(x, packing.slot_index, num_splits, num_heads)
        return kernels.split_heads(x, num_splits, num_heads)
    if packing is not None:
        x = packing.unpack(x)  # (batch, seq, n * heads * dim)
    shape = ops.shape(x)
    dim = x.shape[-1] // (num_splits * num_heads)
    x = ops.reshape(x, (shape[0], shape[1], num_splits * num_heads, dim))
    x = ops.transpose(x, (0, 2, 1, 3))  # (batch, n * heads, seq, dim)
    return ops.split(x, num_splits, axis=1) if num_splits > 1 else [x]


def merge_heads(context, packing=None):
    """`[batch, heads, seq, dim]` -> rows `[batch * seq, heads * dim]` (with `packing`: its
    `[tokens, heads * dim]`): the transpose (and pack) as one copy, or TensorFlow's ops.
    The head axis must have a static size."""
    shape = ops.shape(context)  # (batch, heads, seq, dim)
    width = context.shape[1] * context.shape[3]
    if fused(context.dtype):
        from bert_trainer import kernels  # noqa: PLC0415

        if packing is not None:
            return kernels.merge_heads_packed([context], packing.slot_index)
        return ops.reshape(kernels.merge_heads([context]), (-1, width))
    context = ops.transpose(context, (0, 2, 1, 3))  # (batch, seq, heads, dim)
    if packing is not None:
        return packing.pack(ops.reshape(context, (shape[0], shape[2], width)))
    return ops.reshape(context, (-1, width))


def pack_rows(x, rows):
    """`x[rows]`: `[slots, width]` -> `[tokens, width]`; `rows` int32, strictly increasing.
    The kernel is a row copy whose gradient is dense (TensorFlow's gather's is sparse)."""
    if fused(x.dtype):
        from bert_trainer import kernels  # noqa: PLC0415

        return kernels.pack_rows(x, rows)
    return ops.take(x, rows, axis=0)


def unpack_rows(y, rows, slots):
    """`pack_rows`' inverse: `[tokens, width]` -> `[slots, width]`, zeros at the other slots."""
    if fused(y.dtype):
        from bert_trainer import kernels  # noqa: PLC0415

        return kernels.unpack_rows(y, rows, slots)
    return ops.scatter(ops.expand_dims(rows, -1), y, (slots, y.shape[-1]))
