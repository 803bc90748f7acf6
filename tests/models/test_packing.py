"""Token packing: the encoder on the real tokens only (`TokenPacking`, the packing kernels,
`BertEncoder.call_at_positions(pack=True)`), checked against the padded computation."""

import numpy as np
import pytest
import tensorflow as tf

from bert_trainer import features, kernels, ops
from bert_trainer.encoders import AlbertEncoder, BertEncoder
from bert_trainer.layers.packing import TokenPacking

RNG = np.random.default_rng(0)
KEEP = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 0, 1]], bool)  # 10 of 15 slots
TINY = dict(vocab_size=40, hidden_size=16, num_layers=3, num_attention_heads=2, inner_dim=32,
            max_sequence_length=16, output_dropout=0.0, attention_dropout=0.0)


@pytest.fixture(autouse=True)
def _cpu_host(monkeypatch):
    # Packing (and the kernels) run where shapes may vary for free: the CPU outside XLA.
    monkeypatch.setattr(ops.switch, "_accelerators_visible", lambda: False)


def _packed_reference(x):
    """numpy: `[batch, seq, width]` -> the rows of KEEP's slots, in order."""
    return x.reshape(-1, x.shape[-1])[KEEP.reshape(-1)]


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_pack_and_unpack_rows_are_each_others_gradient(dtype, kernels_required):
    rows = tf.constant(np.flatnonzero(KEEP), tf.int32)
    x = tf.cast(RNG.standard_normal((15, 6)), dtype)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        packed = kernels.pack_rows(x, rows)
        unpacked = kernels.unpack_rows(packed, rows, 15)
    np.testing.assert_array_equal(packed.numpy(), x.numpy()[np.flatnonzero(KEEP)])
    want = np.where(KEEP.reshape(-1, 1), x.numpy(), 0)
    np.testing.assert_array_equal(unpacked.numpy(), want)
    # d(pack)/dx scatters ones to the kept rows; unpack's gradient gathers them back.
    kept = np.broadcast_to(KEEP.reshape(-1, 1), (15, 6))
    np.testing.assert_array_equal(tape.gradient(packed, x).numpy(), kept)
    np.testing.assert_array_equal(tape.gradient(unpacked, x).numpy(), kept)
    with pytest.raises(tf.errors.InvalidArgumentError, match="rows must be increasing slots"):
        kernels.pack_rows(x, tf.constant([3, 1], tf.int32))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"in \[0, 15\), got 15"):
        kernels.unpack_rows(packed[:1], tf.constant([15], tf.int32), 15)
    with pytest.raises(tf.errors.InvalidArgumentError, match="slots must be >= 0, got -3"):
        kernels.unpack_rows(packed[:0], rows[:0], -3)


def test_packed_head_split_and_merge_are_the_padded_ones_at_the_kept_slots(kernels_required):
    packing = TokenPacking(tf.constant(KEEP))
    x = tf.constant(RNG.standard_normal((3, 5, 2 * 2 * 4)), tf.float32)  # n=2, heads=2, dim=4
    packed = _packed_reference(x.numpy())
    with tf.GradientTape() as tape:
        source = tf.constant(packed)
        tape.watch(source)
        q, k = kernels.split_heads_packed(source, packing.slot_index, 2, 2)
        loss = tf.reduce_sum(q * q) + 3.0 * tf.reduce_sum(k)
    want_q, want_k = kernels.split_heads(x * KEEP[..., None], 2, 2)  # zeros at the padding
    np.testing.assert_array_equal(q.numpy(), want_q.numpy())
    np.testing.assert_array_equal(k.numpy(), want_k.numpy())
    merged = kernels.merge_heads_packed([q, k], packing.slot_index)
    np.testing.assert_array_equal(merged.numpy(), packed)
    grad = tape.gradient(loss, source).numpy()  # 2q on the first half, 3 on the second
    np.testing.assert_allclose(grad[:, :8], 2 * packed[:, :8], rtol=1e-6)
    np.testing.assert_array_equal(grad[:, 8:], 3.0)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="index keeps 10 slots but x has 8 rows"):
        kernels.split_heads_packed(source[:8], packing.slot_index, 2, 2)
    bad = tf.constant([[0, 2, -1, -1, -1]] * 3, tf.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="must number the kept slots"):
        kernels.merge_heads_packed([q], bad)


def test_token_packing_with_and_without_the_kernels(kernel_mode):
    packing = TokenPacking(tf.constant(KEEP))
    x = RNG.standard_normal((3, 5, 6)).astype("float32")
    packed = packing.pack(tf.constant(x))
    np.testing.assert_array_equal(packed.numpy(), _packed_reference(x))
    np.testing.assert_array_equal(packing.unpack(packed).numpy(), x * KEEP[..., None])
    positions = tf.constant([[0, 2], [4, 1], [1, 4]])
    np.testing.assert_array_equal(packing.gather(packed, positions).numpy(),
                                  np.take_along_axis(x, positions.numpy()[..., None], 1))
    np.testing.assert_array_equal(packing.slot_index.numpy(),
                                  np.where(KEEP, np.cumsum(KEEP.reshape(-1)).reshape(3, 5) - 1,
                                           -1))


def _encoder_inputs():
    # Row 3 has no real token: its [CLS] attends to every slot, so packing keeps them all.
    mask = np.array([[1] * 12 + [0] * 4, [1] * 16, [1] * 5 + [0] * 11, [0] * 16], "int32")
    ids = RNG.integers(1, 40, mask.shape).astype("int32") * mask
    return {features.INPUT_WORD_IDS: ids, features.INPUT_MASK: mask,
            features.INPUT_TYPE_IDS: (np.arange(16)[None] >= 4).astype("int32") * mask}


