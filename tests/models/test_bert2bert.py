"""BERT2BERT warm start: both halves of a Seq2SeqTransformer from one BERT checkpoint."""

import keras
import numpy as np
import pytest
from finetune_testing import assert_encoder_equals, write_tiny_google, write_tiny_hf

from bert_trainer import features
from bert_trainer.interop.bert2bert import warm_start_seq2seq
from bert_trainer.interop.resolve import resolve_checkpoint
from bert_trainer.models import Seq2SeqTransformer


def _model(checkpoint, **kwargs):
    keras.utils.set_random_seed(3)
    return Seq2SeqTransformer(checkpoint.build_encoder(), **kwargs)


def _block_pairs(model, i):
    """(decoder variable, encoder variable) of decoder block i and encoder layer i."""
    block, layer = model.decoder_layers[i], model.encoder.transformer_layers[i]
    pairs = []
    for ours, theirs in ((block.self_attention, layer.attention_layer),
                         (block.self_attention_layer_norm, layer.attention_layer_norm),
                         (block.intermediate_dense, layer.intermediate_dense),
                         (block.output_dense, layer.output_dense),
                         (block.output_layer_norm, layer.output_layer_norm)):
        pairs += list(zip(ours.weights, theirs.weights, strict=True))
    return pairs


def _inputs(vocab_size, seed=0):
    rng = np.random.default_rng(seed)
    return {features.INPUT_WORD_IDS: rng.integers(5, vocab_size, (2, 9)).astype("int32"),
            features.INPUT_MASK: np.array([[1] * 9, [1] * 5 + [0] * 4], "int32"),
            features.INPUT_TYPE_IDS: np.zeros((2, 9), "int32"),
            features.DECODER_INPUT_IDS: rng.integers(5, vocab_size, (2, 6)).astype("int32")}


def test_bert_train_checkpoint_fills_both_halves(tiny_pretrained):
    checkpoint = resolve_checkpoint(tiny_pretrained["dir"])
    model = _model(checkpoint)
    cross = model.decoder_layers[0].cross_attention
    cross_before = [np.array(v.numpy()) for v in cross.weights]
    result = warm_start_seq2seq(model, checkpoint)

    assert_encoder_equals(model.encoder, tiny_pretrained["encoder_weights"])
    for ours, theirs in _block_pairs(model, 0):
        assert ours is not theirs
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=ours.path)
    for variable, before in zip(cross.weights, cross_before, strict=True):
        np.testing.assert_array_equal(variable.numpy(), before)  # fresh: untouched
    encoder = model.encoder
    expected = (np.asarray(encoder.position_embedding.embeddings)
                + np.asarray(encoder.type_embeddings.embeddings)[0])
    np.testing.assert_allclose(model.target_position_embedding.embeddings.numpy(), expected,
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(model.target_embeddings_layer_norm.gamma.numpy(),
                                  encoder.embeddings_layer_norm.gamma.numpy())

    loaded, initialized = set(result["loaded"]), set(result["initialized"])
    assert not loaded & initialized
    assert loaded | initialized == {v.path for v in model.weights}
    assert {v.path for v in cross.weights} <= initialized
    assert model.output_bias.path in initialized
    assert {ours.path for ours, _ in _block_pairs(model, 0)} <= loaded
    assert model.target_position_embedding.embeddings.path in loaded
    assert {v.path for v in encoder.transformer_layers[0].weights} <= loaded


def test_bertshare_shares_the_blocks(tiny_pretrained):
    checkpoint = resolve_checkpoint(tiny_pretrained["dir"])
    model = _model(checkpoint, share_encoder_decoder=True)
    result = warm_start_seq2seq(model, checkpoint, share=True)
    for ours, theirs in _block_pairs(model, 0):
        assert ours is theirs
    assert_encoder_equals(model.encoder, tiny_pretrained["encoder_weights"])
    assert {v.path for v in model.decoder_layers[0].cross_attention.weights} <= set(
        result["initialized"])
    with pytest.raises(ValueError, match="share_encoder_decoder=False"):
        warm_start_seq2seq(_model(checkpoint), checkpoint, share=True)


@pytest.mark.parametrize("kind", ["hf", "tf1"])
def test_reference_formats_warm_start_the_same_model(tiny_pretrained, tmp_path, kind):
    hf_dir = write_tiny_hf(tiny_pretrained, tmp_path / "hf")
    path = hf_dir if kind == "hf" else write_tiny_google(hf_dir, tmp_path / "google")
    ours = _model(resolve_checkpoint(tiny_pretrained["dir"]))
    warm_start_seq2seq(ours, resolve_checkpoint(tiny_pretrained["dir"]))
    checkpoint = resolve_checkpoint(path)
    theirs = _model(checkpoint)
    result = warm_start_seq2seq(theirs, path)  # a path is resolved
    assert_encoder_equals(theirs.encoder, tiny_pretrained["encoder_weights"])
    for a, b in zip(_block_pairs(ours, 0), _block_pairs(theirs, 0), strict=True):
        np.testing.assert_allclose(a[0].numpy(), b[0].numpy(), rtol=1e-6, atol=1e-7)
    assert theirs.decoder_layers[0].self_attention.query_dense.kernel.path in result["loaded"]


def test_more_decoder_layers_than_bert_is_a_user_error(tiny_pretrained):
    from bert_trainer.errors import UserError  # noqa: PLC0415

    checkpoint = resolve_checkpoint(tiny_pretrained["dir"])
    model = _model(checkpoint, num_decoder_layers=2)
    with pytest.raises(UserError, match="num_decoder_layers <= 1"):
        warm_start_seq2seq(model, checkpoint)


def test_real_minilm_weights_in_both_halves(minilm_dir):
    checkpoint = resolve_checkpoint(str(minilm_dir))
    reference = checkpoint.read_reference().weights
    model = _model(checkpoint, max_target_length=64)
    result = warm_start_seq2seq(model, checkpoint)
    hidden, heads = 384, model.encoder.num_attention_heads
    # Named weights, read straight from the safetensors file (Google layout).
    value = reference["bert/encoder/layer_3/attention/self/value/kernel"]
    decoder_value = model.decoder_layers[3].self_attention.value_dense.kernel.numpy()
    np.testing.assert_array_equal(decoder_value, value.reshape(hidden, heads, hidden // heads))
    np.testing.assert_array_equal(model.decoder_layers[5].output_dense.kernel.numpy(),
                                  reference["bert/encoder/layer_5/output/dense/kernel"])
    np.testing.assert_array_equal(
        model.encoder.transformer_layers[5].output_dense.kernel.numpy(),
        reference["bert/encoder/layer_5/output/dense/kernel"])
    positions = (reference["bert/embeddings/position_embeddings"][:64]
                 + reference["bert/embeddings/token_type_embeddings"][0])
    np.testing.assert_allclose(model.target_position_embedding.embeddings.numpy(), positions,
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(model.target_embeddings.embeddings.numpy(),
                                  reference["bert/embeddings/word_embeddings"])
    initialized = set(result["initialized"])
    assert all("cross_attention" in p or p == model.output_bias.path
               or "pooler" in p for p in initialized), sorted(initialized)
    assert len([p for p in initialized if "cross_attention" in p]) == 6 * 10
    logits = model(_inputs(model.vocab_size))[features.LOGITS]
    assert logits.shape == (2, 6, model.vocab_size) and np.isfinite(logits.numpy()).all()
