"""The trainer's settings (`TrainerConfig`), its result and its NaN/Inf error.

Separate from trainer.py so that configs can be built and validated (gin, the CLI) without
building anything; `bert_trainer.training.trainer` re-exports all three.
"""

import dataclasses

from bert_trainer import durations
from bert_trainer.errors import UserError, require_positive_ints
from bert_trainer.training import optimization

# No run means more steps than this: BERT pretrained for 10^6; at 1 ms a step, 10^9 is 11 days.
MAX_TRAIN_STEPS = 10**9


class NonFiniteError(RuntimeError):
    """The loss or the gradient norm became NaN/Inf; the run stopped before applying it.

    Attributes:
        step: the step whose update was refused (the last applied step is step - 1).
        checkpoint: the last good checkpoint (None when none was written yet).
    """

    def __init__(self, step: int, checkpoint: str | None):
        self.step = step
        self.checkpoint = checkpoint
        super().__init__(
            f"the loss or gradient norm became NaN/Inf at step {step}; that update was not "
            f"applied and the last good checkpoint ({checkpoint or 'none yet'}) is intact. "
            "Lower the learning rate, set a clip norm, or check the input data.")


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """How long and how to train, and when to checkpoint, log and evaluate.

    Attributes:
        train_steps: optimizer steps in the whole run (a restart continues up to it). With a
            `time_budget` it is the length the step schedule was planned for, stretched over
            the budget (`time_budget.py`), and does not stop the run.
        time_budget: train for this much wall-clock time instead of `train_steps`: seconds,
            or a string such as "90s", "20m", "1.5h" (stored as seconds). The learning-rate
            schedule runs on the fraction of the budget spent; the run stops, and
            checkpoints, when it is spent; a resumed run continues it. None: off.
        steps_per_loop: steps per call of the compiled loop (the host syncs between calls).
        checkpoint_interval: save every this many steps (and at the end).
        max_checkpoints: how many recent checkpoints to keep.
        summary_interval: write training summaries every this many steps.
        eval_interval: evaluate every this many steps; None: only at the end.
        eval_steps: eval batches per evaluation; None: the whole eval split; 0: no evaluation
            during training (an explicit `evaluate()` then reads the whole split).
        best_metric: eval metric whose best value's checkpoint is kept in `model_dir/best`.
        best_metric_mode: "max" or "min".
        accumulation_steps: micro-batches per optimizer step (the effective batch is this
            times the task's global batch).
        fit_batch: keep the effective batch per optimizer step but compute each task batch
            in the largest per-replica micro-batches that fit memory, accumulating gradients
            (`batch_fit.py`: decided once, cached in model_dir/batch_plan.json).
        micro_batch_size: force this per-replica micro-batch (it must divide the per-replica
            batch); implies batch fitting without the probe.
        jit_compile: compile the forward/backward pass with XLA.
        mixed_precision: None (float32), "bfloat16" or "float16" (with loss scaling).
        seed: seeds weights, dropout and data order.
        deterministic_ops: make every op deterministic (process-wide; slower on GPU).
        init_checkpoint: warm-start checkpoint, used on fresh runs only: a bert-train, Hugging
            Face or Google directory, or a TF checkpoint prefix (`Task.initialize` loads it).
        nonfinite_policy: on a NaN/Inf loss or gradient norm, "stop" (raise NonFiniteError)
            or "rollback" (restore the last good checkpoint and skip the step's batches).
        max_rollbacks: how many rollbacks a run may make (the checkpointed count of skipped
            steps included) before it stops as with "stop".
        handle_signals: stop cleanly on SIGTERM/SIGINT (checkpoint, then raise `Preempted`).
        peak_flops: one device's peak FLOP/s in the run's precision, for the MFU summary (GPU
            and TPU users give the datasheet number, e.g. 989e12 for an H100's dense bf16);
            None: measured with a short `tf.matmul` at the start of the run.
    """

    train_steps: int
    steps_per_loop: int = 100
    checkpoint_interval: int = 1000
    max_checkpoints: int = 5
    summary_interval: int = 100
    eval_interval: int | None = None
    eval_steps: int | None = None
    best_metric: str | None = None
    best_metric_mode: str = "max"
    accumulation_steps: int = 1
    jit_compile: bool = False
    mixed_precision: str | None = None
    seed: int = 42
    deterministic_ops: bool = False
    init_checkpoint: str | None = None
    nonfinite_policy: str = "stop"
    max_rollbacks: int = 3
    handle_signals: bool = True
    peak_flops: float | None = None
    fit_batch: bool = False
    micro_batch_size: int | None = None
    time_budget: float | str | None = None

    def __post_init__(self):
        if self.time_budget is not None:  # frozen: the normalized value is set once, here
            object.__setattr__(self, "time_budget",
                               durations.parse_duration(self.time_budget, "time_budget"))
        require_positive_ints(self, ("train_steps", "steps_per_loop", "checkpoint_interval",
                                     "max_checkpoints", "summary_interval", "accumulation_steps"))
        if self.train_steps > MAX_TRAIN_STEPS:  # 10^12 trained with a 10^11-step warmup
            raise UserError(f"TrainerConfig: train_steps={self.train_steps} is over 10^9, 1,000 "
                            "times BERT's 10^6 steps (11 days even at 1 ms a step); give the "
                            "steps you mean (a run can be stopped, and resumed, at any step)")
        if self.eval_interval is not None and self.eval_interval <= 0:
            raise UserError(f"eval_interval={self.eval_interval} must be > 0 (or None: at the end)")
        if self.eval_steps is not None and self.eval_steps < 0:
            raise UserError(f"eval_steps={self.eval_steps} must be >= 0 (or None: the whole split)")
        if self.best_metric_mode not in ("max", "min"):
            raise UserError(f"best_metric_mode={self.best_metric_mode!r} must be 'max' or 'min'")
        if self.nonfinite_policy not in ("stop", "rollback"):
            raise UserError(f"nonfinite_policy={self.nonfinite_policy!r} must be 'stop' or "
                            "'rollback'")
        if not isinstance(self.max_rollbacks, int) or self.max_rollbacks < 0:
            raise UserError(f"max_rollbacks={self.max_rollbacks!r} must be an integer >= 0")
        if self.peak_flops is not None and not (isinstance(self.peak_flops, (int, float))
                                                and self.peak_flops > 0):
            raise UserError(f"peak_flops={self.peak_flops!r} must be a number > 0 (FLOP/s, e.g. "
                            "989e12), or None to measure it")
        if self.mixed_precision not in optimization.PRECISIONS:
            raise UserError(f"mixed_precision={self.mixed_precision!r} must be None, "
                            "'bfloat16' or 'float16'")
        if self.micro_batch_size is not None:
            require_positive_ints(self, ("micro_batch_size",))
        if not isinstance(self.fit_batch, bool):
            raise UserError(f"fit_batch={self.fit_batch!r} must be True or False")
        for field in ("best_metric", "eval_interval"):
            if getattr(self, field) and self.eval_steps == 0:
                raise UserError(f"{field}={getattr(self, field)!r} needs evaluation but "
                                "eval_steps=0 turns it off; drop one of them")


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What `train_and_evaluate` ends with: the step and the last train/eval metrics, and with
    a time budget what it bought (`BudgetClock.record`: seconds, elapsed_seconds, steps)."""

    step: int
    train: dict[str, float]
    eval: dict[str, float]
    time_budget: dict | None = None
