"""BertEncoder, AlbertEncoder, build_encoder and the configs/encoders/*.gin sizes."""

import numpy as np
import pytest
import tensorflow as tf
from layer_testing import assert_layer_contract
from numerics import assert_close

from bert_trainer import config_files, configurables, features
from bert_trainer.encoders import AlbertEncoder, BertEncoder, build_encoder
from bert_trainer.errors import UserError

CONFIGS = config_files.CONFIGS_DIR / "encoders"
TINY = dict(vocab_size=40, hidden_size=16, num_layers=2, num_attention_heads=2, inner_dim=32,
            max_sequence_length=12, type_vocab_size=2)
NO_DROPOUT = dict(output_dropout=0.0, attention_dropout=0.0)


def _inputs(seq=8, batch=2, seed=0, real_lengths=(8, 5)):
    rng = np.random.default_rng(seed)
    mask = np.array([[1] * n + [0] * (seq - n) for n in real_lengths], "int32")
    return {features.INPUT_WORD_IDS: rng.integers(1, 40, (batch, seq)).astype("int32") * mask,
            features.INPUT_MASK: mask,
            features.INPUT_TYPE_IDS: (np.arange(seq)[None] >= 3).astype("int32") * mask}


def _as_list(inputs):
    return [inputs[key] for key in features.ENCODER_INPUTS]


def _expected_shapes(num_layers, seq=8, hidden=16):
    return {features.SEQUENCE_OUTPUT: (2, seq, hidden), features.POOLED_OUTPUT: (2, hidden),
            features.ENCODER_OUTPUTS: [(2, seq, hidden)] * num_layers}


def test_bert_encoder_layer_checks(tmp_path):
    # 3 tables + embedding LayerNorm 2 + 2 layers x 16 + pooler 2.
    encoder, outputs = assert_layer_contract(
        BertEncoder, TINY, _as_list(_inputs()), expected_output_shape=_expected_shapes(2),
        expected_num_trainable_weights=39, tmp_path=tmp_path, atol=1e-5)
    # The same tensor: the sequence output is the last layer's output.
    np.testing.assert_array_equal(outputs[features.ENCODER_OUTPUTS][-1],
                                  outputs[features.SEQUENCE_OUTPUT])
    assert encoder.get_embedding_table() is encoder.word_embeddings.embeddings
    assert encoder.embedding_projection is None


def test_albert_encoder_layer_checks_and_sharing(tmp_path):
    args = dict(TINY, embedding_width=8, num_layers=3)
    # 3 tables + LayerNorm 2 + projection 2 + ONE shared layer 16 + pooler 2.
    encoder, _ = assert_layer_contract(
        AlbertEncoder, args, _as_list(_inputs()), expected_output_shape=_expected_shapes(3),
        expected_num_trainable_weights=25, tmp_path=tmp_path, atol=1e-5)
    assert encoder.transformer_layers[0] is encoder.transformer_layers[2]
    assert encoder.embedding_projection.kernel.shape == (8, 16)
    deeper = AlbertEncoder(**dict(args, num_layers=12))
    assert deeper.count_params() == encoder.count_params()


@pytest.mark.parametrize("name, expected", [("tiny", 4_385_920), ("base", 109_482_240),
                                            ("large", 335_141_888), ("albert_base", 11_683_584)])
@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_gin_sizes_have_the_published_parameter_counts(name, expected):
    # Zero initialization only saves the random draws (seconds for 335M values).
    encoder = configurables.encoder_from_gin(
        CONFIGS / f"{name}.gin", bindings=["build_encoder.initializer = 'zeros'"])
    assert encoder.count_params() == expected


@pytest.mark.parametrize("name, layers, hidden",
                         [("mini", 4, 256), ("small", 4, 512), ("medium", 8, 512)])
