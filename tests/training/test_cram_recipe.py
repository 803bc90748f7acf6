"""configs/cram.gin's switches, each alone: pre-norm BertEncoder (and its refusal by the
Hugging Face / Google formats), the one-cycle schedule and warmup fraction, fine-tuning's
encoder dropout, and the config file itself."""

import keras
import numpy as np
import pytest
from numerics import assert_close

from bert_trainer import configurables
from bert_trainer import features as F
from bert_trainer.encoders import AlbertEncoder, BertEncoder, build_encoder
from bert_trainer.errors import UserError
from bert_trainer.interop import pretrained
from bert_trainer.tasks import finetuning, registry
from bert_trainer.training import optimization
from bert_trainer.training.optimization import OptimizerConfig, WarmupPolynomialDecay

VOCAB = 40
SIZES = dict(hidden_size=16, num_layers=2, num_attention_heads=2, inner_dim=32,
             max_sequence_length=12, output_dropout=0.0, attention_dropout=0.0)


def inputs(batch=3, seq=10, real=(10, 6, 3), seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, VOCAB, size=(batch, seq)).astype("int32")
    mask = (np.arange(seq)[None, :] < np.array(real)[:, None]).astype("int32")
    return {F.INPUT_WORD_IDS: ids * mask, F.INPUT_MASK: mask,
            F.INPUT_TYPE_IDS: np.zeros_like(ids)}


# ---------------------------------------------------------------- pre-norm encoder


def test_norm_first_builds_pre_norm_layers_and_a_final_layer_norm():
    keras.utils.set_random_seed(1)
    encoder = BertEncoder(VOCAB, norm_first=True, **SIZES)
    assert all(layer.norm_first for layer in encoder.transformer_layers)
    assert encoder.final_layer_norm is not None
    post = BertEncoder(VOCAB, **SIZES)
    assert post.final_layer_norm is None and not post.transformer_layers[0].norm_first
    # One LayerNorm more (gamma + beta), nothing else.
    assert len(encoder.weights) == len(post.weights) + 2
    out = encoder(inputs(), training=False)[F.SEQUENCE_OUTPUT].numpy()  # (batch, seq, hidden)
    # The final LayerNorm (gamma 1, beta 0 at init) leaves each real token's row at mean 0 and
    # variance 1; a pre-norm residual stream without it is not normalized.
    real = inputs()[F.INPUT_MASK].astype(bool)
    assert_close(out[real].mean(-1), np.zeros(real.sum()), atol=1e-5, rtol=0)
    assert_close(out[real].var(-1), np.ones(real.sum()), atol=1e-3, rtol=0)
    encoder.final_layer_norm.gamma.assign(2 * np.ones(16, "float32"))
    doubled = encoder(inputs(), training=False)[F.SEQUENCE_OUTPUT].numpy()
    assert_close(doubled[real], 2 * out[real], rtol=1e-5, atol=1e-6)


def test_norm_first_differs_from_post_norm_on_the_same_weights():
    keras.utils.set_random_seed(2)
    # Large weights: at BERT's init (stddev 0.02) the sublayers add little to the residual,
    # and both layouts output about the normalized embeddings.
    wide = keras.initializers.RandomNormal(stddev=0.5)
    pre = BertEncoder(VOCAB, norm_first=True, initializer=wide, **SIZES)
    post = BertEncoder(VOCAB, initializer=wide, **SIZES)
    by_path = {w.path: w for w in pre.weights}
    for w in post.weights:
        w.assign(by_path[w.path])
    a = pre(inputs(), training=False)[F.POOLED_OUTPUT].numpy()
    b = post(inputs(), training=False)[F.POOLED_OUTPUT].numpy()
    assert np.abs(a - b).max() > 1e-2


def test_norm_first_outputs_at_positions_and_packed_equal_the_full_call():
    keras.utils.set_random_seed(3)
    encoder = BertEncoder(VOCAB, norm_first=True, **SIZES)
    x = inputs()
    full = encoder(x, training=False)
    positions = np.array([[1, 4], [0, 5], [2, 2]], "int32")
    at = encoder.call_at_positions(x, positions, training=False)
    expected = np.take_along_axis(full[F.SEQUENCE_OUTPUT].numpy(), positions[..., None], axis=1)
    assert_close(at[F.SEQUENCE_OUTPUT], expected, rtol=1e-5, atol=1e-5)
    assert_close(at[F.POOLED_OUTPUT], full[F.POOLED_OUTPUT], rtol=1e-5, atol=1e-5)
    packed = encoder.call_packed(x, training=False)
    real = x[F.INPUT_MASK].astype(bool)
    assert_close(packed[F.SEQUENCE_OUTPUT].numpy()[real],
                 full[F.SEQUENCE_OUTPUT].numpy()[real], rtol=1e-5, atol=1e-5)
    assert not np.any(packed[F.SEQUENCE_OUTPUT].numpy()[~real])  # the padding stays zero


def test_norm_first_round_trips_through_get_config_and_albert_takes_it():
    keras.utils.set_random_seed(4)
    encoder = build_encoder("bert", vocab_size=VOCAB, norm_first=True, **SIZES)
    config = encoder.get_config()
    assert config["norm_first"] is True
    clone = BertEncoder.from_config(config)
    clone.set_weights(encoder.get_weights())
    assert_close(clone(inputs(), training=False)[F.POOLED_OUTPUT],
                 encoder(inputs(), training=False)[F.POOLED_OUTPUT], rtol=1e-6, atol=1e-6)
    old = {k: v for k, v in config.items() if k != "norm_first"}  # a config from before
    assert BertEncoder.from_config(old).final_layer_norm is None
    albert = AlbertEncoder(VOCAB, embedding_width=8, norm_first=True, **SIZES)
    assert albert.transformer_layers[0].norm_first and albert.final_layer_norm is not None
    with pytest.raises(UserError, match="norm_first must be True or False"):
        BertEncoder(VOCAB, norm_first="yes", **SIZES)


