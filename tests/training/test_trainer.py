"""The training loop on a tiny toy task: learning, exact resume, NaN stop, summaries, precision."""

import json

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf
from summary_testing import read_scalars
from toy_task import ToyConfig, ToyTask

from bert_trainer.errors import UserError
from bert_trainer.training import optimization
from bert_trainer.training.optimization import OptimizerConfig
from bert_trainer.training.trainer import NonFiniteError, Trainer, TrainerConfig

TOY = ToyConfig()
ADAMW = OptimizerConfig(learning_rate=1e-2, warmup_steps=3, decay_steps=40)


def weights(trainer):
    return [v.numpy() for v in trainer.model.trainable_variables]


def max_difference(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


def make(model_dir, task_config=TOY, optimizer=ADAMW, **config):
    config.setdefault("steps_per_loop", 5)
    config.setdefault("eval_steps", None if "eval_interval" in config else 0)  # evals cost time
    return Trainer(ToyTask(task_config), str(model_dir), config=TrainerConfig(**config),
                   optimizer=optimizer)


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_training_lowers_the_loss_and_evaluates_every_example(tmp_path):
    trainer = make(tmp_path, train_steps=40, summary_interval=10, eval_interval=20)
    before = trainer.evaluate()
    result = trainer.train_and_evaluate()
    assert result.step == 40 and int(trainer.optimizer.iterations.numpy()) == 40
    assert result.eval["loss"] < 0.7 * before["loss"]
    assert result.eval["accuracy"] >= 0.85
    # 40 eval examples in batches of 16: the final partial batch of 8 is evaluated too, and the
    # host-side metric over the gathered predictions agrees with the streaming one.
    assert result.eval["num_examples"] == 40
    assert result.eval["host_accuracy"] == pytest.approx(result.eval["accuracy"], abs=1e-6)
    assert result.eval["ce_loss"] == pytest.approx(result.eval["loss"])
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-40")


def test_evaluation_traces_its_step_once_for_every_batch_of_the_split(tmp_path, monkeypatch):
    """40 eval examples in batches of 16 (16, 16, 8), evaluated twice: one trace, not one per
    new batch shape."""
    from bert_trainer.training import evaluation  # noqa: PLC0415

    traces, body = [], evaluation.Evaluator._step_body

    def counted(self, batch):
        traces.append(batch[next(iter(batch))].shape)
        return body(self, batch)

    monkeypatch.setattr(evaluation.Evaluator, "_step_body", counted)
    trainer = make(tmp_path, train_steps=1)
    first, second = trainer.evaluate(), trainer.evaluate()
    assert first["num_examples"] == 40 and second == pytest.approx(first, rel=1e-6)
    assert len(traces) == 1 and traces[0][0] is None, traces


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
@pytest.mark.parametrize("accumulation_steps", [1, 2])
def test_killed_and_resumed_run_ends_with_the_same_weights(tmp_path, accumulation_steps):
    # Dropout on: the resumed run must also draw the same dropout masks.
    task = ToyConfig(dropout=0.2)
    common = dict(checkpoint_interval=10, accumulation_steps=accumulation_steps)
    straight = make(tmp_path / "straight", task, train_steps=20, **common)
    straight.train_and_evaluate()

    make(tmp_path / "resumed", task, train_steps=10, **common).train_and_evaluate()
    resumed = make(tmp_path / "resumed", task, train_steps=20, **common)
    assert int(resumed.global_step.numpy()) == 10  # picked up automatically
    assert int(resumed.optimizer.iterations.numpy()) == 10  # with the optimizer state
    resumed.train_and_evaluate()
    assert max_difference(weights(straight), weights(resumed)) <= 1e-6


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
def test_resume_does_not_replay_consumed_batches(tmp_path):
    # Control for the test above: without the data position, resuming gives other weights.
    task = ToyConfig()
    straight = make(tmp_path / "a", task, train_steps=20)
    straight.train_and_evaluate()
    make(tmp_path / "b", task, train_steps=10).train_and_evaluate()
    resumed = make(tmp_path / "b", task, train_steps=20)
    # Forget the position:
    resumed._train_dataset = lambda step, inputs=None: Trainer._train_dataset(resumed, 0, inputs)
    resumed.train_and_evaluate()
    assert max_difference(weights(straight), weights(resumed)) > 1e-4


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_nan_stops_the_run_at_its_step_and_keeps_the_last_checkpoint(tmp_path):
    # Batch index 7 holds NaN, so step 8 is the first bad one.
    trainer = make(tmp_path, ToyConfig(poison_batch=7), train_steps=20, checkpoint_interval=5)
    with pytest.raises(NonFiniteError, match=r"NaN/Inf at step 8\b") as caught:
        trainer.train_and_evaluate()
    assert caught.value.step == 8
    assert caught.value.checkpoint.endswith("ckpt-5")
    assert not issubclass(NonFiniteError, UserError)
    # The bad update was refused: 7 steps applied, weights finite.
    assert int(trainer.global_step.numpy()) == 7
    assert int(trainer.optimizer.iterations.numpy()) == 7
    assert all(np.isfinite(w).all() for w in weights(trainer))
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-5")
    restarted = make(tmp_path, ToyConfig(), train_steps=20, checkpoint_interval=5)
    assert int(restarted.global_step.numpy()) == 5


@gin.configurable
def _toy_setting(value=1):
    return value


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_event_files_hold_the_training_and_eval_scalars(tmp_path):
    gin.parse_config("_toy_setting.value = 7")
    assert _toy_setting() == 7
    trainer = make(tmp_path, train_steps=10, summary_interval=5, eval_interval=10)
    trainer.train_and_evaluate()
    train = read_scalars(tmp_path / "train")
    expected = {"loss", "ce_loss", "accuracy", "grad_norm", "learning_rate",
                "steps_per_second", "examples_per_second", "tokens_per_second",
                "padding_fraction"}
    assert expected <= set(train)
    # The toy model has no encoder, hence no FLOP count: no MFU (and no peak measurement).
    assert not {"mfu", "model_gflops_per_second", "peak_gflops"} & set(train)
    assert set(train["loss"]) == {5, 10}
    schedule = optimization.build_schedule(ADAMW, 10)
    # The rate logged at step s is the one step s used (optimizer iteration s - 1).
    assert train["learning_rate"][5] == pytest.approx(float(schedule(4)), rel=1e-6)
    assert train["learning_rate"][10] == pytest.approx(float(schedule(9)), rel=1e-6)
    assert all(v > 0 for v in train["tokens_per_second"].values())
    assert train["tokens_per_second"][10] > train["examples_per_second"][10]
    evals = read_scalars(tmp_path / "eval")
    assert {"loss", "accuracy", "host_accuracy"} <= set(evals) and set(evals["loss"]) == {10}
    operative = (tmp_path / "operative_config.gin").read_text()
    assert "_toy_setting.value = 7" in operative
    assert json.loads((tmp_path / "toy_config.json").read_text())["hidden_size"] == 16


@pytest.mark.slow  # over a few seconds: left out of make test-fast
@pytest.mark.parametrize("batch, accumulation", [
    (dict(train_batch_size=8), dict(accumulation_steps=2)),  # two task batches of 8
    (dict(train_batch_size=16), dict(micro_batch_size=4)),  # a fitted plan: 4 x 4
    (dict(train_batch_size=8), dict(accumulation_steps=2, micro_batch_size=2)),  # 2 x 4 x 2
], ids=["accumulation_steps", "micro_batch", "both"])
def test_accumulating_equals_one_full_batch_step(tmp_path, batch, accumulation):
    sgd = OptimizerConfig(name="sgd", learning_rate=0.5, end_learning_rate=0.5,
                          weight_decay=0.0, clip_norm=None)
    small = make(tmp_path / "small", ToyConfig(**batch), sgd, train_steps=3, **accumulation)
    small.train_and_evaluate()
    large = make(tmp_path / "full", ToyConfig(train_batch_size=16), sgd, train_steps=3)
    large.train_and_evaluate()
    assert max_difference(weights(small), weights(large)) < 1e-6
    assert int(small.optimizer.iterations.numpy()) == 3
    if small.batch_plan is not None:
        assert small.batch_plan.global_batch == 16
        assert small.batch_plan.accumulation_steps == 16 // small.batch_plan.micro_batch


def test_clipping_bounds_the_applied_update(tmp_path):
    sgd = OptimizerConfig(name="sgd", learning_rate=1.0, end_learning_rate=1.0,
                          weight_decay=0.0, clip_norm=1e-3)
    trainer = make(tmp_path, optimizer=sgd, train_steps=1)
    before = weights(trainer)
    trainer.train_and_evaluate()
    after = weights(trainer)
    update = np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(after, before, strict=True)))
    assert update == pytest.approx(1e-3, rel=1e-3)


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_mixed_bfloat16_trains_and_restores_the_global_policy(tmp_path, bfloat16_required):
    trainer = make(tmp_path, train_steps=10, mixed_precision="bfloat16", eval_steps=None)
    result = trainer.train_and_evaluate()
    assert np.isfinite(result.train["loss"]) and result.eval["loss"] < 0.69
    dense = trainer.model.get_layer("hidden")
    assert dense.compute_dtype == "bfloat16" and dense.kernel.dtype == "float32"
    assert keras.config.dtype_policy().name == "float32"


