"""The pretraining task: losses by hand, a real tiny run, exact resume, warm start, precision."""

import dataclasses
import logging

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import PRETRAIN_PREDICTIONS, PRETRAIN_SEQ_LENGTH
from numerics import assert_close
from summary_testing import read_scalars

from bert_trainer import features as F
from bert_trainer import ops
from bert_trainer.checkpoints import model_dir
from bert_trainer.encoders import build_encoder
from bert_trainer.errors import UserError
from bert_trainer.features import MLM_LOGITS, MLM_ROW_LOGITS, MLM_ROWS, NEXT_SENTENCE_LOGITS
from bert_trainer.tasks.masked_lm.task import PretrainingConfig, PretrainingTask
from bert_trainer.training import optimization
from bert_trainer.training.optimization import OptimizerConfig
from bert_trainer.training.trainer import Trainer, TrainerConfig

STEPS = 30
OPTIMIZER = OptimizerConfig(learning_rate=3e-3, warmup_steps=3)
RUN = dict(train_steps=STEPS, steps_per_loop=10, summary_interval=10, checkpoint_interval=10)


def tiny_encoder(vocab_size, **kwargs):
    kwargs = dict(hidden_size=32, num_layers=2, num_attention_heads=2, inner_dim=64,
                  max_sequence_length=PRETRAIN_SEQ_LENGTH, **kwargs)
    return lambda: build_encoder("bert", vocab_size=vocab_size, **kwargs)


def make_task(data, **config):
    config = PretrainingConfig(**{
        "train_data": data["train"], "eval_data": data["eval"], "vocab_file": data["vocab_file"],
        "seq_length": PRETRAIN_SEQ_LENGTH, "max_predictions_per_seq": PRETRAIN_PREDICTIONS,
        "train_batch_size": 16, "eval_batch_size": 32, "shuffle_buffer": 200, **config})
    return PretrainingTask(config, tiny_encoder(data["vocab_size"]))


def make_trainer(data, directory, **config):
    return Trainer(make_task(data), str(directory), config=TrainerConfig(**{**RUN, **config}),
                   optimizer=OPTIMIZER)


def weights(model):
    return [v.numpy() for v in model.trainable_variables]


@pytest.fixture(scope="module")
def straight_run(pretraining_data, tmp_path_factory):
    """An uninterrupted 30-step run, evaluated before and after training."""
    directory = tmp_path_factory.mktemp("straight")
    keras.utils.set_random_seed(1234)
    trainer = make_trainer(pretraining_data, directory)
    before = trainer.evaluate()
    result = trainer.train_and_evaluate()
    return {"dir": directory, "trainer": trainer, "before": before, "result": result}


def test_losses_and_metrics_follow_the_per_example_formulas():
    task = PretrainingTask(PretrainingConfig(masking="static"), encoder_fn=None)
    vocab = 5
    logits = np.random.default_rng(0).normal(size=(2, 3, vocab)).astype(np.float32)
    ids = np.array([[1, 2, 3], [4, 0, 0]], np.int32)
    weights_ = np.array([[1, 1, 0], [0, 0, 0]], np.float32)  # example 2: nothing masked
    logits[0, 0, 1] = logits[0, 1, 0] = logits[0, 2, 3] = 10.0  # right, wrong, right-but-unweighted
    logits[0, 1, 2] = -10.0
    nsp_logits = np.array([[2.0, -1.0], [0.5, 0.5]], np.float32)
    nsp_labels = np.array([0, 1], np.int32)
    features = {F.MASKED_LM_IDS: ids, F.MASKED_LM_WEIGHTS: weights_,
                F.NEXT_SENTENCE_LABELS: nsp_labels}
    outputs = {MLM_LOGITS: logits, NEXT_SENTENCE_LOGITS: nsp_logits}

    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    xent = -np.take_along_axis(log_probs, ids[..., None], -1)[..., 0]
    nsp_log_probs = nsp_logits - np.log(np.exp(nsp_logits).sum(-1, keepdims=True))
    expected_nsp = -nsp_log_probs[[0, 1], nsp_labels]
    losses = {k: np.asarray(v) for k, v in task.build_losses(features, outputs).items()}
    assert set(losses) == set(task.loss_names) == {"loss", "mlm_loss", "nsp_loss"}
    np.testing.assert_allclose(losses["mlm_loss"], [(xent[0, 0] + xent[0, 1]) / 2, 0.0],
                               rtol=1e-5)
    np.testing.assert_allclose(losses["nsp_loss"], expected_nsp, rtol=1e-5)
    np.testing.assert_allclose(losses["loss"], losses["mlm_loss"] + expected_nsp, rtol=1e-5)

    metrics = task.build_metrics(training=True)
    task.update_metrics(metrics, features, outputs)
    assert [m.name for m in metrics] == ["mlm_accuracy", "nsp_accuracy"]
    assert float(metrics[0].result()) == pytest.approx(0.5)  # 1 of the 2 weighted positions
    assert float(metrics[1].result()) == pytest.approx(0.5)  # a tie predicts class 0

    mlm_only = PretrainingTask(PretrainingConfig(masking="static", use_next_sentence_label=False),
                               encoder_fn=None)
    losses = mlm_only.build_losses(features, {MLM_LOGITS: logits})
    assert mlm_only.loss_names == ("loss", "mlm_loss") and set(losses) == {"loss", "mlm_loss"}
    np.testing.assert_array_equal(losses["loss"], losses["mlm_loss"])  # the same tensor


