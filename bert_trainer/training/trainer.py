"""The training loop: one `Trainer` runs any `Task` on any `tf.distribute` strategy.

It reads top to bottom: build (model, optimizer, metrics) -> restore or warm start -> input
-> loop (a tf.function running `steps_per_loop` steps) -> summaries, checkpoints, evaluation.

The per-step graph (forward/backward, accumulation, all-reduce, NaN guard, clipping, apply)
is `train_step.TrainStep`; this module is the host side. With batch fitting
(`TrainerConfig.fit_batch` / `micro_batch_size`, `batch_fit.py`) each task batch is split
into the micro-batches of the run's `BatchPlan` and accumulated into one optimizer step.

Exact resume: a checkpoint holds the model, the optimizer, the step and the dropout seed
states; the input position is restored by skipping the batches already consumed
(`step * accumulation_steps` per replica, counted in task batches before any split into
micro-batches, so a fitted run resumes exactly whatever its micro-batch; in examples across a
change of batch size: `checkpoints/run_record.py`) in a freshly built,
deterministically ordered training dataset. `tf.data` iterators of distributed datasets
cannot be checkpointed, and skipping also replays the input pipeline's own random ops
identically. The cost: a restart re-reads the skipped part of the input once (no model
compute).

Robustness:
* Stop signals (SIGTERM, SIGINT; `preemption.py`): the loop ends after the current step, a
  checkpoint is written at that step, TensorBoard is flushed and `Preempted` is raised.
* Checkpoint integrity (`checkpoints.resume.restore_latest`): a missing, truncated or corrupted
  latest checkpoint is reported in one log line and the previous one is restored instead.
* NaN/Inf (`nonfinite_policy`): "stop" raises `NonFiniteError`; "rollback" restores the last
  good checkpoint and drops the refused step's input (`rollback.py` has the protocol).
* One run per model_dir (`run_lock.py`), and a resume as another task refused before the
  restore (`Task.check_resume`).
* A full disk or a refused write (`checkpoints/storage.py`): the partial files of that write
  are removed and one `UserError` names the path and the last good checkpoint.
* An input file deleted or damaged mid-run (`NotFoundError`, `DataLossError` from the input):
  the steps done are checkpointed, then the error propagates (the command names the file).

Telemetry (`throughput.py`): besides losses and metrics, TensorBoard gets examples/s,
tokens/s, the padding fraction, model GFLOP/s and MFU, all counted inside the compiled step
(the FLOPs where the task can count them: `Task.flops_counter`).
"""

import contextlib
import dataclasses
import os
import time

import keras
import tensorflow as tf
from absl import logging

from bert_trainer import outputs
from bert_trainer.checkpoints import best, resume, run_record, storage
from bert_trainer.checkpoints import model_dir as model_dir_lib
from bert_trainer.errors import UserError
from bert_trainer.tasks.base import Task
from bert_trainer.training import (
    batch_fit,
    determinism,
    optimization,
    preemption,
    rollback,
    run_lock,
    strategies,
    summaries,
    throughput,
    time_budget,
)
from bert_trainer.training.config import NonFiniteError, RunResult, TrainerConfig
from bert_trainer.training.evaluation import Evaluator
from bert_trainer.training.preemption import Preempted
from bert_trainer.training.train_step import TrainStep

