"""bert_trainer.losses against TensorFlow's own softmax cross-entropy and argmax, with
TensorFlow's ops and with the fused CPU kernels (`kernel_mode`)."""

import numpy as np
import pytest
import tensorflow as tf
from numerics import assert_close

from bert_trainer import losses

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("scale", [1.0, 80.0], ids=["moderate", "large_logits"])
def test_cross_entropy_values_and_gradients_match_tensorflows(scale, kernel_mode):
    logits = tf.constant(RNG.standard_normal((3, 4, 50)).astype("float32") * scale)
    labels = tf.constant(RNG.integers(0, 50, (3, 4)).astype("int32"))
    upstream = tf.constant(RNG.standard_normal((3, 4)).astype("float32"))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits)
        ours = losses.sparse_softmax_cross_entropy(labels, logits)
        reference = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        ours_sum, reference_sum = (tf.reduce_sum(x * upstream) for x in (ours, reference))
    assert ours.shape == (3, 4) and np.all(np.isfinite(ours))
    np.testing.assert_allclose(ours, reference, rtol=1e-6, atol=1e-5 * scale)
    grad, reference_grad = tape.gradient(ours_sum, logits), tape.gradient(reference_sum, logits)
    assert_close(grad, reference_grad)
    # The gradient of each row sums to zero (softmax minus one-hot, scaled).
    np.testing.assert_allclose(tf.reduce_sum(grad, -1), 0.0, atol=1e-6)


def test_cross_entropy_in_a_compiled_function_and_with_repeated_labels(kernel_mode):
    logits = tf.constant(RNG.standard_normal((6, 7)).astype("float32"))
    labels = tf.constant([3, 3, 3, 0, 6, 3])
    compiled = tf.function(losses.sparse_softmax_cross_entropy, jit_compile=True)
    assert_close(compiled(labels, logits),
                 tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def test_label_is_top_is_the_argmax_hit_rate(kernel_mode):
    logits = RNG.standard_normal((5, 6, 20)).astype("float32")
    labels = RNG.integers(0, 20, (5, 6)).astype("int32")
    labels[0] = logits[0].argmax(-1)  # some certain hits
    hits = losses.label_is_top(tf.constant(labels), tf.constant(logits))
    expected = (logits.argmax(-1) == labels).astype("float32")
    assert hits.dtype == tf.float32 and hits.shape == (5, 6)
    np.testing.assert_array_equal(hits, expected)
    assert 6 <= expected.sum() < 30  # both outcomes occur


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_smoothed_cross_entropy_is_keras_label_smoothing_values_and_gradients(smoothing,
                                                                              kernel_mode):
    import keras  # noqa: PLC0415

    from bert_trainer.ops import smoothed_cross_entropy  # noqa: PLC0415

    logits = tf.constant(RNG.standard_normal((7, 40)).astype("float32") * 3.0)
    labels = tf.constant(RNG.integers(0, 40, (7,)).astype("int32"))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits)
        ours = smoothed_cross_entropy(labels, logits, smoothing)
        reference = keras.losses.categorical_crossentropy(
            tf.one_hot(labels, 40), logits, from_logits=True, label_smoothing=smoothing)
        ours_sum, reference_sum = tf.reduce_sum(ours), tf.reduce_sum(reference)
    assert ours.shape == (7,)
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-5)
    assert_close(tape.gradient(ours_sum, logits), tape.gradient(reference_sum, logits))