def test_hugging_face_and_google_formats_refuse_a_pre_norm_encoder():
    encoder = BertEncoder(VOCAB, norm_first=True, **SIZES)
    with pytest.raises(UserError, match=r"norm_first=True.*post-norm"):
        pretrained.bert_config(encoder)
    assert pretrained.bert_config(BertEncoder(VOCAB, **SIZES)).num_layers == 2


def test_seq2seq_refuses_a_pre_norm_encoder():
    from bert_trainer.models import Seq2SeqTransformer  # noqa: PLC0415

    with pytest.raises(ValueError, match=r"pre-norm \(norm_first=True\)"):
        Seq2SeqTransformer(BertEncoder(VOCAB, norm_first=True, **SIZES))
    assert Seq2SeqTransformer(BertEncoder(VOCAB, **SIZES)).decoder_layers


# ---------------------------------------------------------------- schedule


@pytest.mark.parametrize("step, one_cycle, bert", [
    (0, 0.0, 0.0), (5, 0.5, 0.5), (10, 1.0, 0.9), (55, 0.5, 0.45), (100, 0.0, 0.0),
    (130, 0.0, 0.0)])
def test_one_cycle_decays_from_the_peak(step, one_cycle, bert):
    kwargs = dict(initial_learning_rate=1.0, decay_steps=100, warmup_steps=10)
    assert float(WarmupPolynomialDecay(**kwargs, decay_from_warmup=True)(step)) == \
        pytest.approx(one_cycle, abs=1e-6)
    assert float(WarmupPolynomialDecay(**kwargs)(step)) == pytest.approx(bert, abs=1e-6)


def test_config_schedule_and_warmup_fraction():
    config = OptimizerConfig(learning_rate=1.0, schedule="one_cycle", warmup_fraction=0.25,
                             warmup_steps=3)
    schedule = optimization.build_schedule(config, train_steps=40)
    assert schedule.warmup_steps == 10 and schedule.decay_from_warmup  # the fraction wins
    assert float(schedule(10)) == pytest.approx(1.0)
    assert float(schedule(25)) == pytest.approx(0.5)
    restored = keras.optimizers.schedules.deserialize(
        keras.optimizers.schedules.serialize(schedule))
    assert restored.get_config() == schedule.get_config()
    assert float(restored(25)) == pytest.approx(0.5)
    default = optimization.build_schedule(OptimizerConfig(learning_rate=1.0, warmup_steps=3),
                                          train_steps=40)
    assert default.warmup_steps == 3 and not default.decay_from_warmup


@pytest.mark.parametrize("kwargs, message", [
    (dict(schedule="cosine"), "schedule='cosine' is unknown"),
    (dict(warmup_fraction=1.0), r"warmup_fraction=1.0 must be in \[0, 1\)"),
    (dict(warmup_fraction=-0.1), "warmup_fraction=-0.1"),
])
def test_bad_schedule_settings(kwargs, message):
    with pytest.raises(UserError, match=message):
        OptimizerConfig(**kwargs)


# ---------------------------------------------------------------- fine-tuning dropout


def test_encoder_dropout_overrides_the_checkpoint_config(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"{t}\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                             + [f"w{i}" for i in range(VOCAB - 5)]))
    encoder = BertEncoder(VOCAB, **SIZES)  # pretrained without dropout
    spec = finetuning.spec_from_encoder(encoder, vocab_file=str(vocab))
    task_data = registry.resolve_task_data("sst2")

    def build(**config):
        config = finetuning.FinetuneConfig(seq_length=8, **config)
        return registry.build_task(task_data, spec, config=config)

    task = build(encoder_dropout=0.1)
    assert task.encoder_spec.config["output_dropout"] == 0.1
    assert task.encoder_spec.config["attention_dropout"] == 0.1
    assert task.build_model().encoder.output_dropout == 0.1
    kept = build()
    assert kept.encoder_spec.config["output_dropout"] == 0.0
    with pytest.raises(UserError, match=r"encoder_dropout=1.5 must be in \[0, 1\)"):
        finetuning.FinetuneConfig(encoder_dropout=1.5)


# ---------------------------------------------------------------- the config file


def test_cram_gin_binds_every_switch():
    encoder = configurables.encoder_from_gin("configs/cram.gin",
                                             [f"build_encoder.vocab_size = {VOCAB}"])
    assert encoder.norm_first and encoder.final_layer_norm is not None
    assert encoder.output_dropout == 0.0 and encoder.attention_dropout == 0.0
    assert (encoder.hidden_size, encoder.num_layers) == (256, 4)  # mini.gin's size
    pretraining = configurables.PretrainingConfig(vocab_file="vocab.txt")  # not read here
    assert not pretraining.use_next_sentence_label
    assert pretraining.seq_length == 64  # mini.gin's data shape, unchanged
    optimizer = configurables.OptimizerConfig()
    assert optimizer.schedule == "one_cycle" and optimizer.warmup_fraction == 0.25
    assert optimizer.learning_rate == 1e-3 and optimizer.clip_norm == 0.5