@pytest.mark.parametrize("cls", [BertEncoder, AlbertEncoder])
def test_packed_encoder_equals_the_padded_one_with_its_gradients(cls, kernel_mode):
    encoder = cls(**TINY)
    inputs = _encoder_inputs()
    # Row 2 asks for slot 9, past its 5 real tokens: packing computes it too.
    positions = tf.constant([[3, 11, 0], [15, 1, 8], [4, 9, 0], [2, 0, 0]])

    def run(pack):
        with tf.GradientTape() as tape:
            out = encoder.call_at_positions(inputs, positions, training=True, pack=pack)
            loss = (tf.reduce_sum(out[features.SEQUENCE_OUTPUT] ** 2)
                    + tf.reduce_sum(out[features.POOLED_OUTPUT]))
        return out, tape.gradient(loss, encoder.trainable_variables)

    packed, packed_grads = run(True)
    padded, padded_grads = run(False)
    assert int(encoder.packed_tokens(inputs, positions)) == 12 + 16 + 5 + 1 + 16
    assert packed.keys() == padded.keys()
    for key in (features.SEQUENCE_OUTPUT, features.POOLED_OUTPUT):
        np.testing.assert_allclose(packed[key], padded[key], atol=1e-5)
    for got, want in zip(packed_grads, padded_grads, strict=True):
        got, want = tf.convert_to_tensor(got).numpy(), tf.convert_to_tensor(want).numpy()
        np.testing.assert_allclose(got, want, atol=1e-5)
        assert np.abs(want).max() > 0  # every variable gets a gradient


def test_packing_needs_a_padding_mask():
    from bert_trainer.layers import MultiHeadAttention, TransformerEncoder

    layer = TransformerEncoder(num_attention_heads=2, inner_dim=8)
    data = tf.zeros([2, 3, 4])
    layer(data)
    packing = TokenPacking(tf.ones([2, 3], bool))
    with pytest.raises(ValueError, match=r"packed data needs a \[batch, seq\] padding mask"):
        layer(packing.pack(data), attention_mask=tf.ones([2, 3, 3]), packing=packing)
    attention = MultiHeadAttention(num_heads=2, key_dim=2)
    attention(data, data)
    rows = packing.pack(data)
    with pytest.raises(ValueError, match="packed inputs need the padding mask"):
        attention(rows, rows, packing=packing)


def test_call_packed_equals_the_full_call_at_the_real_tokens(kernel_mode):
    encoder = BertEncoder(**TINY)
    inputs = _encoder_inputs()
    real = inputs[features.INPUT_MASK].astype(bool)

    def run(call):
        with tf.GradientTape() as tape:
            out = call(inputs, training=False)
            sequence = tf.where(real[..., None], out[features.SEQUENCE_OUTPUT], 0.0)
            loss = tf.reduce_sum(sequence ** 2) + tf.reduce_sum(out[features.POOLED_OUTPUT])
        return out, sequence, tape.gradient(loss, encoder.trainable_variables)

    packed, packed_real, packed_grads = run(encoder.call_packed)
    full, full_real, full_grads = run(encoder)
    assert packed[features.SEQUENCE_OUTPUT].shape == full[features.SEQUENCE_OUTPUT].shape
    np.testing.assert_allclose(packed_real, full_real, atol=1e-5)
    np.testing.assert_allclose(packed[features.POOLED_OUTPUT], full[features.POOLED_OUTPUT],
                               atol=1e-5)
    # The padding is not computed: zeros there (but in row 3, without real tokens, whose
    # [CLS] attends to every slot).
    padding = ~real & real.any(axis=1, keepdims=True)
    assert padding.sum() == 15 and not np.any(packed[features.SEQUENCE_OUTPUT].numpy()[padding])
    for got, want in zip(packed_grads, full_grads, strict=True):
        np.testing.assert_allclose(tf.convert_to_tensor(got), tf.convert_to_tensor(want),
                                   atol=1e-5)


@pytest.mark.parametrize("head", ["classifier", "tagger", "span_labeler"])
def test_task_models_pack_on_the_cpu_with_the_same_outputs_but_not_for_export(head,
                                                                            kernel_mode):
    """Packing runs with the fused kernels and with TensorFlow's own ops (its gather and
    scatter cost far less than the padding's FLOPs); an export (`ops.portable()`) keeps
    every slot, so a SavedModel has no data-dependent shapes."""
    from bert_trainer.models import BertClassifier, BertSpanLabeler, BertTokenClassifier

    encoder = BertEncoder(**TINY)
    model = {"classifier": lambda: BertClassifier(encoder, num_classes=3),
             "tagger": lambda: BertTokenClassifier(encoder, num_classes=5),
             "span_labeler": lambda: BertSpanLabeler(encoder)}[head]()
    inputs = _encoder_inputs()
    real = inputs[features.INPUT_MASK].astype(bool)
    assert model.packs_tokens()
    assert int(model.packed_tokens(inputs)) == 12 + 16 + 5 + 16  # row 3: every slot
    packed = model(inputs, training=False)
    with ops.portable():
        assert not model.packs_tokens() and model.packed_tokens(inputs) is None
        assert not ops.fused() and not ops.dynamic_shapes_are_free()
        full = model(inputs, training=False)
    assert packed.keys() == full.keys()
    for key, value in packed.items():
        got, want = np.asarray(value), np.asarray(full[key])
        if head == "tagger":  # the padding's logits are read by nobody
            got, want = got[real], want[real]
        np.testing.assert_allclose(got, want, atol=1e-5, err_msg=key)