def test_bfloat16_is_refused_in_one_line_where_onednn_cannot_run_it(tmp_path, monkeypatch):
    # As on a CPU without AVX-512 (emulated by the cap): oneDNN would abort on the first
    # bfloat16 matmul, so the trainer refuses the setting before it builds or writes anything.
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    with pytest.raises(UserError, match=r"^TrainerConfig\.mixed_precision='bfloat16': "
                                        r"ONEDNN_MAX_CPU_ISA=AVX2 holds TensorFlow's oneDNN "
                                        r"below bfloat16, .* train in float32 .* "
                                        r"TF_ENABLE_ONEDNN_OPTS=0"):
        make(tmp_path / "run", train_steps=2, mixed_precision="bfloat16")
    assert not (tmp_path / "run").exists()
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")  # oneDNN off: TensorFlow's own kernels
    assert make(tmp_path / "off", train_steps=2, mixed_precision="bfloat16").model is not None


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_float16_uses_dynamic_loss_scaling(tmp_path):
    trainer = make(tmp_path, train_steps=10, mixed_precision="float16")
    assert isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)
    result = trainer.train_and_evaluate()
    # Overflowing steps (the initial scale 2**15 is too high) are skipped and the scale halved;
    # they are not NaN failures: the run goes on to the end.
    applied = int(trainer.optimizer.inner_optimizer.iterations.numpy())
    assert result.step == 10 and 0 < applied < 10
    assert result.train["loss_scale"] == 2.0**15 / 2 ** (10 - applied)
    assert np.isfinite(result.train["loss"]) and np.isfinite(result.train["grad_norm"])
    assert keras.config.dtype_policy().name == "float32"


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
def test_jit_compile_gives_the_same_weights(tmp_path):
    eager = make(tmp_path / "a", train_steps=5)
    eager.train_and_evaluate()
    compiled = make(tmp_path / "b", train_steps=5, jit_compile=True)
    compiled.train_and_evaluate()
    assert max_difference(weights(eager), weights(compiled)) < 1e-5


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_init_checkpoint_warm_starts_fresh_runs_only(tmp_path):
    make(tmp_path / "pre", train_steps=5).train_and_evaluate()
    pretrained = weights(make(tmp_path / "pre", train_steps=5))
    warm = make(tmp_path / "warm", train_steps=10, init_checkpoint=str(tmp_path / "pre"))
    assert int(warm.global_step.numpy()) == 0
    assert max_difference(weights(warm), pretrained) == 0
    warm.train_and_evaluate()
    # Restarting the warm run resumes its own checkpoint; init_checkpoint is ignored.
    again = make(tmp_path / "warm", train_steps=10, init_checkpoint=str(tmp_path / "pre"))
    assert int(again.global_step.numpy()) == 10
    assert max_difference(weights(again), weights(warm)) == 0


