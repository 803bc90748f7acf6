"""Automatic batch fitting: the plan's arithmetic, the estimate, the probe's search, the cache a
resume reuses, and an out-of-memory at the requested size turned into a fitted run.

The equality of a fitted (accumulated) update with the full-batch update is in
tests/training/test_trainer.py (`test_accumulating_equals_one_full_batch_step`).
"""

import json

import numpy as np
import pytest
import tensorflow as tf
from toy_task import ToyConfig, ToyTask

from bert_trainer.errors import UserError
from bert_trainer.training import batch_fit, memory
from bert_trainer.training.batch_fit import BatchPlan, candidates, make_plan
from bert_trainer.training.optimization import OptimizerConfig
from bert_trainer.training.trainer import Trainer, TrainerConfig

SGD = OptimizerConfig(name="sgd", learning_rate=0.5, end_learning_rate=0.5, weight_decay=0.0,
                      clip_norm=None)


def oom_above(limit: int, calls: list | None = None):
    """A probe that runs out of memory above `limit` examples (and records its sizes)."""
    def probe(size):
        if calls is not None:
            calls.append(size)
        if size > limit:
            raise tf.errors.ResourceExhaustedError(None, None, f"OOM allocating {size} rows")
        return size * 100  # bytes
    return probe


def no_probe(size):
    raise AssertionError(f"probed {size} although the plan was decided without a probe")


def weights(trainer):
    return [v.numpy() for v in trainer.model.trainable_variables]


