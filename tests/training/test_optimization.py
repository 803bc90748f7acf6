"""Learning-rate schedule, weight-decay exclusions, clipping, optimizer config, precision policy."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from numerics import assert_close

from bert_trainer.errors import UserError
from bert_trainer.training import optimization
from bert_trainer.training.optimization import OptimizerConfig, WarmupPolynomialDecay


@pytest.mark.parametrize("step, expected", [
    (0, 0.0),            # warmup starts from zero (google-research/bert)
    (5, 5e-4),           # halfway through warmup
    (10, 9e-4),          # decay is over the global step: 1e-3 * (1 - 10/100)
    (55, 4.5e-4),
    (100, 0.0),
    (150, 0.0),          # clamped after decay_steps
])
def test_warmup_then_linear_decay(step, expected):
    schedule = WarmupPolynomialDecay(1e-3, decay_steps=100, warmup_steps=10)
    assert float(schedule(step)) == pytest.approx(expected, abs=1e-9)


def test_polynomial_power_and_end_rate():
    schedule = WarmupPolynomialDecay(1e-3, decay_steps=100, end_learning_rate=1e-4, power=2.0)
    assert float(schedule(0)) == pytest.approx(1e-3)  # no warmup
    assert float(schedule(50)) == pytest.approx(0.9e-3 * 0.25 + 1e-4)
    assert float(schedule(200)) == pytest.approx(1e-4)


def test_schedule_serializes_and_takes_tensor_steps():
    schedule = WarmupPolynomialDecay(2e-3, decay_steps=40, warmup_steps=4, power=1.5)
    config = keras.optimizers.schedules.serialize(schedule)
    restored = keras.optimizers.schedules.deserialize(config)
    assert isinstance(restored, WarmupPolynomialDecay)
    assert restored.get_config() == schedule.get_config()
    steps = tf.constant([0, 2, 4, 20, 39], tf.int64)
    # Learning rates are ~1e-3: relative tolerance only.
    assert_close(restored(steps), schedule(steps), rtol=1e-6, atol=0)
    assert float(schedule(tf.constant(2, tf.int64))) == pytest.approx(1e-3)


def test_config_decay_defaults_to_train_steps():
    schedule = optimization.build_schedule(OptimizerConfig(learning_rate=1.0), train_steps=8)
    assert schedule.decay_steps == 8 and float(schedule(6)) == pytest.approx(0.25)


def _model():
    inputs = keras.Input((3,))
    x = keras.layers.Dense(4, name="dense")(inputs)
    x = keras.layers.LayerNormalization(name="attention_layer_norm")(x)
    x = keras.layers.Dense(2, use_bias=False, name="out")(x)
    return keras.Model(inputs, x)


def test_weight_decay_exclusions_by_variable_path():
    model = _model()
    excluded = optimization.excluded_from_weight_decay(
        model.trainable_variables, optimization.DEFAULT_WEIGHT_DECAY_EXCLUSIONS)
    assert sorted(v.path for v in excluded) == [
        "attention_layer_norm/beta", "attention_layer_norm/gamma", "dense/bias"]


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_weight_decay_skips_layer_norm_and_bias(name):
    model = _model()
    for v in model.trainable_variables:  # non-zero everywhere so that decay would show
        v.assign(np.full(v.shape, 0.5, np.float32))
    config = OptimizerConfig(name=name, learning_rate=0.1, weight_decay=0.2)
    optimizer = optimization.build_optimizer(config, model.trainable_variables, train_steps=10)
    before = {v.path: v.numpy() for v in model.trainable_variables}
    # Zero gradients: Adam/LAMB moments stay zero, so only the decoupled decay moves weights.
    optimizer.apply([tf.zeros(v.shape) for v in model.trainable_variables],
                    model.trainable_variables)
    for v in model.trainable_variables:
        decayed = not v.path.endswith(("bias", "gamma", "beta"))
        factor = 1 - 0.1 * 0.2 if decayed else 1.0
        np.testing.assert_allclose(v.numpy(), before[v.path] * factor, rtol=1e-6,
                                   err_msg=v.path)


def test_clip_by_global_norm():
    grads = [tf.constant([3.0]), tf.constant([[4.0]])]
    norm = optimization.global_norm(grads)
    assert float(norm) == pytest.approx(5.0)
    clipped = optimization.clip_by_global_norm(grads, norm, 1.0)
    assert [float(tf.reshape(g, [])) for g in clipped] == pytest.approx([0.6, 0.8])
    unclipped = optimization.clip_by_global_norm(grads, norm, 10.0)
    assert [float(tf.reshape(g, [])) for g in unclipped] == pytest.approx([3.0, 4.0])
    assert optimization.clip_by_global_norm(grads, norm, None) is grads
    inf = optimization.clip_by_global_norm(grads, tf.constant(np.inf), 1.0)
    assert all(np.isnan(g.numpy()).all() for g in inf)  # a LossScaleOptimizer skips these


def test_build_optimizer_kinds():
    model = _model()
    variables = model.trainable_variables
    sgd = optimization.build_optimizer(OptimizerConfig(name="sgd", momentum=0.9), variables,
                                       train_steps=5)
    assert isinstance(sgd, keras.optimizers.SGD) and sgd.momentum == 0.9
    lamb = optimization.build_optimizer(OptimizerConfig(name="lamb"), variables, train_steps=5)
    assert isinstance(lamb, keras.optimizers.Lamb) and lamb.built
    fp16 = optimization.build_optimizer(OptimizerConfig(), variables, train_steps=5,
                                        mixed_precision="float16")
    assert isinstance(fp16, keras.optimizers.LossScaleOptimizer)
    assert isinstance(fp16.inner_optimizer, keras.optimizers.AdamW)
    # Built up front, so a checkpoint restore fills the moments instead of missing them.
    assert len(fp16.inner_optimizer.variables) == 1 + 2 * len(variables)  # + iteration


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "adam"}, "optimizer name='adam' is unknown; choose one of: adamw, lamb, sgd"),
    ({"learning_rate": 0.0}, "optimizer learning_rate=0.0 must be > 0"),
    ({"warmup_steps": -1}, "optimizer warmup_steps=-1 must be >= 0"),
    ({"clip_norm": 0.0}, "optimizer clip_norm=0.0 must be > 0"),
    ({"decay_steps": 0}, "optimizer decay_steps=0 must be > 0"),
    ({"weight_decay_exclusions": ("(",)}, "weight_decay_exclusions: bad regex '('"),
])
def test_bad_optimizer_config(kwargs, message):
    with pytest.raises(UserError, match=re.escape(message)):
        OptimizerConfig(**kwargs)


def test_precision_policy_is_scoped():
    keras.config.set_dtype_policy("float32")
    with optimization.precision_policy("bfloat16"):
        assert keras.config.dtype_policy().name == "mixed_bfloat16"
        layer = keras.layers.Dense(2)
    assert keras.config.dtype_policy().name == "float32"
    assert layer.compute_dtype == "bfloat16"
    with pytest.raises(RuntimeError), optimization.precision_policy("float16"):
        raise RuntimeError("the policy is restored even when building fails")
    assert keras.config.dtype_policy().name == "float32"
    with pytest.raises(UserError, match="mixed_precision='int8' is unknown"):
        with optimization.precision_policy("int8"):
            pass


def test_zero_weight_decay_builds_adamw_and_lamb_without_decay():
    import keras

    from bert_trainer.training import optimization

    v = keras.Variable([[1.0, 2.0]], name="kernel")
    for name in ("adamw", "lamb"):
        config = optimization.OptimizerConfig(name=name, learning_rate=0.1, weight_decay=0.0,
                                              warmup_steps=0)
        opt = optimization.build_optimizer(config, [v], train_steps=10)
        opt.apply([keras.ops.zeros_like(v)], [v])
        # zero gradients and no decay: the variable is unchanged (decay 0.01 would shrink it).
        assert keras.ops.convert_to_numpy(v).tolist() == [[1.0, 2.0]], name


@pytest.mark.parametrize("gradient_scale", [None, 0.25])
def test_fused_adamw_follows_keras_adamw_step_for_step(monkeypatch, kernel_mode,
                                                       gradient_scale):
    """One-pass kernel ("on") or ResourceApplyAdam ("off"): Keras' AdamW step for step, with
    the clip factor folded into the update (`gradient_scale`) or not."""
    from bert_trainer import kernels  # noqa: PLC0415
    from bert_trainer.training.fused_adamw import FusedAdamW  # noqa: PLC0415

    fused_updates = []
    real_apply_adamw = kernels.apply_adamw
    monkeypatch.setattr(kernels, "apply_adamw",
                        lambda *a, **k: fused_updates.append(1) or real_apply_adamw(*a, **k))
    rng = np.random.default_rng(0)
    shapes = [(7, 5), (5,), (3, 4, 2), (3000,)]  # the last spans several kernel chunks
    start = [rng.standard_normal(s).astype("float32") for s in shapes]
    grads = [[tf.constant(rng.standard_normal(s).astype("float32")) for s in shapes]
             for _ in range(4)]
    results = []
    for cls in (keras.optimizers.AdamW, FusedAdamW):
        variables = [keras.Variable(v, name=f"w{i}") for i, v in enumerate(start)]
        optimizer = cls(learning_rate=0.01, weight_decay=0.1, epsilon=1e-6)
        optimizer.exclude_from_weight_decay(var_list=[variables[1]])
        optimizer.build(variables)
        for step_grads in grads:
            if cls is FusedAdamW and gradient_scale is not None:
                optimizer.apply(step_grads, variables,
                                gradient_scale=tf.constant(gradient_scale))
            elif gradient_scale is not None:
                optimizer.apply([g * gradient_scale for g in step_grads], variables)
            else:
                optimizer.apply(step_grads, variables)
        results.append(([v.numpy() for v in variables],
                        [v.numpy() for v in optimizer.variables]))
    # The one-pass kernel updated every variable at every step, or never when off.
    assert len(fused_updates) == (len(shapes) * len(grads) if kernel_mode == "on" else 0)
    (keras_vars, keras_slots), (fused_vars, fused_slots) = results
    for a, b, first in zip(keras_vars, fused_vars, start, strict=True):
        assert np.abs(a - first).max() > 1e-2  # it trained (4 steps of ~lr = 0.01)
        # Float32 round-off of the same formula: < 1e-4 of the distance travelled.
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
    # The same slot variables (moments, iterations), so checkpoints are interchangeable.
    assert len(keras_slots) == len(fused_slots)
    for a, b in zip(keras_slots, fused_slots, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-8)


@pytest.mark.parametrize("copy_on_read", [False, True])
def test_adamw_kernel_is_the_formula_and_leaves_earlier_reads_unchanged(kernels_required,
                                                                        copy_on_read):
    """One `BertApplyAdamW`: clip scale, decoupled decay, Adam; a tensor read from the
    variable before the update keeps its value (the kernel writes a shared buffer's update
    to a new one). A variable read by a gather (an embedding table) is in copy-on-read mode:
    every update writes a new buffer."""
    from bert_trainer import kernels  # noqa: PLC0415

    rng = np.random.default_rng(1)
    shape = (3000,)  # several chunks
    p0, m0, g = (rng.standard_normal(shape).astype("float32") for _ in range(3))
    v0 = np.abs(rng.standard_normal(shape)).astype("float32")
    var, m, v = tf.Variable(p0), tf.Variable(m0), tf.Variable(v0)
    if copy_on_read:
        assert var.sparse_read([0, 2]).numpy().tolist() == [p0[0], p0[2]]
    before = var.read_value()  # shares the variable's buffer (or a copy of it)
    lr, b1, b2, eps, scale, t = 0.01, 0.9, 0.999, 1e-6, 0.5, 3
    wd = 0.0 if copy_on_read else 0.1  # no decay: the new buffer starts as a copy
    f32 = np.float32
    kernels.apply_adamw(var, m, v, tf.constant(g), lr=tf.constant(lr), beta1_power=tf.constant(
        b1 ** t), beta2_power=tf.constant(b2 ** t), beta1=tf.constant(b1), beta2=tf.constant(b2),
        epsilon=tf.constant(eps), weight_decay=tf.constant(wd), grad_scale=tf.constant(scale))
    gs = g * f32(scale)
    m1 = m0 + (gs - m0) * f32(1 - b1)
    v1 = v0 + (gs * gs - v0) * f32(1 - b2)
    alpha = f32(lr) * np.sqrt(f32(1 - b2 ** t)) / f32(1 - b1 ** t)
    p1 = p0 - p0 * f32(wd) * f32(lr) - m1 * alpha / (np.sqrt(v1) + f32(eps))
    np.testing.assert_allclose(m.numpy(), m1, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(v.numpy(), v1, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(var.numpy(), p1, rtol=1e-6, atol=1e-6)
    assert np.abs(var.numpy() - p0).max() > 1e-3
    np.testing.assert_array_equal(before.numpy(), p0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="of the gradient's shape"):
        kernels.apply_adamw(var, m, v, tf.zeros([7]), lr=tf.constant(lr),
                            beta1_power=tf.constant(0.5), beta2_power=tf.constant(0.5),
                            beta1=tf.constant(b1), beta2=tf.constant(b2),
                            epsilon=tf.constant(eps), weight_decay=tf.constant(0.0),
                            grad_scale=tf.constant(1.0))
