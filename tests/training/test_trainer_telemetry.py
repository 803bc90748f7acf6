"""What a pretraining run shows in TensorBoard (rates, padding, FLOPs, MFU) and bfloat16."""

import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO
from summary_testing import read_scalars

from bert_trainer import features as F
from bert_trainer import ops
from bert_trainer.encoders import build_encoder
from bert_trainer.errors import UserError
from bert_trainer.models import bert_pretrainer
from bert_trainer.tasks.masked_lm.task import PretrainingConfig, PretrainingTask
from bert_trainer.training import optimization, throughput
from bert_trainer.training.trainer import Trainer, TrainerConfig

sys.path.insert(0, str(REPO / "scripts"))
from bench import spec as spec_lib  # noqa: E402

SIZE = spec_lib.ModelSize("test", num_layers=1, hidden_size=32, num_attention_heads=2,
                          inner_dim=64, vocab_size=200)
STEP = spec_lib.StepSpec(SIZE, batch_size=8, seq_length=16, max_predictions=4)
BATCHES = spec_lib.make_batches(STEP, 4, seed=3)  # step t trains on BATCHES[(t - 1) % 4]
for _i, _batch in enumerate(BATCHES):  # row i of batch i ends after 6 + i tokens
    _batch[F.INPUT_MASK][_i, 6 + _i:] = 0
    _batch[F.INPUT_WORD_IDS][_i, 6 + _i:] = 0


def make_trainer(model_dir, **config):
    task = PretrainingTask(
        PretrainingConfig(masking="static", seq_length=STEP.seq_length,
                          max_predictions_per_seq=STEP.max_predictions,
                          train_batch_size=STEP.batch_size),
        lambda: build_encoder("bert", vocab_size=SIZE.vocab_size, hidden_size=SIZE.hidden_size,
                              num_layers=SIZE.num_layers, inner_dim=SIZE.inner_dim,
                              num_attention_heads=SIZE.num_attention_heads,
                              max_sequence_length=STEP.seq_length))
    stacked = {k: np.stack([b[k] for b in BATCHES]) for k in BATCHES[0]}
    task.build_inputs = lambda split, ctx, *, is_training: (
        tf.data.Dataset.from_tensor_slices(stacked).repeat())
    config = TrainerConfig(**{"train_steps": 4, "steps_per_loop": 2, "summary_interval": 2,
                              "eval_steps": 0, **config})
    return Trainer(task, str(model_dir), config=config, optimizer=optimization.OptimizerConfig())


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_tensorboard_gets_padding_fraction_model_flops_and_mfu(tmp_path, monkeypatch):
    monkeypatch.setattr(ops.switch, "_accelerators_visible", lambda: False)  # as on a CPU host
    trainer = make_trainer(tmp_path, peak_flops=2e9)
    trainer.train_and_evaluate()
    train = read_scalars(tmp_path / "train")
    assert train["peak_gflops"] == {0: pytest.approx(2.0)}
    # The pretrainer computes its last layer at [CLS] and the masked positions only, its
    # masked LM at the weighted predictions (rounded up to 16 rows: here 16 of 32 slots) and
    # its layers on the real tokens only (packed).
    rows = 1 + STEP.max_predictions

    def computed_rows(batch):
        return bert_pretrainer.computed_prediction_rows(
            np.count_nonzero(batch[F.MASKED_LM_WEIGHTS]), STEP.batch_size * STEP.max_predictions)

    def computed_tokens(batch):  # the real tokens, and [CLS] and masked positions past them
        kept = batch[F.INPUT_MASK] != 0
        kept[:, 0] = True
        np.put_along_axis(kept, batch[F.MASKED_LM_POSITIONS], True, axis=1)
        return np.count_nonzero(kept)

    assert [computed_rows(b) for b in BATCHES] == [16] * 4
    assert any(computed_tokens(b) > np.count_nonzero(b[F.INPUT_MASK]) for b in BATCHES)
    for step, used in ((2, BATCHES[:2]), (4, BATCHES[2:])):
        flops_per_example = np.mean([spec_lib.train_flops(
            STEP, last_layer_rows=rows, mlm_rows=computed_rows(b),
            tokens=computed_tokens(b)) for b in used]) / len(used[0][F.INPUT_MASK])
        masks = np.stack([b[F.INPUT_MASK] for b in used])
        assert train["padding_fraction"][step] == pytest.approx(1 - masks.mean(), rel=1e-6)
        assert 0.05 < train["padding_fraction"][step] < 0.5
        examples_per_s = train["examples_per_second"][step]
        assert train["tokens_per_second"][step] == pytest.approx(
            examples_per_s * masks.sum() / (2 * STEP.batch_size), rel=1e-5)
        # Rates share one interval time: their ratios are the counted FLOPs per example.
        gflops = train["model_gflops_per_second"][step]
        assert gflops * 1e9 / examples_per_s == pytest.approx(flops_per_example, rel=1e-5)
        assert train["mfu"][step] == pytest.approx(gflops / 2.0, rel=1e-5)


