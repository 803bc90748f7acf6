"""Optimizers, the learning-rate schedule, gradient clipping and mixed precision.

The recipe is google-research/bert's: AdamW (or LAMB) whose weight decay skips LayerNorm
parameters and biases, a learning rate that warms up linearly from 0 and decays polynomially
(linearly by default) to `end_learning_rate`, and gradients clipped by their global norm.
Gradient accumulation lives in the trainer (it owns the train step).
"""

import contextlib
import dataclasses
import math
import re

import keras
import tensorflow as tf
from keras import ops

from bert_trainer.errors import UserError
from bert_trainer.training import time_budget
from bert_trainer.training.fused_adamw import FusedAdamW

OPTIMIZER_NAMES = ("adamw", "lamb", "sgd")
# Matched (case-insensitively) against each variable's path, e.g.
# "encoder/transformer/layer_0/attention_layer_norm/gamma" or ".../dense/bias".
DEFAULT_WEIGHT_DECAY_EXCLUSIONS = (r"layer_?norm", r"(^|/)(bias|gamma|beta)$")
PRECISIONS = {None: "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
# "bert": google-research/bert's decay, a function of the global step; "one_cycle": the decay
# starts from the peak at the end of warmup (a triangle for power 1, as in Cramming).
SCHEDULES = ("bert", "one_cycle")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """How parameters are updated.

    Attributes:
        name: "adamw", "lamb" or "sgd".
        learning_rate: peak learning rate, reached at the end of warmup.
        warmup_steps: steps of linear warmup from 0 (0: none).
        warmup_fraction: warmup over this fraction of the run's steps instead of
            `warmup_steps` (a recipe for any run length, e.g. a time budget); None: off.
        schedule: "bert" (the decay is a function of the global step, so it starts below
            the peak after warmup) or "one_cycle" (linear warmup to the peak, then the
            decay from the peak to `end_learning_rate` over the remaining steps).
        decay_steps: step at which the rate reaches `end_learning_rate`; None: the run's
            `train_steps`.
        end_learning_rate: the final rate.
        power: polynomial power of the decay (1.0: linear).
        weight_decay: decoupled weight decay rate (AdamW/LAMB/SGD); 0 disables it.
        weight_decay_exclusions: regexes; a variable whose path matches one gets no decay.
        beta_1, beta_2, epsilon: Adam/LAMB moments.
        momentum: SGD momentum.
        clip_norm: clip gradients to this global norm; None: no clipping (the norm is still
            computed and logged).
    """

    name: str = "adamw"
    learning_rate: float = 1e-4
    warmup_steps: int = 0
    warmup_fraction: float | None = None
    schedule: str = "bert"
    decay_steps: int | None = None
    end_learning_rate: float = 0.0
    power: float = 1.0
    weight_decay: float = 0.01
    weight_decay_exclusions: tuple[str, ...] = DEFAULT_WEIGHT_DECAY_EXCLUSIONS
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-6
    momentum: float = 0.0
    clip_norm: float | None = 1.0

    def __post_init__(self):
        if self.name not in OPTIMIZER_NAMES:
            raise UserError(f"optimizer name={self.name!r} is unknown; choose one of: "
                            f"{', '.join(OPTIMIZER_NAMES)}")
        for field in ("learning_rate", "end_learning_rate", "power", "weight_decay", "beta_1",
                      "beta_2", "epsilon", "momentum", "clip_norm"):
            value = getattr(self, field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not math.isfinite(value)):
                raise UserError(f"optimizer {field}={value!r} must be a finite number")
        for field in ("beta_1", "beta_2"):
            if not 0 <= getattr(self, field) < 1:
                raise UserError(f"optimizer {field}={getattr(self, field)} must be in [0, 1)")
        for field in ("learning_rate", "epsilon"):
            if not getattr(self, field) > 0:
                raise UserError(f"optimizer {field}={getattr(self, field)} must be > 0")
        for field in ("warmup_steps", "end_learning_rate", "weight_decay", "momentum"):
            if getattr(self, field) < 0:
                raise UserError(f"optimizer {field}={getattr(self, field)} must be >= 0")
        if self.schedule not in SCHEDULES:
            raise UserError(f"optimizer schedule={self.schedule!r} is unknown; choose one of: "
                            f"{', '.join(SCHEDULES)}")
        if self.warmup_fraction is not None and not (
                isinstance(self.warmup_fraction, int | float)
                and 0 <= self.warmup_fraction < 1):
            raise UserError(f"optimizer warmup_fraction={self.warmup_fraction!r} must be in "
                            "[0, 1) (or None: warmup_steps)")
        if self.decay_steps is not None and self.decay_steps <= 0:
            raise UserError(f"optimizer decay_steps={self.decay_steps} must be > 0 (or None)")
        if self.clip_norm is not None and self.clip_norm <= 0:
            raise UserError(f"optimizer clip_norm={self.clip_norm} must be > 0 (or None)")
        for pattern in self.weight_decay_exclusions:
            try:
                re.compile(pattern)
            except re.error as e:
                raise UserError(f"optimizer weight_decay_exclusions: bad regex {pattern!r} "
                                f"({e})") from None


@keras.saving.register_keras_serializable(package="bert_trainer")
class WarmupPolynomialDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to `initial_learning_rate`, then polynomial decay.

    As in google-research/bert, the decay is a function of the global step (not of the steps
    since warmup ended): lr(step) = (init - end) * (1 - min(step, decay_steps) / decay_steps)
    ** power + end, replaced by init * step / warmup_steps while step < warmup_steps.
    With `decay_from_warmup` (a one-cycle schedule) the decay counts from the end of warmup
    instead: progress = (step - warmup_steps) / (decay_steps - warmup_steps), so the rate
    falls from the peak itself.

    Args:
        initial_learning_rate: the peak rate.
        decay_steps: the step at which the rate reaches `end_learning_rate`.
        warmup_steps: steps of linear warmup (0: none).
        end_learning_rate: the final rate.
        power: the polynomial power (1.0: linear).
        decay_from_warmup: decay from the end of warmup, not from step 0 (one-cycle).
    """

    def __init__(self, initial_learning_rate, decay_steps, warmup_steps=0,
                 end_learning_rate=0.0, power=1.0, decay_from_warmup=False):
        self.initial_learning_rate = initial_learning_rate
        self.decay_steps = decay_steps
        self.warmup_steps = warmup_steps
        self.end_learning_rate = end_learning_rate
        self.power = power
        self.decay_from_warmup = decay_from_warmup

    def __call__(self, step):
        """Returns the rate (float32 scalar) for a step (int or scalar tensor)."""
        step = ops.cast(step, "float32")
        start = float(self.warmup_steps) if self.decay_from_warmup else 0.0
        length = max(float(self.decay_steps) - start, 1.0)
        progress = ops.clip(step - start, 0.0, length) / length
        decayed = ((self.initial_learning_rate - self.end_learning_rate)
                   * ops.power(1.0 - progress, self.power) + self.end_learning_rate)
        if not self.warmup_steps:
            return decayed
        warmup = self.initial_learning_rate * step / float(self.warmup_steps)
        return ops.where(step < self.warmup_steps, warmup, decayed)

    def get_config(self):
        return {"initial_learning_rate": self.initial_learning_rate,
                "decay_steps": self.decay_steps, "warmup_steps": self.warmup_steps,
                "end_learning_rate": self.end_learning_rate, "power": self.power,
                "decay_from_warmup": self.decay_from_warmup}


def build_schedule(config: OptimizerConfig, train_steps: int, clock=None):
    """The learning-rate schedule of `config`; decay ends at `train_steps` unless set, and
    `warmup_fraction` (when set) counts its warmup in `train_steps`.

    With `clock` (a `time_budget.BudgetClock`) that step schedule is stretched over the time
    budget: it reads the fraction of the budget spent, times `train_steps`, as its step.
    """
    if clock is not None:
        return time_budget.BudgetSchedule(build_schedule(config, train_steps), train_steps, clock)
    warmup = config.warmup_steps
    if config.warmup_fraction is not None:
        warmup = int(config.warmup_fraction * train_steps)
    return WarmupPolynomialDecay(
        initial_learning_rate=config.learning_rate,
        decay_steps=config.decay_steps or train_steps, warmup_steps=warmup,
        end_learning_rate=config.end_learning_rate, power=config.power,
        decay_from_warmup=config.schedule == "one_cycle")


def excluded_from_weight_decay(variables, patterns) -> list:
    """The variables whose path matches one of `patterns` (regexes, case-insensitive)."""
    regex = re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE) if patterns else None
    return [v for v in variables if regex is not None and regex.search(v.path)]


def build_optimizer(config: OptimizerConfig, variables, *, train_steps: int,
                    mixed_precision: str | None = None,
                    clock=None) -> keras.optimizers.Optimizer:
    """Builds the optimizer and its slot variables (call under `strategy.scope()`).

    Variables are built here, before any checkpoint is restored, so that a restore fills the
    optimizer's moments instead of leaving them to be created at the first step.

    Args:
        config: the optimizer settings.
        variables: the model's trainable variables.
        train_steps: the run length; the decay ends there unless `config.decay_steps` is set.
        mixed_precision: None, "bfloat16" or "float16"; float16 wraps the optimizer in a
            dynamic `keras.optimizers.LossScaleOptimizer`.
        clock: a `time_budget.BudgetClock`: the schedule runs on the budget (None: on steps).

    Returns:
        A built optimizer that applies the gradients it is given as they are: the trainer sums
        them over replicas itself (see `_apply_gradients_as_given`).
    """
    schedule = build_schedule(config, train_steps, clock)
    # AdamW and Lamb require a float (0.0 disables decay); SGD takes None for "no decay".
    decay = float(config.weight_decay)
    if config.name == "adamw":
        optimizer = FusedAdamW(
            learning_rate=schedule, weight_decay=decay, beta_1=config.beta_1,
            beta_2=config.beta_2, epsilon=config.epsilon)
    elif config.name == "lamb":
        optimizer = keras.optimizers.Lamb(
            learning_rate=schedule, weight_decay=decay, beta_1=config.beta_1,
            beta_2=config.beta_2, epsilon=config.epsilon)
    else:
        optimizer = keras.optimizers.SGD(
            learning_rate=schedule, momentum=config.momentum, weight_decay=decay or None)
    optimizer.exclude_from_weight_decay(
        var_list=excluded_from_weight_decay(variables, config.weight_decay_exclusions))
    if mixed_precision == "float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    _apply_gradients_as_given(optimizer)
    optimizer.build(list(variables))
    return optimizer


def _apply_gradients_as_given(optimizer) -> None:
    """Stops Keras from summing gradients over replicas inside `apply()`.

    Keras' TensorFlow optimizers all-reduce the gradients they are given in a replica context.
    The trainer needs the summed gradient before that (its norm is clipped, checked for NaN and
    logged), so it sums them itself; a second sum would multiply them by the replica count.
    Keras has no public switch for this, so the (private, stable since Keras 3.0) hook is
    replaced on this instance only; the Mirrored-equals-one-device test guards it.
    """
    for opt in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        if opt is None:
            continue
        if not hasattr(opt, "_all_reduce_sum_gradients"):
            raise RuntimeError(f"this Keras ({keras.__version__}) optimizer has no "
                               "_all_reduce_sum_gradients hook; bert_trainer needs updating")
        opt._all_reduce_sum_gradients = list


def clip_by_global_norm(grads: list, norm, clip_norm: float | None) -> list:
    """Scales `grads` by clip_norm / max(norm, clip_norm) (unchanged when clip_norm is None).

    Args:
        grads: dense gradient tensors.
        norm: their global norm (float32 scalar), computed once by the caller.
        clip_norm: the maximum global norm.

    Returns:
        The clipped gradients; all NaN when `norm` is not finite (a float16 loss-scale overflow
        is then skipped by the LossScaleOptimizer).
    """
    if clip_norm is None:
        return grads
    factor = clip_factor(norm, clip_norm)
    return [g * tf.cast(factor, g.dtype) for g in grads]


def clip_factor(norm, clip_norm: float) -> tf.Tensor:
    """clip_norm / max(norm, clip_norm): the float32 factor that clips gradients of global norm
    `norm` to `clip_norm`; NaN when `norm` is not finite."""
    factor = clip_norm / tf.maximum(norm, clip_norm)
    # An overflowed norm must not turn into a silent zero update: poison the step instead.
    return tf.where(tf.math.is_finite(norm), factor, float("nan"))


def global_norm(grads: list) -> tf.Tensor:
    """The float32 global L2 norm of a list of gradient tensors."""
    return tf.linalg.global_norm([tf.cast(g, tf.float32) for g in grads])


def check_precision_runs(mixed_precision: str | None, strategy) -> None:
    """Refuses bfloat16 on CPU devices where TensorFlow's oneDNN has no bfloat16 matmul: the
    first one would abort the process (dnnl::error, SIGABRT) instead of failing in one line.

    Raises:
      UserError: naming the setting, why, and what to do.
    """
    if mixed_precision != "bfloat16":
        return
    try:
        devices = strategy.extended.worker_devices
    except RuntimeError:  # the default strategy: TensorFlow's default device
        devices = [d.name for kind in ("GPU", "TPU") for d in tf.config.list_logical_devices(kind)]
        devices = devices[:1] or ["CPU"]
    if not all("CPU" in device.upper() for device in devices):
        return  # GPUs and TPUs have their own bfloat16 kernels
    from bert_trainer import diagnostics  # noqa: PLC0415
    from bert_trainer.kernels import targets  # noqa: PLC0415

    problem = diagnostics.onednn_bfloat16_problem(targets.cpu_flags())
    if problem is not None:
        raise UserError(f"TrainerConfig.mixed_precision='bfloat16': {problem}, and its first "
                        "bfloat16 matmul would abort the process; train in float32 (the "
                        "default; bert-train doctor says what this CPU runs), or set "
                        "TF_ENABLE_ONEDNN_OPTS=0 to emulate bfloat16 (slow)")


@contextlib.contextmanager
def precision_policy(mixed_precision: str | None):
    """Sets Keras' global dtype policy while models are built, then restores the previous one.

    Layers capture the policy when they are created, so the global setting is needed only for
    `build_model` and must not leak into whatever runs next.

    Args:
        mixed_precision: None (float32), "bfloat16" or "float16".
    """
    if mixed_precision not in PRECISIONS:
        raise UserError(f"mixed_precision={mixed_precision!r} is unknown; choose None, "
                        "'bfloat16' or 'float16'")
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(PRECISIONS[mixed_precision])
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)