@pytest.mark.parametrize("sparse_last_layer", [True, False])
def test_training_computes_only_the_weighted_predictions_with_the_same_loss(monkeypatch,
                                                                          sparse_last_layer):
    """In training the pretrainer runs its masked LM on the weighted predictions only (rounded
    up to 16 rows); losses, accuracy and gradients are those of every slot. Evaluation (and a
    pretrainer asked not to) computes every slot."""
    monkeypatch.setattr(ops.switch, "_accelerators_visible", lambda: False)  # as on a CPU host
    batch, seq, predictions, vocab = 8, 16, 5, 50
    task = PretrainingTask(PretrainingConfig(masking="static", seq_length=seq,
                                             max_predictions_per_seq=predictions),
                           tiny_encoder(vocab, output_dropout=0.0, attention_dropout=0.0))
    model = task.build_model()
    execution = dataclasses.replace(model.execution, sparse_last_layer=sparse_last_layer)
    rng = np.random.default_rng(0)
    weights_ = np.zeros((batch, predictions), np.float32)
    weights_[:, :2] = 1.0  # 16 weighted of 40 slots ...
    weights_[3, 4] = 1.0  # ... and one more: 17, rounded up to 32 rows
    features = {
        F.INPUT_WORD_IDS: rng.integers(1, vocab, (batch, seq), dtype=np.int32),
        F.INPUT_MASK: np.ones((batch, seq), np.int32),
        F.INPUT_TYPE_IDS: np.zeros((batch, seq), np.int32),
        F.MASKED_LM_POSITIONS: rng.integers(1, seq, (batch, predictions), dtype=np.int32),
        F.MASKED_LM_IDS: rng.integers(1, vocab, (batch, predictions), dtype=np.int32),
        F.MASKED_LM_WEIGHTS: weights_,
        F.NEXT_SENTENCE_LABELS: rng.integers(0, 2, batch, dtype=np.int32)}
    features = {k: tf.constant(v) for k, v in features.items()}

    def run(skip):
        model.execution = dataclasses.replace(execution, skip_unweighted_predictions=skip)
        with tf.GradientTape() as tape:
            outputs = model(task.model_inputs(features), training=True)
            losses = task.build_losses(features, outputs)
            total = tf.reduce_mean(losses["loss"])
        metrics = task.build_metrics(training=True)
        task.update_metrics(metrics, features, outputs)
        grads = tape.gradient(total, model.trainable_variables)
        return outputs, losses, float(metrics[0].result()), grads

    rows_out, rows_losses, rows_accuracy, rows_grads = run(True)
    assert MLM_LOGITS not in rows_out
    rows = rows_out[MLM_ROWS].numpy()
    assert rows_out[MLM_ROW_LOGITS].shape == (32, vocab)
    flat = weights_.reshape(-1)
    # The 17 weighted slots first, in order, then the first 15 unweighted ones.
    assert rows[:17].tolist() == np.flatnonzero(flat).tolist()
    assert rows[17:].tolist() == np.flatnonzero(flat == 0)[:15].tolist()
    all_out, all_losses, all_accuracy, all_grads = run(False)
    assert all_out[MLM_LOGITS].shape == (batch, predictions, vocab)
    np.testing.assert_allclose(rows_out[MLM_ROW_LOGITS].numpy(),
                               all_out[MLM_LOGITS].numpy().reshape(-1, vocab)[rows], atol=1e-5)
    for name in ("loss", "mlm_loss", "nsp_loss"):
        np.testing.assert_allclose(rows_losses[name], all_losses[name], rtol=1e-5)
    assert rows_accuracy == pytest.approx(all_accuracy)
    for a, b in zip(rows_grads, all_grads, strict=True):
        assert_close(tf.convert_to_tensor(a), tf.convert_to_tensor(b))
    model.execution = execution  # the task's: skips them in training ...
    assert model.skips_unweighted_predictions()
    assert MLM_LOGITS in model(task.model_inputs(features), training=False)  # ... not in eval