def test_peak_is_measured_when_not_configured_and_scaled_by_replicas(monkeypatch):
    strategy = tf.distribute.get_strategy()
    replicas = strategy.num_replicas_in_sync
    monkeypatch.setenv(throughput.PEAK_ENV, "3e12")
    assert throughput.peak_flops(strategy, 5e12, None) == 5e12 * replicas  # the config first
    assert throughput.peak_flops(strategy, None, None) == 3e12 * replicas  # then the variable
    for bad in ("fast", "0", "-1e12", "inf", "nan"):
        monkeypatch.setenv(throughput.PEAK_ENV, bad)
        with pytest.raises(UserError, match=rf"^BERT_TRAIN_PEAK_FLOPS='{bad}' must be a number "
                                            r"> 0: one device's peak FLOP/s .* e\.g\. 1e12"):
            throughput.peak_flops(strategy, None, None)
    monkeypatch.setenv(throughput.PEAK_ENV, " ")  # blank: as if unset
    measured = throughput.peak_flops(strategy, None, None)
    assert 1e8 < measured < 1e13  # a CPU matmul, not the configured number


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_train_results_is_the_running_mean_since_the_last_summary(tmp_path):
    trainer = make_trainer(tmp_path)
    trainer.run_steps(trainer.train_iterator(), 2)
    results = trainer.train_results()
    assert {"loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "grad_norm"} <= set(results)
    assert results["loss"] == pytest.approx(results["mlm_loss"] + results["nsp_loss"], rel=1e-5)
    assert results["loss"] == pytest.approx(np.log(SIZE.vocab_size) + np.log(2), rel=0.1)


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
def test_mixed_bfloat16_reaches_the_encoder_and_changes_the_losses(tmp_path, bfloat16_required):
    losses, models = {}, {}
    for precision in (None, "bfloat16"):
        trainer = make_trainer(tmp_path / str(precision), mixed_precision=precision)
        trainer.run_steps(trainer.train_iterator(), 2)
        losses[precision], models[precision] = trainer.train_results()["loss"], trainer.model
    bf16 = models["bfloat16"]
    assert keras.config.dtype_policy().name == "float32"  # restored after building
    # The MLM transform too; MaskedLM computes its vocabulary logits in float32 on purpose.
    layers = [bf16.encoder.get_layer("transformer_layer_0"), bf16.masked_lm.dense]
    assert [layer.compute_dtype for layer in layers] == ["bfloat16", "bfloat16"]
    assert {w.dtype for w in bf16.weights} == {"float32"}  # float32 master weights
    inputs = {k: BATCHES[0][k] for k in F.ENCODER_INPUTS}
    assert bf16.encoder(inputs)[F.SEQUENCE_OUTPUT].dtype == "bfloat16"
    assert models[None].encoder(inputs)[F.SEQUENCE_OUTPUT].dtype == "float32"
    # Same seed, data and weights at the start: only the arithmetic differs.
    assert losses["bfloat16"] != losses[None]
    assert losses["bfloat16"] == pytest.approx(losses[None], rel=0.02)