def test_gin_sizes_table(name, layers, hidden):
    encoder = configurables.encoder_from_gin(
        CONFIGS / f"{name}.gin",
        bindings=["build_encoder.vocab_size = 10", "build_encoder.initializer = 'zeros'"])
    assert (encoder.num_layers, encoder.hidden_size, encoder.num_attention_heads,
            encoder.inner_dim) == (layers, hidden, hidden // 64, 4 * hidden)


def test_padding_invariance():
    encoder = BertEncoder(**TINY, **NO_DROPOUT)
    short = _inputs(seq=8)
    long = _inputs(seq=12)  # same real tokens, four more padding positions
    for key in features.ENCODER_INPUTS:
        long[key][:, :8] = short[key]
    long[features.INPUT_WORD_IDS][1, 5:] = 39  # junk ids (and types) at padded positions
    long[features.INPUT_TYPE_IDS][1, 5:] = 1
    a, b = encoder(short), encoder(long)
    for row, length in enumerate((8, 5)):
        np.testing.assert_allclose(b[features.SEQUENCE_OUTPUT][row, :length],
                                   a[features.SEQUENCE_OUTPUT][row, :length], atol=1e-5)
    np.testing.assert_allclose(b[features.POOLED_OUTPUT], a[features.POOLED_OUTPUT], atol=1e-5)


def test_output_range_one_equals_position_zero_with_copied_weights():
    full = BertEncoder(**TINY, **NO_DROPOUT)
    ranged = BertEncoder(**TINY, **NO_DROPOUT, output_range=1)
    ranged.set_weights(full.get_weights())
    a, b = full(_inputs()), ranged(_inputs())
    assert b[features.SEQUENCE_OUTPUT].shape == (2, 1, 16)
    np.testing.assert_allclose(b[features.SEQUENCE_OUTPUT], a[features.SEQUENCE_OUTPUT][:, :1],
                               atol=1e-5)
    np.testing.assert_allclose(b[features.POOLED_OUTPUT], a[features.POOLED_OUTPUT], atol=1e-5)


@pytest.mark.parametrize("cls", [BertEncoder, AlbertEncoder])
def test_call_at_positions_gives_the_full_calls_rows_and_pooled_output(cls):
    encoder = cls(**TINY, **NO_DROPOUT)
    inputs = _inputs()
    positions = np.array([[7, 1, 1], [4, 2, 0]], "int32")
    full = encoder(inputs)
    rows = encoder.call_at_positions(_as_list(inputs), positions)
    assert set(rows) == {features.SEQUENCE_OUTPUT, features.POOLED_OUTPUT}
    assert rows[features.SEQUENCE_OUTPUT].shape == (2, 3, 16)
    np.testing.assert_allclose(
        rows[features.SEQUENCE_OUTPUT],
        np.take_along_axis(np.asarray(full[features.SEQUENCE_OUTPUT]), positions[..., None], 1),
        atol=1e-5)
    np.testing.assert_allclose(rows[features.POOLED_OUTPUT], full[features.POOLED_OUTPUT],
                               atol=1e-5)
    # Dropout reaches this path too: two training calls differ, inference calls do not.
    dropped = cls(**TINY)
    a, b = (dropped.call_at_positions(inputs, positions, training=True) for _ in range(2))
    assert not np.allclose(a[features.SEQUENCE_OUTPUT], b[features.SEQUENCE_OUTPUT])
    with pytest.raises(ValueError, match="call_at_positions needs output_range=None"):
        BertEncoder(**TINY, output_range=1).call_at_positions(inputs, positions)


def test_dict_and_list_inputs_agree_and_extra_keys_are_ignored():
    encoder = BertEncoder(**TINY)
    inputs = _inputs()
    listed = encoder(_as_list(inputs))[features.SEQUENCE_OUTPUT]
    with_labels = dict(inputs, label_ids=np.zeros(2, "int32"))
    assert_close(encoder(with_labels)[features.SEQUENCE_OUTPUT], listed)


def test_factorized_and_sinusoidal_variants():
    factorized = BertEncoder(**TINY, embedding_width=8)
    assert factorized.get_embedding_table().shape == (40, 8)
    assert factorized.embedding_projection.kernel.shape == (8, 16)
    sinusoidal = BertEncoder(**TINY, position_embedding_type="sinusoidal")
    learned = BertEncoder(**TINY)
    assert learned.count_params() - sinusoidal.count_params() == 12 * 16  # no position table
    long_inputs = _inputs(seq=30, real_lengths=(30, 5))  # beyond max_sequence_length=12
    assert sinusoidal(long_inputs)[features.SEQUENCE_OUTPUT].shape == (2, 30, 16)


def test_bad_arguments_name_the_argument():
    with pytest.raises(UserError, match="hidden_size=30 is not divisible by num_attention_heads=4"):
        BertEncoder(**dict(TINY, hidden_size=30, num_attention_heads=4))
    with pytest.raises(UserError, match="position_embedding_type='rotary'"):
        BertEncoder(**TINY, position_embedding_type="rotary")
    with pytest.raises(UserError, match="output_range=1 is not supported"):
        AlbertEncoder(**TINY, output_range=1)
    encoder = BertEncoder(**TINY)
    inputs = _inputs()
    with pytest.raises(ValueError, match="input_word_ids must be an integer tensor, got float32"):
        encoder(dict(inputs, input_word_ids=inputs[features.INPUT_WORD_IDS].astype("float32")))
    with pytest.raises(ValueError, match=r"input_mask must be \[batch, seq\], got rank 3"):
        encoder(dict(inputs, input_mask=inputs[features.INPUT_MASK][:, :, None]))
    with pytest.raises(ValueError, match="sequence length 13, longer than max_sequence_length=12"):
        encoder(_inputs(seq=13, real_lengths=(13, 5)))
    with pytest.raises(ValueError, match=r"lacks \['input_type_ids'\]"):
        encoder({key: inputs[key] for key in features.ENCODER_INPUTS[:2]})


def test_build_encoder_errors_name_the_problem(tmp_path):
    with pytest.raises(UserError, match="kind='gpt' is unknown"):
        build_encoder(kind="gpt", vocab_size=10)
    with pytest.raises(UserError, match="takes no argument 'hiden_size'"):
        build_encoder(vocab_size=10, hiden_size=16)
    with pytest.raises(UserError, match="missing.gin does not exist"):
        configurables.encoder_from_gin(tmp_path / "missing.gin")
    assert isinstance(build_encoder(kind="albert", **TINY), AlbertEncoder)


def test_mixed_bfloat16_encoder(bfloat16_required):
    encoder = BertEncoder(**TINY, dtype="mixed_bfloat16")
    assert encoder.get_config()["dtype"]["config"]["name"] == "mixed_bfloat16"
    outputs = encoder(_inputs())
    assert outputs[features.SEQUENCE_OUTPUT].dtype == tf.bfloat16
    assert outputs[features.POOLED_OUTPUT].dtype == tf.bfloat16
    assert {w.dtype for w in encoder.weights} == {"float32"}  # variables stay float32
    float32 = BertEncoder(**TINY)
    float32.set_weights(encoder.get_weights())
    np.testing.assert_allclose(tf.cast(outputs[features.POOLED_OUTPUT], tf.float32),
                               float32(_inputs())[features.POOLED_OUTPUT], atol=0.05)


def test_albert_checkpoint_round_trip(tmp_path):
    encoder = AlbertEncoder(**dict(TINY, embedding_width=8))
    path = tf.train.Checkpoint(model=encoder).save(str(tmp_path / "ckpt"))
    restored = AlbertEncoder(**dict(TINY, embedding_width=8))
    tf.train.Checkpoint(model=restored).restore(path).assert_consumed()
    for a, b in zip(restored.weights, encoder.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)  # the saved bytes
    assert_close(restored(_inputs())[features.SEQUENCE_OUTPUT],
                 encoder(_inputs())[features.SEQUENCE_OUTPUT])


def _load_hf_bert(encoder, weights, heads):
    """Hugging Face BertModel weights ([out, in] Linear) onto BertEncoder's attributes."""
    hidden = encoder.hidden_size
    per_head = (heads, hidden // heads)
    encoder.word_embeddings.embeddings.assign(weights["embeddings.word_embeddings.weight"])
    encoder.position_embedding.embeddings.assign(weights["embeddings.position_embeddings.weight"])
    encoder.type_embeddings.embeddings.assign(weights["embeddings.token_type_embeddings.weight"])
    encoder.embeddings_layer_norm.set_weights(
        [weights["embeddings.LayerNorm.weight"], weights["embeddings.LayerNorm.bias"]])
    for i, layer in enumerate(encoder.transformer_layers):
        w = {k.removeprefix(f"encoder.layer.{i}."): v for k, v in weights.items()}
        att = layer.attention_layer
        for name in ("query", "key", "value"):
            getattr(att, f"{name}_dense").set_weights(
                [w[f"attention.self.{name}.weight"].T.reshape(hidden, *per_head),
                 w[f"attention.self.{name}.bias"].reshape(per_head)])
        att.output_dense.set_weights(
            [w["attention.output.dense.weight"].T.reshape(*per_head, hidden),
             w["attention.output.dense.bias"]])
        layer.attention_layer_norm.set_weights(
            [w["attention.output.LayerNorm.weight"], w["attention.output.LayerNorm.bias"]])
        layer.intermediate_dense.set_weights(
            [w["intermediate.dense.weight"].T, w["intermediate.dense.bias"]])
        layer.output_dense.set_weights([w["output.dense.weight"].T, w["output.dense.bias"]])
        layer.output_layer_norm.set_weights(
            [w["output.LayerNorm.weight"], w["output.LayerNorm.bias"]])
    encoder.pooler_transform.set_weights(
        [weights["pooler.dense.weight"].T, weights["pooler.dense.bias"]])


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_matches_hugging_face_bert_on_real_minilm_weights(minilm_dir, shared_dir):
    """The architecture (post-norm order, exact GELU, pooler, epsilon) equals HF BertModel."""
    from safetensors.numpy import load_file

    golden = np.load(shared_dir / "fixtures" / "minilm" / "golden.npz")
    encoder = BertEncoder(vocab_size=30522, hidden_size=384, num_layers=6, num_attention_heads=12,
                          inner_dim=1536, type_vocab_size=2, **NO_DROPOUT)
    _load_hf_bert(encoder, load_file(minilm_dir / "model.safetensors"), heads=12)
    outputs = encoder({key: golden[key] for key in features.ENCODER_INPUTS})
    real = golden[features.INPUT_MASK].astype(bool)
    for i, hidden in enumerate(outputs[features.ENCODER_OUTPUTS]):
        np.testing.assert_allclose(np.asarray(hidden)[real], golden["hidden_states"][i + 1][real],
                                   atol=1e-4)
    np.testing.assert_allclose(outputs[features.POOLED_OUTPUT], golden["pooled_output"], atol=1e-4)


@pytest.mark.parametrize("cls", [BertEncoder, AlbertEncoder])
def test_unknown_keyword_arguments_are_refused(cls):
    # A functional keras.Model drops unknown keywords silently: the encoder must not.
    with pytest.raises(TypeError, match=rf"^{cls.__name__}\(\) got an unexpected keyword "
                                        r"argument 'intermedate_size'$"):
        cls(**TINY, intermedate_size=64)
    with pytest.raises(TypeError, match=r"argument 'inner_dims' \(did you mean 'inner_dim'\?\)"):
        cls(**TINY, inner_dims=64)
    encoder = cls(**TINY, name="enc", trainable=False)  # keras.Model's own arguments pass
    assert encoder.name == "enc" and not encoder.trainable
    assert cls.from_config(encoder.get_config()).get_config() == encoder.get_config()
