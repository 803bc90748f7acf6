"""ClassificationHead, SpanLabeling and TokenClassification."""

import keras
import numpy as np
import pytest
from layer_testing import assert_layer_contract
from numerics import assert_close

from bert_trainer.heads import ClassificationHead, SpanLabeling, TokenClassification
from bert_trainer.heads.span_labeling import PADDING_LOGIT

RNG = np.random.default_rng(0)
POOLED = RNG.standard_normal((3, 8)).astype("float32")  # (batch, hidden)
SEQUENCE = RNG.standard_normal((2, 5, 8)).astype("float32")  # (batch, seq, hidden)
INPUT_MASK = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype="int32")


def _affine(dense, x):
    return x @ dense.kernel.numpy() + dense.bias.numpy()


@pytest.mark.parametrize("num_classes", [3, 1])  # 1 = regression
def test_classification_head(tmp_path, num_classes):
    head, _ = assert_layer_contract(
        ClassificationHead, dict(num_classes=num_classes, dropout_rate=0.5), POOLED,
        expected_output_shape=(3, num_classes), expected_num_trainable_weights=2, tmp_path=tmp_path)
    # Inference skips dropout: the logits are exactly the dense layer's.
    assert_close(head(POOLED), _affine(head.dense, POOLED))
    # Training applies it: some inputs are dropped.
    assert not np.allclose(head(POOLED, training=True), head(POOLED), atol=1e-6)


def test_token_classification(tmp_path):
    head, _ = assert_layer_contract(
        TokenClassification, dict(num_classes=4, dropout_rate=0.0), SEQUENCE,
        expected_output_shape=(2, 5, 4), expected_num_trainable_weights=2, tmp_path=tmp_path)
    assert_close(head(SEQUENCE), _affine(head.dense, SEQUENCE))


def test_span_labeling(tmp_path):
    head, _ = assert_layer_contract(
        SpanLabeling, {}, SEQUENCE, call_kwargs=dict(input_mask=INPUT_MASK),
        expected_output_shape=[(2, 5), (2, 5)], expected_num_trainable_weights=2, tmp_path=tmp_path)
    start, end = head(SEQUENCE, input_mask=INPUT_MASK)
    raw = _affine(head.dense, SEQUENCE)  # (batch, seq, 2)
    real = INPUT_MASK.astype(bool)
    assert_close(start.numpy()[real], raw[..., 0][real])
    assert_close(end.numpy()[real], raw[..., 1][real])
    assert (start.numpy()[~real] == PADDING_LOGIT).all()
    assert (end.numpy()[~real] == PADDING_LOGIT).all()


def test_padding_can_never_win_even_with_huge_raw_logits():
    head = SpanLabeling()
    head.build(SEQUENCE.shape)
    head.dense.set_weights([np.ones((8, 2), "float32"), np.zeros(2, "float32")])
    sequence = np.ones((2, 5, 8), "float32")
    sequence[1, 3:] = 1e6  # padding positions of example 1 would score 8e6
    start, end = head(sequence, input_mask=INPUT_MASK)
    assert np.argmax(start[1]) < 3 and np.argmax(end[1]) < 3
    probabilities = keras.ops.softmax(start, axis=-1).numpy()
    assert (probabilities[1, 3:] == 0.0).all()


def test_heads_give_float32_logits_under_mixed_bfloat16():
    for head, inputs in ((ClassificationHead(3, dtype="mixed_bfloat16"), POOLED),
                         (TokenClassification(3, dtype="mixed_bfloat16"), SEQUENCE),
                         (SpanLabeling(dtype="mixed_bfloat16"), SEQUENCE)):
        outputs = head(keras.ops.cast(inputs, "bfloat16"))
        for logits in (outputs if isinstance(outputs, tuple) else (outputs,)):
            assert keras.backend.standardize_dtype(logits.dtype) == "float32", head.name


def test_bad_num_classes_is_named():
    with pytest.raises(ValueError, match="num_classes must be a positive int, got 0"):
        ClassificationHead(0)
    with pytest.raises(ValueError, match="num_classes must be a positive int"):
        TokenClassification(-2)