def test_weighted_rows_gradient_copies_no_vocabulary_sized_slice(monkeypatch):
    """The row logits reach the loss through reshapes: a slice there (`logits[0]`) would add a
    gradient that zero-fills and copies the whole `[1, rows, vocab]` logits every step."""
    monkeypatch.setattr(ops.switch, "_accelerators_visible", lambda: False)  # as on a CPU host
    batch, seq, predictions, vocab = 4, 16, 4, 97
    task = PretrainingTask(PretrainingConfig(masking="static", seq_length=seq,
                                             max_predictions_per_seq=predictions),
                           tiny_encoder(vocab))
    model = task.build_model()
    ids = tf.ones((batch, seq), tf.int32)
    features = {F.INPUT_WORD_IDS: ids, F.INPUT_MASK: ids, F.INPUT_TYPE_IDS: ids * 0,
                F.MASKED_LM_POSITIONS: tf.ones((batch, predictions), tf.int32),
                F.MASKED_LM_IDS: tf.ones((batch, predictions), tf.int32),
                F.MASKED_LM_WEIGHTS: tf.ones((batch, predictions)),
                F.NEXT_SENTENCE_LABELS: tf.zeros((batch,), tf.int32)}

    @tf.function
    def grads():
        with tf.GradientTape() as tape:
            outputs = model(task.model_inputs(features), training=True)
            loss = tf.reduce_mean(task.build_losses(features, outputs)["loss"])
        return tape.gradient(loss, model.trainable_variables)

    graph = grads.get_concrete_function().graph
    assert MLM_ROW_LOGITS in model(task.model_inputs(features), training=True)
    slice_grads = [op for op in graph.get_operations() if op.type == "StridedSliceGrad"]
    vocabulary_sized = [op.name for op in slice_grads if op.outputs[0].shape[-1] == vocab]
    assert vocabulary_sized == []


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
def test_tiny_run_lowers_the_loss_and_logs_every_scalar(straight_run):
    result, before = straight_run["result"], straight_run["before"]
    assert result.step == STEPS
    train = read_scalars(straight_run["dir"] / "train")
    # MLM over an 800-token vocabulary starts at ~ln(800) = 6.7 and NSP at ln(2).
    assert train["mlm_loss"][10] > 5.5
    assert train["loss"][STEPS] < train["loss"][10] - 0.7
    assert result.eval["mlm_loss"] < before["mlm_loss"] - 0.7
    assert result.eval["mlm_accuracy"] > before["mlm_accuracy"] + 0.03
    for name in ("loss", "learning_rate", "grad_norm", "examples_per_second", "tokens_per_second",
                 "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"):
        assert set(train[name]) == {10, 20, 30}, name
    # Pretraining examples are mostly full: many tokens per example, at most 64.
    ratio = train["tokens_per_second"][STEPS] / train["examples_per_second"][STEPS]
    assert 30 < ratio <= PRETRAIN_SEQ_LENGTH
    evals = read_scalars(straight_run["dir"] / "eval")
    assert {"loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"} <= set(evals)
    assert result.eval["loss"] == pytest.approx(result.eval["mlm_loss"] + result.eval["nsp_loss"],
                                                rel=1e-5)