def max_difference(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


# ----------------------------------------------------------------------------- arithmetic

def test_the_plan_multiplies_to_the_global_batch_and_logs_it():
    plan = make_plan(256, 1, 64)
    assert (plan.global_batch, plan.micro_batch, plan.accumulation_steps) == (256, 64, 4)
    assert str(plan) == "batch 256 = 4 steps x 64 per replica x 1 replica"
    two = make_plan(256, 2, 32)
    assert str(two) == "batch 256 = 4 steps x 32 per replica x 2 replicas"
    assert str(make_plan(32, 1, 32)) == "batch 32 = 1 step x 32 per replica x 1 replica"
    # With TrainerConfig.accumulation_steps=2 each task batch of 16 is split too.
    assert str(make_plan(16, 1, 4, accumulation_steps=2)) == (
        "batch 32 = 8 steps x 4 per replica x 1 replica")
    with pytest.raises(ValueError, match="does not multiply"):
        BatchPlan(256, 64, 3, 1)


@pytest.mark.parametrize("replicas", [1, 2, 3, 8])
def test_every_candidate_divides_the_per_replica_batch(replicas):
    for per_replica in range(1, 130):
        sizes = candidates(per_replica)
        assert sizes[0] == per_replica and sizes[-1] == 1
        assert all(b <= a // 2 for a, b in zip(sizes, sizes[1:], strict=False))  # at least halving
        for m in sizes:
            plan = make_plan(per_replica * replicas, replicas, m)
            assert per_replica % m == 0
            assert plan.micro_batch * plan.accumulation_steps * replicas == plan.global_batch
    assert candidates(96) == [96, 48, 24, 12, 6, 3, 1]
    assert candidates(100) == [100, 50, 25, 10, 5, 2, 1]


def test_a_micro_batch_that_does_not_divide_is_refused_with_the_choices():
    with pytest.raises(UserError, match=r"micro_batch_size=5 must divide the per-replica batch "
                       r"16 \(batch 32 over 2 replica\(s\)\); choose one of 16, 8, 4, 2, 1"):
        make_plan(32, 2, 5)
    with pytest.raises(UserError, match="global batch 30 does not divide among 4 replicas"):
        make_plan(30, 4, 1)


# ---------------------------------------------------------------------------- the estimate

def test_the_activation_estimate_is_korthikanti_for_16_bit_values():
    # Per layer and token, 34 h + 5 a s bytes with inner_dim = 4 h (Korthikanti et al. 2022),
    # plus the embeddings' 3 h values and h mask bytes per token.
    h, a, s, layers = 384, 12, 128, 6
    got = memory.activation_bytes_per_example(num_layers=layers, hidden_size=h,
                                                 inner_dim=4 * h, num_attention_heads=a,
                                                 seq_length=s, value_bytes=2)
    assert got == s * (layers * (34 * h + 5 * a * s) + 2 * 3 * h + h)
    float32 = memory.activation_bytes_per_example(num_layers=layers, hidden_size=h,
                                                     inner_dim=4 * h, num_attention_heads=a,
                                                     seq_length=s, value_bytes=4)
    assert 1.7 * got < float32 < 2 * got  # masks stay one byte
    # Gradients, and as many again for the accumulators.
    assert memory.estimate_step_bytes(num_params=10, per_example=100, micro_batch=3,
                                         accumulating=True) == 80 + 300


def test_the_peak_rss_of_a_call_is_measured():
    before = memory.rss_bytes()
    assert 0 < before and memory.available_bytes() > 0
    peak = memory.measure_peak_rss(lambda: np.ones(200 * 2**20 // 8).sum())  # 200 MiB touched
    assert peak - before > 190 * 2**20
    # The peak was reset to the current RSS first: a small call does not report the big one.
    assert memory.measure_peak_rss(lambda: np.ones(10).sum()) - before < 100 * 2**20


def test_the_estimate_decides_first_and_only_sizes_near_the_budget_are_probed():
    assert batch_fit.SAFETY == 2.0  # the numbers below
    calls = []
    estimate = lambda size: size * 100  # noqa: E731
    # Obviously fits (SAFETY 2 x 1,600 <= 10,000): no probe at all.
    assert batch_fit.search([16, 8, 4], oom_above(16, calls), estimate=estimate,
                            budget=10_000) == (16, "estimate", None)
    assert calls == []
    # 16 (1,600) is over a 1,000 budget: not probed; 8 (800) is near it: probed, fits.
    assert batch_fit.search([16, 8, 4], oom_above(16, calls), estimate=estimate,
                            budget=1_000) == (8, "probe", 800)
    assert calls == [8]
    # A probed peak over the budget is a miss, like an out-of-memory error.
    calls.clear()

    def measures_ten_times_the_estimate(size):
        calls.append(size)
        return size * 1000

    assert batch_fit.search([16, 8, 4, 2], measures_ten_times_the_estimate, estimate=estimate,
                            budget=1_000) == (4, "estimate", None)  # 2 x 400 <= 1,000
    assert calls == [8]  # 8,000 bytes measured > 1,000
    with pytest.raises(UserError, match="not even a micro-batch of 1 example fits"):
        batch_fit.search([2, 1], oom_above(0), estimate=None, budget=None)


def test_out_of_memory_at_the_requested_size_halves_until_one_fits():
    calls = []
    size, how, peak = batch_fit.search(candidates(64), oom_above(10, calls))
    assert (size, how, peak) == (8, "probe", 800) and calls == [64, 32, 16, 8]

    def cublas(size):  # a GPU library's allocation failure comes as an InternalError
        if size > 2:
            raise tf.errors.InternalError(None, None, "Blas GEMM: CUDA_ERROR_OUT_OF_MEMORY: out "
                                          "of memory")
        return 1
    assert batch_fit.search([8, 4, 2, 1], cublas)[0] == 2

    def broken(size):
        raise tf.errors.InternalError(None, None, "a kernel failed")
    with pytest.raises(tf.errors.InternalError, match="a kernel failed"):
        batch_fit.search([8, 4], broken)


def test_a_tiny_encoder_at_the_recipe_batch_is_not_probed(tiny_pretrained, tmp_path):
    from finetune_testing import make_task  # noqa: PLC0415

    task = make_task("sst2", tiny_pretrained, seq_length=32, train_batch_size=32)
    model = task.build_model()
    strategy = tf.distribute.get_strategy()
    plan, _ = batch_fit.plan_batch(task, model, strategy, str(tmp_path), task_batch=32,
                                   seq_length=32, probe=no_probe)
    assert (plan.micro_batch, plan.how) == (32, "estimate")
    # A budget of a few bytes: every size is estimated over it and none is even probed.
    with pytest.raises(UserError, match="not even a micro-batch of 1"):
        batch_fit.plan_batch(task, model, strategy, str(tmp_path), task_batch=32,
                             seq_length=32, probe=no_probe, budget=10)
    # A budget at the estimate of the full batch: it is probed (out of memory here), and so
    # are the halves until one fits.
    per = memory.encoder_activation_bytes(model, 32, None)
    params = sum(int(v.shape.num_elements()) for v in model.trainable_variables)
    budget = memory.estimate_step_bytes(num_params=params, per_example=per, micro_batch=32,
                                           accumulating=False)
    calls = []
    plan, _ = batch_fit.plan_batch(task, model, strategy, str(tmp_path), task_batch=32,
                                   seq_length=32, probe=oom_above(8, calls), budget=budget)
    assert calls[:2] == [32, 16] and plan.micro_batch == 8 and plan.accumulation_steps == 4


# ------------------------------------------------------------------------------- the probe

def test_the_real_probe_measures_and_leaves_weights_and_dropout_state_alone(tmp_path):
    task = ToyTask(ToyConfig(dropout=0.2, train_batch_size=16))
    model = task.build_model()
    before = [v.numpy().copy() for v in model.variables]
    probe = batch_fit.model_probe(task, model, tf.distribute.get_strategy(), seq_length=8,
                                  jit_compile=False, on_cpu=True)
    assert probe(16) >= 0 and probe(4) >= 0  # bytes above the RSS before the first probe
    after = [v.numpy() for v in model.variables]
    assert any("seed_generator_state" in v.path for v in model.variables)
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize("name, file", [("sst2", "sst2/dev.tsv"),
                                        ("conll2003", "conll2003/eng.testa")],
                         ids=["classification", "tagging"])
def test_the_real_probe_runs_a_fine_tuning_model(tiny_pretrained, name, file):
    from finetune_testing import make_task, shared_file  # noqa: PLC0415

    task = make_task(name, tiny_pretrained, train_file=shared_file(file), seq_length=32,
                     train_batch_size=8)
    model = task.build_model()
    before = [v.numpy().copy() for v in model.variables]
    probe = batch_fit.model_probe(task, model, tf.distribute.get_strategy(), seq_length=32,
                                  jit_compile=False, on_cpu=True)
    assert probe(8) >= 0 and probe(2) >= 0
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, model.variables,
                                                             strict=True))


def test_synthetic_batches_fill_unknown_lengths_and_mark_every_token_real():
    spec = {"input_word_ids": tf.TensorSpec([None, None], tf.int32),
            "input_mask": tf.TensorSpec([None, None], tf.int32),
            "label_ids": tf.TensorSpec([None], tf.int32)}
    batch = batch_fit.synthetic_batch(spec, 4, 16)
    assert batch["input_word_ids"].shape == (4, 16) and batch["label_ids"].shape == (4,)
    assert int(tf.reduce_sum(batch["input_mask"])) == 64
    with pytest.raises(ValueError, match="unknown dimensions"):
        batch_fit.synthetic_batch(spec, 4, None)


def test_split_batches_keeps_the_order_and_each_batch_shape():
    rows = np.arange(24 * 3).reshape(24, 3)
    lengths = tf.data.Dataset.from_tensor_slices(rows).batch(8, drop_remainder=True)
    # A bucketed pipeline: batches of different sequence lengths.
    batches = lengths.enumerate().map(lambda i, x: {"ids": x[:, :1 + tf.cast(i, tf.int32)]})
    split = batch_fit.split_batches(batches, 2)
    pieces = [p["ids"].numpy() for p in split]
    assert [p.shape for p in pieces] == [(2, 1)] * 4 + [(2, 2)] * 4 + [(2, 3)] * 4
    np.testing.assert_array_equal(np.concatenate(pieces[:4]), rows[:8, :1])
    np.testing.assert_array_equal(np.concatenate(pieces[8:]), rows[16:, :3])
    assert split.element_spec["ids"].shape.as_list() == [2, None]


# ------------------------------------------------------------------------------- the cache

def test_the_cache_is_reused_only_for_the_same_run(tmp_path, caplog):
    strategy = tf.distribute.get_strategy()
    kwargs = dict(task_batch=16, seq_length=8)
    plan, key = batch_fit.plan_batch(None, None, strategy, str(tmp_path), probe=oom_above(4),
                                     **kwargs)
    assert plan.micro_batch == 4 and plan.how == "probe"
    path = batch_fit.write_cached(str(tmp_path), key, plan)
    assert not (tmp_path / "batch_plan.json.tmp").exists()
    assert json.loads(open(path).read())["plan"]["micro_batch"] == 4
    cached, _ = batch_fit.plan_batch(None, None, strategy, str(tmp_path), probe=no_probe,
                                     **kwargs)
    assert cached == BatchPlan(16, 4, 4, 1, "cached", 400)
    # Another batch or sequence length: planned again.
    calls = []
    other, _ = batch_fit.plan_batch(None, None, strategy, str(tmp_path), task_batch=32,
                                    seq_length=8, probe=oom_above(32, calls))
    assert other.micro_batch == 32 and calls == [32]
    # A forced micro-batch wins over the cache.
    forced, _ = batch_fit.plan_batch(None, None, strategy, str(tmp_path), micro_batch=8,
                                     probe=no_probe, **kwargs)
    assert (forced.micro_batch, forced.how) == (8, "forced")
    # An unreadable cache is reported and planned again.
    (tmp_path / "batch_plan.json").write_text("{not json")
    caplog.set_level("WARNING")
    again, _ = batch_fit.plan_batch(None, None, strategy, str(tmp_path), probe=oom_above(4),
                                    **kwargs)
    assert again.micro_batch == 4 and "Ignoring the unreadable batch plan" in caplog.text


# ------------------------------------------------------------------------- in the trainer

def make(model_dir, task_config, **config):
    return Trainer(ToyTask(task_config), str(model_dir),
                   config=TrainerConfig(steps_per_loop=5, eval_steps=0, checkpoint_interval=10,
                                        **config), optimizer=SGD)


@pytest.mark.slow  # trains three runs in this process
def test_out_of_memory_becomes_a_fitted_run_that_resumes_from_its_cache(tmp_path, monkeypatch,
                                                                        caplog):
    # Dropout on: the resumed run must also draw the masks of the uninterrupted one.
    task = ToyConfig(train_batch_size=16, dropout=0.2)
    monkeypatch.setattr(batch_fit, "model_probe", lambda *a, **k: oom_above(4))
    straight = make(tmp_path / "straight", task, train_steps=20, fit_batch=True)
    straight.train_and_evaluate()

    caplog.set_level("INFO")
    caplog.set_level("INFO", logger="absl")  # another test may have lowered absl's verbosity
    first = make(tmp_path / "fitted", task, train_steps=10, fit_batch=True)
    assert "batch 16 = 4 steps x 4 per replica x 1 replica" in caplog.messages
    assert not (tmp_path / "fitted").exists()  # nothing written before the run starts
    first.train_and_evaluate()
    cached = json.loads((tmp_path / "fitted" / "batch_plan.json").read_text())
    assert cached["plan"]["micro_batch"] == 4 and cached["plan"]["how"] == "probe"

    monkeypatch.setattr(batch_fit, "model_probe", lambda *a, **k: no_probe)
    resumed = make(tmp_path / "fitted", task, train_steps=20, fit_batch=True)
    assert resumed.batch_plan == BatchPlan(16, 4, 4, 1, "cached", 400)
    assert int(resumed.global_step.numpy()) == 10
    resumed.train_and_evaluate()
    assert max_difference(weights(straight), weights(resumed)) <= 1e-6


@pytest.mark.slow  # trains two runs in this process
def test_the_real_probe_keeps_the_run_identical_when_the_batch_fits(tmp_path):
    task = ToyConfig(train_batch_size=16, dropout=0.2)
    plain = make(tmp_path / "plain", task, train_steps=5)
    plain.train_and_evaluate()
    fitted = make(tmp_path / "fitted", task, train_steps=5, fit_batch=True)
    assert (fitted.batch_plan.micro_batch, fitted.batch_plan.how) == (16, "probe")
    fitted.train_and_evaluate()
    # The probe's forward pass put the dropout seed states back: the same masks were drawn.
    assert max_difference(weights(plain), weights(fitted)) == 0.0


def test_a_forced_micro_batch_that_does_not_divide_fails_before_anything_is_written(tmp_path):
    with pytest.raises(UserError, match="micro_batch_size=3 must divide the per-replica batch 16"):
        make(tmp_path / "run", ToyConfig(train_batch_size=16), train_steps=2,
             micro_batch_size=3)
    assert not (tmp_path / "run").exists()
    with pytest.raises(UserError, match="micro_batch_size=0 must be a positive integer"):
        TrainerConfig(train_steps=2, micro_batch_size=0)


# ------------------------------------------------------------------------ the finetune CLI

def run_finetune(*args) -> int:
    """`bert-train finetune` through the CLI's runner in this process, from a clean state."""
    import gin  # noqa: PLC0415
    from absl import flags  # noqa: PLC0415

    from bert_trainer.commands import finetune, run_command  # noqa: PLC0415

    flags.FLAGS.unparse_flags()
    gin.clear_config()
    return run_command(finetune, ["bert-train finetune", *map(str, args)])


@pytest.mark.slow  # two fine-tuning runs in this process
def test_finetune_fits_by_default_and_a_resume_keeps_the_micro_batch(tiny_pretrained, tmp_path,
                                                                     caplog, monkeypatch):
    from finetune_testing import shared_file  # noqa: PLC0415

    caplog.set_level("INFO")
    caplog.set_level("INFO", logger="absl")
    model_dir = tmp_path / "sst2"
    common = ["--task=sst2", f"--train_file={shared_file('sst2/train.tsv')}",
              f"--eval_file={shared_file('sst2/dev.tsv')}", "--max_train_examples=64",
              "--max_eval_examples=16", "--seq_length=32", "--batch_size=16",
              f"--init_checkpoint={tiny_pretrained['dir']}", f"--model_dir={model_dir}"]
    # The tiny encoder at batch 16 obviously fits: decided by the estimate, never probed.
    monkeypatch.setattr(batch_fit, "model_probe", lambda *a, **k: no_probe)
    assert run_finetune(*common, "--train_steps=2") == 0
    assert "batch 16 = 1 step x 16 per replica x 1 replica" in caplog.messages
    plan = json.loads((model_dir / "batch_plan.json").read_text())
    assert plan["plan"]["how"] == "estimate" and plan["key"]["seq_length"] == 32
    assert "TrainerConfig.fit_batch = True" in (model_dir / "operative_config.gin").read_text()

    # A fresh run with a forced micro-batch; its resume reuses it without the flag.
    other = tmp_path / "forced"
    forced = [*common[:-1], f"--model_dir={other}"]
    caplog.clear()
    assert run_finetune(*forced, "--train_steps=2", "--micro_batch_size=4") == 0
    assert "batch 16 = 4 steps x 4 per replica x 1 replica" in caplog.messages
    caplog.clear()
    assert run_finetune(*forced, "--train_steps=4") == 0
    assert "batch 16 = 4 steps x 4 per replica x 1 replica" in caplog.messages
    assert "Micro-batch 4 decided by: cached" in caplog.messages
    assert json.loads((other / "eval_results.json").read_text())["step"] == 4
