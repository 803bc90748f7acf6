"""Projecting hidden rows on a tied word-embedding table: `rows @ table^T`, in training and in
a decoding loop.

The masked-LM head, the causal LM and the sequence-to-sequence decoder all end in this
product. Training and whole-sequence calls use `matmul_transposed` (one MatMul with
`transpose_b`). A decoding loop projects a few rows a step on the whole vocabulary, faster
from a copy of the table stored transposed (`decoding_table`, made once per loop, outside
it; the gain, largest for few rows and a large vocabulary, is in benchmarks/README.md).
`project` takes either.
"""

import keras
from keras import ops


def matmul_transposed(a, b):
    """`a @ b^T`. On TensorFlow as one MatMul with `transpose_b`: its gradient for `b` is then
    `dy^T @ a`, already `[vocab, width]`; through a transpose op the table's gradient is a
    `[width, vocab]` product and a transpose of it."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf  # noqa: PLC0415 - the TensorFlow path only

        return tf.linalg.matmul(a, b, transpose_b=True)
    return ops.matmul(a, ops.transpose(b))


def decoding_table(table, dtype):
    """`table` `[vocab, width]` transposed to `[width, vocab]` and cast to `dtype`: the
    `output_table` of `project`, made once before a decoding loop."""
    return ops.transpose(ops.cast(table, dtype))


def project(rows, table, output_table=None):
    """`rows` `[n, width]` times the tied table's transpose: `[n, vocab]` in `rows`' dtype.

    Args:
      rows: `[n, width]`.
      table: the embedding table `[vocab, width]` (cast to `rows`' dtype).
      output_table: optional `decoding_table(table, rows.dtype)`; when given, the product
        reads it instead (the same numbers, for a decoding loop).
    """
    if output_table is not None:
        return ops.matmul(rows, ops.cast(output_table, rows.dtype))
    return matmul_transposed(rows, ops.cast(table, rows.dtype))