def test_bad_settings_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="train_steps=0 must be a positive integer"):
        TrainerConfig(train_steps=0)
    with pytest.raises(UserError, match="accumulation_steps=-2"):
        TrainerConfig(train_steps=5, accumulation_steps=-2)
    with pytest.raises(UserError, match="eval_interval=5 needs evaluation but eval_steps=0"):
        TrainerConfig(train_steps=5, eval_interval=5, eval_steps=0)
    with pytest.raises(UserError, match="mixed_precision='fp8'"):
        TrainerConfig(train_steps=5, mixed_precision="fp8")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(UserError, match=f"--model_dir={a_file} is a file"):
        make(a_file, train_steps=5)
    with pytest.raises(UserError, match="--init_checkpoint=.*no checkpoint there"):
        make(tmp_path / "run", train_steps=5, init_checkpoint=str(tmp_path / "missing"))


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_unknown_best_metric_names_the_choices(tmp_path):
    trainer = make(tmp_path, train_steps=5, best_metric="f1", eval_steps=1)
    with pytest.raises(UserError, match="best_metric='f1' is not an eval metric.*accuracy"):
        trainer.train_and_evaluate()


def test_in_memory_inputs_replace_the_tasks_and_the_counters_are_public(tmp_path):
    """`train_iterator(inputs=...)` (the benchmarks' hook) trains on the caller's batches, and
    `step_counts` / `tracing_count` read the compiled step's own counters."""
    from toy_task import make_examples  # noqa: PLC0415

    trainer = make(tmp_path, train_steps=6, summary_interval=100)
    # One batch of 5 rows, repeated (the task's batch is 8): the counters tell which trained.
    examples = make_examples(TOY, 5, seed=7)
    calls = []

    def inputs(input_context):
        calls.append(input_context.num_replicas_in_sync)
        return tf.data.Dataset.from_tensors(examples).repeat()

    iterator = trainer.train_iterator(inputs=inputs)
    assert calls == [1]
    trainer.run_steps(iterator, 3)
    assert trainer.step_counts().examples == 3 * 5
    assert trainer.tracing_count() == 1
    trainer.run_steps(iterator, 3)  # same shapes: no retrace
    assert (trainer.step_counts().examples, trainer.tracing_count()) == (30, 1)
    assert np.isfinite(trainer.train_results()["loss"])