__all__ = ["NonFiniteError", "Preempted", "RunResult", "Trainer", "TrainerConfig"]


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
        derived_bindings: settings the command derived and passed in `config`/`optimizer`
            rather than through gin (e.g. "TrainerConfig.train_steps = 120" from epochs),
            as gin binding lines: operative_config.gin ends with them, so it repeats the run.
    """

    def __init__(self, task: Task, model_dir: str, *, config: TrainerConfig,
                 optimizer: optimization.OptimizerConfig | None = None,
                 strategy: tf.distribute.Strategy | None = None,
                 derived_bindings: tuple[str, ...] = ()):
        self.task = task
        self.derived_bindings = tuple(derived_bindings)
        self.model_dir = model_dir
        self.config = config
        self.optimizer_config = optimizer or optimization.OptimizerConfig()
        self.strategy = strategy or tf.distribute.get_strategy()
        self.is_chief = strategies.is_chief(self.strategy)
        resume.check_model_dir(model_dir)
        if config.time_budget is not None:  # not a run of steps (the restore would fail)
            time_budget.check_resume(model_dir, config.time_budget)
        self._write_dir = strategies.write_dir(model_dir, self.strategy)
        determinism.set_seed(config.seed)
        if config.deterministic_ops:
            determinism.enable_op_determinism()
        self._build()
        self.task.check_resume(model_dir)  # before a restore: a resume as another task refused
        self._restore_or_initialize()
        self.restored = self._saved[1] if self._saved else None  # the checkpoint resumed from
        self._run_record = None  # checked when training starts (an evaluation only reads)
        self._train_writer = summaries.SummaryWriter(os.path.join(model_dir, "train"),
                                                     enabled=self.is_chief)
        self._eval_writer = summaries.SummaryWriter(os.path.join(model_dir, "eval"),
                                                    enabled=self.is_chief)

    # ----------------------------------------------------------------------------- building

    def _build(self) -> None:
        cfg, task = self.config, self.task
        # Outside the strategy scope: a plain variable that a signal-watching thread can set.
        self._stop_flag = tf.Variable(False, trainable=False, name="stop_requested")
        # Host-set variables too, read by the schedule.
        self._clock = time_budget.clock_for(cfg.time_budget, self.strategy)
        optimization.check_precision_runs(cfg.mixed_precision, self.strategy)
        with optimization.precision_policy(cfg.mixed_precision), self.strategy.scope():
            self.model = task.build_model()
            self.optimizer = optimization.build_optimizer(
                self.optimizer_config, self.model.trainable_variables,
                train_steps=cfg.train_steps, mixed_precision=cfg.mixed_precision,
                clock=self._clock)
            self.batch_plan = self._plan_batch()
            plan = self.batch_plan
            # Input batches per replica per optimizer step.
            accumulation = plan.accumulation_steps if plan else cfg.accumulation_steps
            self._step = TrainStep(task, self.model, self.optimizer, self.strategy,
                                   accumulation_steps=accumulation,
                                   global_batch=plan.global_batch if plan else None,
                                   clip_norm=self.optimizer_config.clip_norm,
                                   jit_compile=cfg.jit_compile, stop_flag=self._stop_flag)
            self._rollbacks = rollback.Rollbacks(cfg.nonfinite_policy, cfg.max_rollbacks,
                                                 accumulation)
            self._evaluator = Evaluator(task, self.model, self.strategy,
                                        fused_kernels=self._step.fused_kernels)
        self.global_step = self._step.global_step
        # Steps whose batches were dropped by NaN rollbacks (see rollback.py).
        self.skipped_steps = self._rollbacks.skipped_steps
        self._schedule = optimization.build_schedule(self.optimizer_config, cfg.train_steps,
                                                     self._clock)
        self._examples_done = 0.0  # examples counted before the last metric reset (host side)
        # Keras keeps dropout RNG state outside the tracked object graph; checkpoint it too so
        # that a resumed run draws the same dropout masks as an uninterrupted one.
        seed_states = [v for v in self.model.non_trainable_variables
                       if v.path.endswith("seed_generator_state")]
        # A budget run's elapsed seconds: a resume continues the budget.
        budget = {"time_budget_elapsed": self._clock.elapsed_variable} if self._clock else {}
        self.checkpoint = tf.train.Checkpoint(model=resume.model_trackable(self.model),
                                              optimizer=self.optimizer,
                                              step=self.global_step, seed_states=seed_states,
                                              skipped_steps=self.skipped_steps, **budget)
        self._manager = tf.train.CheckpointManager(
            self.checkpoint, self._write_dir, max_to_keep=cfg.max_checkpoints,
            checkpoint_name="ckpt")
        self._saved: tuple[int, str] | None = None  # (step, path) of the last save
        self._peak_flops: float | None = None  # all replicas, measured at the first run
        self._best = None
        if cfg.best_metric:
            self._best = best.BestCheckpointKeeper(
                self.checkpoint, os.path.join(self._write_dir, best.BEST_DIR),
                cfg.best_metric, cfg.best_metric_mode,
                previous_dir=os.path.join(self.model_dir, best.BEST_DIR))

    def _plan_batch(self) -> batch_fit.BatchPlan | None:
        """The batch plan when batch fitting is on (None: the task's batch is the input's)."""
        cfg = self.config
        if not cfg.fit_batch and cfg.micro_batch_size is None:
            return None
        plan, self._plan_key = batch_fit.plan_batch(
            self.task, self.model, self.strategy, self.model_dir,
            task_batch=self.task.global_batch_size(True),
            accumulation_steps=cfg.accumulation_steps, micro_batch=cfg.micro_batch_size,
            seq_length=getattr(getattr(self.task, "config", None), "seq_length", None),
            mixed_precision=cfg.mixed_precision, jit_compile=cfg.jit_compile)
        return plan

    def _restore_or_initialize(self) -> None:
        latest = resume.restore_latest(self.checkpoint, self.model_dir)
        if latest:
            self._saved = (int(self.global_step.numpy()), latest)
            logging.info("Resuming at step %d from %s%s", int(self.global_step.numpy()), latest,
                         " (init_checkpoint ignored)" if self.config.init_checkpoint else "")
        elif self.config.init_checkpoint:
            # The task resolves the path (any format) or reuses the checkpoint it was built from.
            self.task.initialize(self.model, self.config.init_checkpoint)

    # ------------------------------------------------------------------------------ input

    def _train_dataset(self, start_step: int, inputs=None):
        """The distributed training input, positioned after the batches already trained on;
        `inputs(input_context)` replaces the task's `build_inputs` (see `train_iterator`)."""
        # Task batches per replica trained on or dropped by rollbacks.
        consumed = run_record.batches_before(self.trained_with(),
                                             self._rollbacks.consumed_steps(start_step),
                                             self.task.global_batch_size(True))
        plan = self.batch_plan

        def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
            dataset = (inputs(ctx) if inputs is not None else
                       self.task.build_inputs(self.task.train_split, ctx, is_training=True))
            # A pipeline feeds num_replicas / num_pipelines replicas, one batch each per step.
            per_pipeline = ctx.num_replicas_in_sync // ctx.num_input_pipelines
            if consumed:
                dataset = dataset.skip(consumed * per_pipeline)
            if plan is not None and plan.accumulation_steps > 1:
                dataset = batch_fit.split_batches(dataset, plan.micro_batch)
            return dataset

        if consumed:
            logging.info("Skipping the %d batches per replica already trained on", consumed)
        return self.strategy.distribute_datasets_from_function(dataset_fn)

    def trained_with(self) -> dict:
        """What the run trains with (`checkpoints/run_record.py`), checked against what the
        resumed run recorded the first time it is asked for (before training writes anything).

        Raises:
            UserError: the resume changes a recorded setting.
        """
        if self._run_record is None:
            step = int(self.global_step.numpy())
            self._run_record = run_record.resume(
                self.model_dir, run_record.settings(
                    self.optimizer_config, getattr(self.task, "config", None),
                    self.derived_bindings),
                task_batch=self.task.global_batch_size(True),
                accumulation_steps=self.config.accumulation_steps,
                restored_step=step if self.restored else None,
                consumed_steps=self._rollbacks.consumed_steps(step))
        return self._run_record

    # ------------------------------------------------------------------------ the host loop

    def train_and_evaluate(self) -> RunResult:
        """Trains up to `config.train_steps`, checkpointing, logging and evaluating on the way.

        Returns:
            The final step and the last training and evaluation metrics.

        Raises:
            NonFiniteError: the loss or gradient norm became NaN/Inf (nothing was applied or
                saved for that step) and the policy is "stop" or the rollbacks are used up.
            Preempted: a stop signal came; a checkpoint was written at the step reached.
        """
        # The model_dir's run lock (chief only; a command holds it already, from its start).
        with run_lock.hold(self.model_dir, f"a {self.task.name!r} training run",
                           enabled=self.is_chief):
            return self._train_and_evaluate()

    def _train_and_evaluate(self) -> RunResult:
        cfg = self.config
        # A run of steps does not resume a budget run (an evaluation may read one: checked here).
        time_budget.check_resume(self.model_dir, cfg.time_budget)
        loop = _LoopState(step=int(self.global_step.numpy()))
        # The input first: a bad input found while building it fails before anything is written.
        iterator = self.train_iterator()
        self._write_run_info(loop.step)
        self._stop_flag.assign(False)
        self._rollbacks.start()
        if self._peak_flops is None and self._step.counts_flops:  # once per trainer, for MFU
            self._peak_flops = throughput.peak_flops(self.strategy, cfg.peak_flops,
                                                     cfg.mixed_precision)
            with self._storage("TensorBoard summaries", self._train_writer.directory):
                self._train_writer.scalars({"peak_gflops": self._peak_flops / 1e9}, loop.step)
        if self._rollbacks.enabled and self._saved is None:
            self._save(loop.step)  # something to roll back to
        start_step = loop.step
        if self._clock is not None:
            self._clock.start(cfg.train_steps)
        try:
            with preemption.watch(self.strategy, self._stop_flag, self._save_published,
                                  self._write_dir, enabled=cfg.handle_signals) as (signals,
                                                                                   cluster):
                self._loop(loop, iterator, signals, cluster)
            self._save(loop.step)
            budget = self._record_budget(loop.step, start_step)
            if cfg.eval_steps != 0 and loop.evaluated_step != loop.step:
                loop.eval = self._evaluate_and_keep_best(loop.step)
        finally:
            # A flush that fails (a full disk) must not hide the error that ended the loop.
            with contextlib.suppress(*storage.WRITE_ERRORS):
                self._train_writer.flush()
            strategies.remove_write_dir(self._write_dir, self.model_dir)
        return RunResult(step=loop.step, train=loop.train, eval=loop.eval, time_budget=budget)

    def _record_budget(self, step: int, start_step: int) -> dict | None:
        """A budget run's record (the budget, the time spent, the steps it bought), written to
        bert_train.json as "time_budget" and logged; None without a budget."""
        if self._clock is None:
            return None
        record = self._clock.finish(step, start_step)
        if self.is_chief:
            with self._storage("the model info (bert_train.json)", self.model_dir):
                model_dir_lib.update_model_info(self.model_dir, time_budget=record)
        return record

    def _loop(self, loop: "_LoopState", iterator, signals, cluster) -> None:
        """The loop of `train_and_evaluate`: runs steps until `train_steps` or a stop."""
        cfg, clock = self.config, self._clock
        progress = summaries.ProgressLogger(cfg.train_steps, loop.step, clock)
        interval = (loop.step, time.perf_counter())
        while (loop.step < cfg.train_steps) if clock is None else not clock.spent():
            if self._rollbacks.skip_at == loop.step:
                self._rollbacks.skip(iterator, loop.step)
                self._saved = None  # a checkpoint at this step may exist, without the skip
                self._save(loop.step)
            steps = self._next_stop(loop.step) - loop.step
            if clock is not None:  # as many steps as the time left buys, the rate's fraction
                steps = clock.plan_loop(loop.step, self._iterations(), steps)
            try:
                self.run_steps(iterator, steps)
            except (tf.errors.NotFoundError, tf.errors.DataLossError):
                # An input file deleted or damaged mid-run: keep the steps done, then report.
                logging.warning("The training input failed after step %d; saved %s",
                                int(self.global_step.numpy()),
                                self._save(int(self.global_step.numpy())))
                raise
            except NonFiniteError as error:
                iterator = self._roll_back(error)
                loop.step = int(self.global_step.numpy())
                progress.reset(loop.step, self._examples_done)
                interval = (loop.step, time.perf_counter())
                continue
            step = loop.step = int(self.global_step.numpy())
            last = step == cfg.train_steps if clock is None else clock.loop_done(step)
            progress.update(step, float(self._step.loss_means["loss"].result()),
                            self._examples_done + self._step.counts().examples)
            stopping = signals.requested is not None and cluster is None
            if step % cfg.summary_interval == 0 or last or (stopping and step > interval[0]):
                loop.train = self._write_train_summaries(step, interval)
                interval = (step, time.perf_counter())
            if step % cfg.checkpoint_interval == 0:
                saved = self._save(step)
                if self.is_chief:  # a run whose lock file was deleted stops, checkpoint written
                    run_lock.verify(self.model_dir, saved)
            if stopping:
                raise Preempted(step, self._save(step), signals.requested)
            if cfg.eval_interval and step % cfg.eval_interval == 0 and cfg.eval_steps != 0:
                loop.eval, loop.evaluated_step = self._evaluate_and_keep_best(step), step
            if cluster is not None:
                cluster.check(step)  # all workers save here and raise Preempted on a stop

    def train_iterator(self, inputs=None):
        """The distributed training input, positioned after the batches already trained on.

        Args:
          inputs: a function `inputs(input_context) -> tf.data.Dataset` of the task's batches
            (its per-replica batch, repeating forever) to train on instead of the task's own
            input, e.g. in-memory batches whose pipeline is measured apart (the benchmarks).
        """
        return iter(self._train_dataset(int(self.global_step.numpy()), inputs))

    def step_counts(self):
        """The examples, real tokens, token slots (padding included) and model FLOPs the steps
        trained on since the last training summary (`throughput.Counts`; TensorBoard's
        throughput reads the same counters)."""
        return self._step.counts()

    def tracing_count(self) -> int:
        """How often the training loop has been traced (a retrace for a new shape counts)."""
        return self._step.tracing_count()

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
        stops = [step + cfg.steps_per_loop, self._rollbacks.next_stop(step)]
        if self._clock is None:  # a budget run stops on time, not at train_steps
            stops.append(cfg.train_steps)
        for every in (cfg.summary_interval, cfg.checkpoint_interval, cfg.eval_interval):
            if every:
                stops.append((step // every + 1) * every)
        return min(s for s in stops if s is not None)

    def _write_run_info(self, step: int) -> None:
        if not self.is_chief:
            return
        with self._storage("the model info (bert_train.json)", self.model_dir):
            tf.io.gfile.makedirs(self.model_dir)  # the first write of a run
            self.task.write_model_info(self.model_dir)
            run_record.write(self.model_dir, self.trained_with())
        plan = self.batch_plan
        if plan is not None and plan.how != "cached":  # a resume reuses it: no probe again
            path = os.path.join(self.model_dir, batch_fit.PLAN_FILE)
            with storage.guard("the batch plan", path, partial=(outputs.temporary_sibling(path),),
                               hint=storage.resume_hint(self._manager.latest_checkpoint)):
                batch_fit.write_cached(self.model_dir, self._plan_key, plan)
        # Everything gin configures (task, model, optimizer, input) has been built by now.
        with self._storage("the operative config", self.model_dir):
            summaries.write_operative_config(self.model_dir, self._train_writer, step,
                                             derived=self.derived_bindings,
                                             resumed=self.restored is not None)

    def _storage(self, writing: str, path: str):
        """`storage.guard` naming the checkpoint a rerun resumes from."""
        return storage.guard(writing, path, hint=storage.resume_hint(
            self._manager.latest_checkpoint))

    def train_results(self) -> dict[str, float]:
        """The running training losses, task metrics and mean gradient norm.

        Averaged over the steps since the last training summary (or since the trainer was
        built); one host read per value.
        """
        return self._step.results()

    def _write_train_summaries(self, step: int, interval: tuple[int, float]) -> dict[str, float]:
        start_step, start_time = interval
        elapsed = max(time.perf_counter() - start_time, 1e-9)
        values = self._step.results()
        # The rate of the last applied update (the optimizer's iteration has moved past it; with
        # float16, loss-scale skips do not advance it).
        values["learning_rate"] = float(self._schedule(max(self._iterations() - 1, 0)))
        if self._clock is not None:
            values["time_budget_fraction"] = self._clock.fraction()
        counts = self._step.counts()
        values["steps_per_second"] = (step - start_step) / elapsed
        values.update(throughput.rates(counts, elapsed, self._peak_flops))
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            values["loss_scale"] = float(self.optimizer.dynamic_scale.numpy())
        with self._storage("TensorBoard summaries", self._train_writer.directory):
            self._train_writer.scalars(values, step)
            self._train_writer.flush()
        self._examples_done += counts.examples
        self._step.reset_metrics()
        return values

    def _iterations(self) -> int:
        """The optimizer's iteration (the schedule's argument)."""
        return int(getattr(self.optimizer, "inner_optimizer", self.optimizer).iterations.numpy())

    def _save(self, step: int) -> str:
        """Saves a checkpoint at `step` (once per step); returns its path."""
        if self._clock is not None:
            self._clock.sync()  # the elapsed seconds go with the step
        if self._saved is None or self._saved[0] != step:
            self._saved = (step, storage.save_checkpoint(self._manager, step))
            logging.info("Saved %s", self._saved[1])
        return self._saved[1]

    def _save_published(self, step: int) -> str:
        """Saves on every worker; returns the chief's copy (the one a restart reads)."""
        return os.path.join(self.model_dir, os.path.basename(self._save(step)))

    # --------------------------------------------------------------------- NaN/Inf rollback

    def _roll_back(self, error: NonFiniteError):
        """Restores the last good checkpoint after a refused step (protocol: rollback.py).

        Returns:
            A new training iterator positioned at the restored step.

        Raises:
            NonFiniteError: `error` again, when the policy is "stop" or rollbacks are used up.
        """
        def restore():
            path = resume.restore_latest(self.checkpoint, self.model_dir)
            return path, int(self.global_step.numpy())

        self._saved = self._rollbacks.plan(error, restore)
        self._step.clear_nonfinite()
        self._examples_done += self._step.counts().examples
        self._step.reset_metrics()  # they hold the refused step's NaN loss
        return self.train_iterator()

    # ------------------------------------------------------------------------- evaluation

    def evaluate(self) -> dict[str, float]:
        """Evaluates the current weights on the task's eval split (`config.eval_steps` batches).

        Returns:
            {name: value}: the mean per-example losses, the streaming metrics and the task's
            host-side `aggregate_eval` metrics. Also written to `model_dir/eval`.
        """
        results = self._evaluator.run(self.config.eval_steps)
        step = int(self.global_step.numpy())
        with self._storage("TensorBoard summaries", self._eval_writer.directory):
            self._eval_writer.scalars(results, step)
            self._eval_writer.flush()
        logging.info("eval at step %d: %s", step,
                     ", ".join(f"{k}={v:.4f}" for k, v in sorted(results.items())))
        return results

    def _evaluate_and_keep_best(self, step: int) -> dict[str, float]:
        results = self.evaluate()
        if self._best is not None:
            self._best.update(results, step, resume_from=self._manager.latest_checkpoint)
        return results


@dataclasses.dataclass
class _LoopState:
    """Where `train_and_evaluate` is: the step and the latest metrics."""

    step: int
    train: dict[str, float] = dataclasses.field(default_factory=dict)
    eval: dict[str, float] = dataclasses.field(default_factory=dict)
    evaluated_step: int | None = None
