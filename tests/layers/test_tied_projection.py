"""layers.tied_projection: the tied output product, with and without the decoding table."""

import numpy as np
import pytest
import tensorflow as tf

from bert_trainer.layers import tied_projection


def _rows_and_table(seed=0, rows=5, width=8, vocab=13):
    rng = np.random.default_rng(seed)
    return (tf.constant(rng.normal(size=(rows, width)), tf.float32),
            tf.Variable(rng.normal(size=(vocab, width)), dtype=tf.float32))


def test_project_with_and_without_the_decoding_table_equals_numpy():
    rows, table = _rows_and_table()
    expected = rows.numpy() @ table.numpy().T
    output_table = tied_projection.decoding_table(table, "float32")
    assert output_table.shape == (8, 13)
    for got in (tied_projection.project(rows, table),
                tied_projection.project(rows, table, output_table)):
        assert got.shape == (5, 13)
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_the_table_gradient_needs_no_transpose():
    rows, table = _rows_and_table(1)

    @tf.function
    def gradient(rows):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tied_projection.project(rows, table) ** 2)
        return tape.gradient(loss, table)

    grad = gradient(rows)
    logits = rows.numpy() @ table.numpy().T
    np.testing.assert_allclose(grad.numpy(), 2 * logits.T @ rows.numpy(), rtol=1e-4, atol=1e-4)
    # transpose_b: the product and both gradients are MatMuls, none of them a Transpose op.
    ops = {op.type for op in gradient.get_concrete_function(rows).graph.get_operations()}
    assert "MatMul" in ops and "Transpose" not in ops


@pytest.mark.parametrize("with_table", [False, True])
def test_the_product_computes_in_the_rows_dtype(with_table, bfloat16_required):
    rows, table = _rows_and_table(2)
    rows = tf.cast(rows, tf.bfloat16)
    output_table = tied_projection.decoding_table(table, "bfloat16") if with_table else None
    got = tied_projection.project(rows, table, output_table)
    assert got.dtype == tf.bfloat16
    expected = rows.numpy().astype(np.float32) @ table.numpy().T
    # bfloat16 keeps 8 significant bits: the inputs and the result are each rounded.
    np.testing.assert_allclose(got.numpy().astype(np.float32), expected, rtol=0.05, atol=0.1)