class _Killed(Exception):
    pass


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
def test_killed_run_resumes_at_the_saved_step_with_the_same_weights(straight_run,
                                                                    pretraining_data, tmp_path):
    keras.utils.set_random_seed(1234)
    first = make_trainer(pretraining_data, tmp_path, eval_steps=0)  # evaluation changes nothing
    save = first._save

    def save_then_die(step):  # the process dies right after the checkpoint at step 10
        path = save(step)
        if step == 10:
            raise _Killed
        return path

    first._save = save_then_die
    with pytest.raises(_Killed):
        first.train_and_evaluate()
    assert int(first.global_step.numpy()) == 10
    keras.backend.clear_session()

    keras.utils.set_random_seed(99)  # a restart does not depend on the global seed state
    resumed = make_trainer(pretraining_data, tmp_path, eval_steps=0)
    assert int(resumed.global_step.numpy()) == 10
    assert int(resumed.optimizer.iterations.numpy()) == 10
    resumed.train_and_evaluate()
    straight = weights(straight_run["trainer"].model)
    difference = max(float(np.abs(a - b).max())
                     for a, b in zip(straight, weights(resumed.model), strict=True))
    assert difference < 1e-5


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_warm_start_loads_the_encoder_and_reports_what_it_left(straight_run, pretraining_data,
                                                               tmp_path, caplog):
    trained = straight_run["trainer"].model
    prefix = model_dir.write_pretrained(str(tmp_path), encoder=trained.encoder,
                                        vocab_file=pretraining_data["vocab_file"])
    task = make_task(pretraining_data)
    model = task.build_model()
    fresh_head = model.masked_lm.dense.kernel.numpy()
    # Listen on absl's logger itself: once an in-process CLI run has set absl logging up in
    # this worker, its records no longer propagate to the root logger caplog listens on.
    absl_logger = logging.getLogger("absl")
    absl_logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="absl"):
            task.initialize(model, prefix)
    finally:
        absl_logger.removeHandler(caplog.handler)
    for got, want in zip(weights(model.encoder), weights(trained.encoder), strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(model.masked_lm.dense.kernel.numpy(), fresh_head)
    encoder_ids = {id(v) for v in model.encoder.weights}
    left = [v for v in model.masked_lm.weights + model.next_sentence.weights
            if id(v) not in encoder_ids]
    message = next(r.getMessage() for r in caplog.records if "Warm start" in r.getMessage())
    assert f"left {len(left)} initialized" in message
    assert model.next_sentence.dense.kernel.path in message


def test_model_info_records_the_encoder_and_copies_the_vocab(straight_run, pretraining_data):
    info = model_dir.read_model_info(str(straight_run["dir"]))
    encoder = straight_run["trainer"].model.encoder
    assert info.encoder_config["hidden_size"] == 32
    assert info.encoder_config["vocab_size"] == pretraining_data["vocab_size"]
    assert model_dir.build_encoder(info).count_params() == encoder.count_params()
    with open(info.vocab_file) as copy, open(pretraining_data["vocab_file"]) as original:
        assert copy.read() == original.read()
    assert info.task["name"] == "pretraining" and info.task["seq_length"] == PRETRAIN_SEQ_LENGTH


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_mixed_precision_keeps_the_logits_float32(pretraining_data, bfloat16_required):
    task = make_task(pretraining_data)
    with optimization.precision_policy("bfloat16"):
        model = task.build_model()
    batch = next(iter(task.build_inputs("eval", None, is_training=False)))
    outputs = model(task.model_inputs(batch), training=False)
    assert outputs[MLM_LOGITS].dtype == "float32"
    assert outputs[NEXT_SENTENCE_LOGITS].dtype == "float32"
    assert model.encoder.layers[-1].compute_dtype == "bfloat16"
    assert tuple(outputs[MLM_LOGITS].shape) == (32, PRETRAIN_PREDICTIONS,
                                                pretraining_data["vocab_size"])
    losses = task.build_losses(batch, outputs)
    assert np.isfinite(np.asarray(losses["loss"])).all()
    # By default the vocabulary projection runs in bfloat16 too; the option reads float32.
    assert model.masked_lm.projection_in_compute_dtype
    exact_task = make_task(pretraining_data, mlm_projection_in_compute_dtype=False)
    with optimization.precision_policy("bfloat16"):
        exact = exact_task.build_model()
    exact.set_weights(model.get_weights())
    exact_logits = exact(task.model_inputs(batch), training=False)[MLM_LOGITS]
    difference = np.abs(np.asarray(exact_logits) - np.asarray(outputs[MLM_LOGITS]))
    # The same model up to bfloat16 rounding of the table and the product (8-bit mantissa).
    assert 0 < difference.max() < 0.05 * max(1.0, float(np.abs(exact_logits).max()))


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_static_masked_data_trains_masked_lm_only(pretraining_data, tmp_path):
    config = PretrainingConfig(
        train_data=pretraining_data["static_train"], vocab_file=None, masking="static",
        use_next_sentence_label=False, seq_length=PRETRAIN_SEQ_LENGTH,
        max_predictions_per_seq=PRETRAIN_PREDICTIONS, train_batch_size=8, shuffle_buffer=100)
    task = PretrainingTask(config, tiny_encoder(pretraining_data["vocab_size"]))
    trainer = Trainer(task, str(tmp_path), optimizer=OPTIMIZER,
                      config=TrainerConfig(train_steps=4, steps_per_loop=4, eval_steps=0))
    result = trainer.train_and_evaluate()
    assert trainer.model.next_sentence is None
    assert {"loss", "mlm_loss", "mlm_accuracy"} <= set(result.train)
    assert "nsp_loss" not in result.train and "nsp_accuracy" not in result.train
    assert result.train["loss"] == pytest.approx(result.train["mlm_loss"])
    assert model_dir.read_model_info(str(tmp_path)).vocab_file is None


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_input_pipelines_read_disjoint_shards_in_per_replica_batches(pretraining_data):
    task = make_task(pretraining_data)

    def ids(dataset):  # the unmasked examples: masks differ between pipelines
        rows = []
        for batch in dataset:
            batch = {k: v.numpy() for k, v in batch.items()}
            original = batch[F.INPUT_WORD_IDS].copy()
            rows_, cols = np.nonzero(batch[F.MASKED_LM_WEIGHTS])
            original[rows_, batch[F.MASKED_LM_POSITIONS][rows_, cols]] = (
                batch[F.MASKED_LM_IDS][rows_, cols])
            rows += [row.tobytes() for row in original]
        return set(rows), len(rows)

    everything, total = ids(task.build_inputs("eval", None, is_training=False))
    shards = []
    for pipeline in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline,
                                             num_replicas_in_sync=4)
        dataset = task.build_inputs("eval", context, is_training=False)
        assert next(iter(dataset))[F.INPUT_WORD_IDS].shape[0] == 8  # eval batch 32, 4 replicas
        shards.append(ids(dataset))
    assert shards[0][1] + shards[1][1] == total > 0
    assert not shards[0][0] & shards[1][0] and shards[0][0] | shards[1][0] == everything


def test_bad_settings_are_user_errors(pretraining_data):
    with pytest.raises(UserError, match="vocab_file is not set; pass --vocab_file"):
        PretrainingConfig(train_data="x")
    with pytest.raises(UserError, match="masked_lm_prob=1.5 must be in"):
        PretrainingConfig(masking="static", masked_lm_prob=1.5)
    with pytest.raises(UserError, match="masking='sometimes' is unknown"):
        PretrainingConfig(masking="sometimes", vocab_file="v")
    size = pretraining_data["vocab_size"]
    task = make_task(pretraining_data)
    task.encoder_fn = tiny_encoder(size + 1)
    with pytest.raises(UserError, match=f"has {size} tokens but the encoder's vocab_size is "
                                        f"{size + 1}; set build_encoder.vocab_size = {size}"):
        task.build_model()
    task = make_task(pretraining_data, seq_length=128)
    with pytest.raises(UserError, match="seq_length=128 exceeds the encoder's "
                                        "max_sequence_length=64"):
        task.build_model()
    task = make_task(pretraining_data, eval_data=None)
    with pytest.raises(UserError, match="eval_data is not set; pass --eval_data=GLOB"):
        task.build_inputs("eval", None, is_training=False)
