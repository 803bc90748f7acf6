"""The training loop: one `Trainer` runs any `Task` on any `tf.distribute` strategy.

It reads top to bottom: build (model, optimizer, metrics) -> restore or warm start -> input
-> loop (a tf.function running `steps_per_loop` steps) -> summaries, checkpoints, evaluation.

The per-step graph (forward/backward, accumulation, all-reduce, NaN guard, clipping, apply)
is `train_step.TrainStep`; this module is the host side.

Exact resume: a checkpoint holds the model, the optimizer, the step and the dropout seed
states; the input position is restored by skipping the batches already consumed
(`step * accumulation_steps` per replica) in a freshly built, deterministically ordered
training dataset. `tf.data` iterators of distributed datasets cannot be checkpointed, and
skipping also replays the input pipeline's own random ops identically. The cost: a restart
re-reads the skipped part of the input once (no model compute).
"""

import dataclasses
import os
import time

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from bert_trainer.errors import UserError
from bert_trainer.tasks.base import Task
from bert_trainer.training import checkpointing, determinism, optimization, strategies, summaries
from bert_trainer.training.train_step import TrainStep, checked_losses, metric_results


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
        train_steps: optimizer steps in the whole run (a restart continues up to it).
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
        jit_compile: compile the forward/backward pass with XLA.
        mixed_precision: None (float32), "bfloat16" or "float16" (with loss scaling).
        seed: seeds weights, dropout and data order.
        deterministic_ops: make every op deterministic (process-wide; slower on GPU).
        init_checkpoint: warm-start checkpoint (prefix or directory), used on fresh runs only.
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

    def __post_init__(self):
        for field in ("train_steps", "steps_per_loop", "checkpoint_interval", "max_checkpoints",
                      "summary_interval", "accumulation_steps"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise UserError(f"{field}={value!r} must be a positive integer")
        if self.eval_interval is not None and self.eval_interval <= 0:
            raise UserError(f"eval_interval={self.eval_interval} must be > 0 (or None: at the end)")
        if self.eval_steps is not None and self.eval_steps < 0:
            raise UserError(f"eval_steps={self.eval_steps} must be >= 0 (or None: the whole split)")
        if self.best_metric_mode not in ("max", "min"):
            raise UserError(f"best_metric_mode={self.best_metric_mode!r} must be 'max' or 'min'")
        if self.mixed_precision not in optimization.PRECISIONS:
            raise UserError(f"mixed_precision={self.mixed_precision!r} must be None, "
                            "'bfloat16' or 'float16'")
        for field in ("best_metric", "eval_interval"):
            if getattr(self, field) and self.eval_steps == 0:
                raise UserError(f"{field}={getattr(self, field)!r} needs evaluation but "
                                "eval_steps=0 turns it off; drop one of them")


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What `train_and_evaluate` ends with: the step and the last train/eval metrics."""

    step: int
    train: dict[str, float]
    eval: dict[str, float]


class Trainer:
    """Trains and evaluates a `Task` with a custom distributed loop.

    Building the trainer builds the model and optimizer, then resumes from the latest
    checkpoint in `model_dir` (automatically, optimizer state and step included) or, on a fresh
    run, warm starts from `config.init_checkpoint`.

    Args:
        task: what to train.
        model_dir: where checkpoints, summaries and the operative config go.
        config: the loop settings.
        optimizer: the optimizer settings.
        strategy: a `tf.distribute` strategy (default: the current/default one).
    """

    def __init__(self, task: Task, model_dir: str, *, config: TrainerConfig,
                 optimizer: optimization.OptimizerConfig | None = None,
                 strategy: tf.distribute.Strategy | None = None):
        self.task = task
        self.model_dir = model_dir
        self.config = config
        self.optimizer_config = optimizer or optimization.OptimizerConfig()
        self.strategy = strategy or tf.distribute.get_strategy()
        self.is_chief = strategies.is_chief(self.strategy)
        _prepare_model_dir(model_dir)
        self._write_dir = strategies.write_dir(model_dir, self.strategy)
        determinism.set_seed(config.seed)
        if config.deterministic_ops:
            determinism.enable_op_determinism()
        self._build()
        self._restore_or_initialize()
        self._train_writer = summaries.SummaryWriter(os.path.join(model_dir, "train"),
                                                     enabled=self.is_chief)
        self._eval_writer = summaries.SummaryWriter(os.path.join(model_dir, "eval"),
                                                    enabled=self.is_chief)
        self._eval_step = tf.function(self._eval_step_body, reduce_retracing=True)

    # ----------------------------------------------------------------------------- building

    def _build(self) -> None:
        cfg, task = self.config, self.task
        with optimization.precision_policy(cfg.mixed_precision), self.strategy.scope():
            self.model = task.build_model()
            self.optimizer = optimization.build_optimizer(
                self.optimizer_config, self.model.trainable_variables,
                train_steps=cfg.train_steps, mixed_precision=cfg.mixed_precision)
            self._step = TrainStep(task, self.model, self.optimizer, self.strategy,
                                   accumulation_steps=cfg.accumulation_steps,
                                   clip_norm=self.optimizer_config.clip_norm,
                                   jit_compile=cfg.jit_compile)
            self._eval_metrics = list(task.build_metrics(training=False))
            self._eval_loss_means = {n: keras.metrics.Mean(name=n) for n in task.loss_names}
        self.global_step = self._step.global_step
        self._loss_means = self._step.loss_means
        self._schedule = optimization.build_schedule(self.optimizer_config, cfg.train_steps)
        self._examples_done = 0.0  # examples counted before the last metric reset (host side)
        # Keras keeps dropout RNG state outside the tracked object graph; checkpoint it too so
        # that a resumed run draws the same dropout masks as an uninterrupted one.
        seed_states = [v for v in self.model.non_trainable_variables
                       if v.path.endswith("seed_generator_state")]
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                                              step=self.global_step, seed_states=seed_states)
        self._manager = tf.train.CheckpointManager(
            self.checkpoint, self._write_dir, max_to_keep=cfg.max_checkpoints,
            checkpoint_name="ckpt")
        self._best = None
        if cfg.best_metric:
            self._best = checkpointing.BestCheckpointKeeper(
                self.checkpoint, os.path.join(self._write_dir, checkpointing.BEST_DIR),
                cfg.best_metric, cfg.best_metric_mode,
                previous_dir=os.path.join(self.model_dir, checkpointing.BEST_DIR))

    def _restore_or_initialize(self) -> None:
        latest = checkpointing.latest_checkpoint(self.model_dir)
        if latest:
            checkpointing.restore(self.checkpoint, latest, self.model_dir)
            logging.info("Resuming at step %d from %s%s", int(self.global_step.numpy()), latest,
                         " (init_checkpoint ignored)" if self.config.init_checkpoint else "")
        elif self.config.init_checkpoint:
            path = checkpointing.resolve_checkpoint(self.config.init_checkpoint)
            self.task.initialize(self.model, path)

    # ------------------------------------------------------------------------------ input

    def _train_dataset(self, start_step: int):
        """The distributed training input, positioned after the batches already trained on."""
        consumed = start_step * self.config.accumulation_steps  # batches per replica

        def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
            dataset = self.task.build_inputs(self.task.train_split, ctx, is_training=True)
            # A pipeline feeds num_replicas / num_pipelines replicas, one batch each per step.
            per_pipeline = ctx.num_replicas_in_sync // ctx.num_input_pipelines
            return dataset.skip(consumed * per_pipeline) if consumed else dataset

        if consumed:
            logging.info("Skipping the %d batches per replica already trained on", consumed)
        return self.strategy.distribute_datasets_from_function(dataset_fn)

    # ------------------------------------------------------------------------ the host loop

    def train_and_evaluate(self) -> RunResult:
        """Trains up to `config.train_steps`, checkpointing, logging and evaluating on the way.

        Returns:
            The final step and the last training and evaluation metrics.

        Raises:
            NonFiniteError: the loss or gradient norm became NaN/Inf (nothing was applied or
                saved for that step).
        """
        cfg = self.config
        step = int(self.global_step.numpy())
        iterator = self.train_iterator()
        self._write_run_info(step)
        progress = summaries.ProgressLogger(cfg.train_steps, step)
        interval = (step, time.perf_counter())
        train_metrics, eval_metrics = {}, {}
        saved_step, evaluated_step = step, None
        while step < cfg.train_steps:
            self.run_steps(iterator, self._next_stop(step) - step)
            step = int(self.global_step.numpy())
            progress.update(step, float(self._loss_means["loss"].result()),
                            self._examples_done + self._step.counts()[0])
            if step % cfg.summary_interval == 0 or step == cfg.train_steps:
                train_metrics = self._write_train_summaries(step, interval)
                interval = (step, time.perf_counter())
            if step % cfg.checkpoint_interval == 0:
                self._save(step)
                saved_step = step
            if cfg.eval_interval and step % cfg.eval_interval == 0 and cfg.eval_steps != 0:
                eval_metrics, evaluated_step = self._evaluate_and_keep_best(step), step
        if saved_step != step:
            self._save(step)
        if cfg.eval_steps != 0 and evaluated_step != step:
            eval_metrics = self._evaluate_and_keep_best(step)
        self._train_writer.flush()
        strategies.remove_write_dir(self._write_dir, self.model_dir)
        return RunResult(step=step, train=train_metrics, eval=eval_metrics)

    def train_iterator(self):
        """The distributed training input, positioned after the batches already trained on."""
        return iter(self._train_dataset(int(self.global_step.numpy())))

    def run_steps(self, iterator, num_steps: int) -> None:
        """Runs `num_steps` optimizer steps in one compiled call: no checkpoint, summary or eval.

        `train_and_evaluate` is built on this; benchmarks call it directly.

        Args:
            iterator: from `train_iterator()`.
            num_steps: steps to run.

        Raises:
            NonFiniteError: a step's loss or gradient norm was NaN/Inf (it was not applied).
        """
        try:
            bad_step = self._step.run(iterator, num_steps)
        except tf.errors.OutOfRangeError:
            raise UserError(f"task {self.task.name!r}: the {self.task.train_split!r} input ended "
                            f"near step {int(self.global_step.numpy())}; build_inputs("
                            "is_training=True) must repeat forever") from None
        if bad_step >= 0:
            self._train_writer.flush()
            raise NonFiniteError(bad_step, tf.train.latest_checkpoint(self.model_dir))

    def _next_stop(self, step: int) -> int:
        """The next step at which the host has something to do (loops end there)."""
        cfg = self.config
        stops = [cfg.train_steps, step + cfg.steps_per_loop]
        for every in (cfg.summary_interval, cfg.checkpoint_interval, cfg.eval_interval):
            if every:
                stops.append((step // every + 1) * every)
        return min(stops)

    def _write_run_info(self, step: int) -> None:
        if not self.is_chief:
            return
        self.task.write_model_info(self.model_dir)
        # Everything gin configures (task, model, optimizer, input) has been built by now.
        summaries.write_operative_config(self.model_dir, self._train_writer, step)

    def _write_train_summaries(self, step: int, interval: tuple[int, float]) -> dict[str, float]:
        start_step, start_time = interval
        elapsed = max(time.perf_counter() - start_time, 1e-9)
        values = self._step.results()
        # The rate of the last applied update (the optimizer's iteration has moved past it; with
        # float16, loss-scale skips do not advance it).
        inner = getattr(self.optimizer, "inner_optimizer", self.optimizer)
        values["learning_rate"] = float(self._schedule(max(int(inner.iterations.numpy()) - 1, 0)))
        examples, tokens = self._step.counts()
        values["steps_per_second"] = (step - start_step) / elapsed
        values["examples_per_second"] = examples / elapsed
        if tokens is not None:
            values["tokens_per_second"] = tokens / elapsed
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            values["loss_scale"] = float(self.optimizer.dynamic_scale.numpy())
        self._train_writer.scalars(values, step)
        self._train_writer.flush()
        self._examples_done += examples
        self._step.reset_metrics()
        return values

    def _save(self, step: int) -> None:
        path = self._manager.save(checkpoint_number=step)
        logging.info("Saved %s", path)

    # ------------------------------------------------------------------------- evaluation

    def _eval_step_body(self, batch):
        outputs = self.strategy.run(self._eval_replica, args=(batch,))
        return {k: self.strategy.gather(v, axis=0) for k, v in outputs.items()}

    def _eval_replica(self, features):
        outputs = self.model(self.task.model_inputs(features), training=False)
        losses = checked_losses(self.task, self.task.build_losses(features, outputs))
        for n, per_example in losses.items():
            self._eval_loss_means[n].update_state(per_example)
        self.task.update_metrics(self._eval_metrics, features, outputs)
        return dict(self.task.eval_step_outputs(features, outputs))

    def evaluate(self) -> dict[str, float]:
        """Evaluates the current weights on the task's eval split (`config.eval_steps` batches).

        Returns:
            {name: value}: the mean per-example losses, the streaming metrics and the task's
            host-side `aggregate_eval` metrics. Also written to `model_dir/eval`.
        """
        for metric in [*self._eval_loss_means.values(), *self._eval_metrics]:
            metric.reset_state()
        dataset = self.strategy.distribute_datasets_from_function(
            lambda ctx: self.task.build_inputs(self.task.eval_split, ctx, is_training=False))
        gathered: dict[str, list[np.ndarray]] = {}
        limit = self.config.eval_steps or None
        for i, batch in enumerate(dataset):
            if limit is not None and i >= limit:
                break
            for name, value in self._eval_step(batch).items():
                gathered.setdefault(name, []).append(value.numpy())
        results = {n: float(m.result()) for n, m in self._eval_loss_means.items()}
        results.update(metric_results(self._eval_metrics))
        arrays = {name: np.concatenate(parts) for name, parts in gathered.items()}
        results.update({k: float(v) for k, v in self.task.aggregate_eval(arrays).items()})
        step = int(self.global_step.numpy())
        self._eval_writer.scalars(results, step)
        self._eval_writer.flush()
        logging.info("eval at step %d: %s", step,
                     ", ".join(f"{k}={v:.4f}" for k, v in sorted(results.items())))
        return results

    def _evaluate_and_keep_best(self, step: int) -> dict[str, float]:
        results = self.evaluate()
        if self._best is not None:
            self._best.update(results, step)
        return results


def _prepare_model_dir(model_dir: str) -> None:
    if tf.io.gfile.exists(model_dir) and not tf.io.gfile.isdir(model_dir):
        raise UserError(f"--model_dir={model_dir} is a file; give a directory")
    try:
        tf.io.gfile.makedirs(model_dir)
    except tf.errors.OpError as e:
        raise UserError(f"--model_dir={model_dir} cannot be created ({e.message})") from None
    if "://" not in model_dir and not os.access(model_dir, os.W_OK | os.X_OK):
        raise UserError(f"--model_dir={model_dir} is not writable; choose another directory")
