"""A training run bounded by wall-clock time (`TrainerConfig.time_budget`), as Cramming's.

The learning-rate schedule runs on the fraction of the budget spent, not on the step, so the
run ends where its schedule ends whatever the machine's speed. The configured step schedule
(`OptimizerConfig`: warmup, the "bert" or "one_cycle" decay) is stretched over the budget: its
step is read as `fraction * train_steps`, so `warmup_steps = 200` of `train_steps = 2000` (or
`warmup_fraction = 0.1`) warms up over the first 10 % of the budget and the decay ends as the
budget does. `train_steps` no longer stops the run; the budget does.

The host owns the clock (`BudgetClock`): before each compiled loop it sets three variables
that the in-graph schedule reads (`fraction_at`): the fraction spent at the loop's first step
and each step's share of what is left (from the step time measured over the last loop), so
the rate moves step by step inside a loop and never jumps back. It also sizes the loop from
the remaining time, so the run overshoots its budget by at most one step's misestimate, and
stops when the budget is spent. The elapsed seconds are a checkpointed variable: a resumed run
continues its budget instead of starting it again.

What the budget counts: the training loop's wall-clock time, from its start (tracing, the
first input batches, checkpoints and evaluations during training included); not the start-up
before it, nor the final checkpoint and evaluation after it.
"""

import time

import keras
import tensorflow as tf
from absl import logging

from bert_trainer import durations
from bert_trainer.checkpoints import resume
from bert_trainer.errors import UserError
from bert_trainer.training import preemption


def clock_for(seconds: float | None, strategy) -> "BudgetClock | None":
    """The clock of a run with a budget of `seconds` (None: no budget, no clock).

    Raises:
        UserError: several workers (their clocks would disagree on the last step).
    """
    if seconds is None:
        return None
    if preemption.is_multi_worker(strategy):
        raise UserError("TrainerConfig.time_budget is not supported with several workers "
                        "(their clocks would disagree on the last step); set train_steps")
    return BudgetClock(seconds)


class BudgetClock:
    """The time budget of one run: host-side clock, in-graph fraction, loop sizes.

    Args:
        seconds: the budget.

    Attributes:
        seconds: the budget.
        elapsed_variable: float64 seconds spent before the last save (checkpoint it).
    """

    def __init__(self, seconds: float):
        self.seconds = float(seconds)

        def variable(value, dtype, name):
            return tf.Variable(value, dtype=dtype, trainable=False, name=name)

        self.elapsed_variable = variable(0.0, tf.float64, "time_budget_elapsed")
        # What fraction_at reads: fraction(step) = start + (step - start_step) * per_step.
        self._start_fraction = variable(0.0, tf.float32, "budget_start_fraction")
        self._start_step = variable(0, tf.int64, "budget_start_step")
        self._per_step = variable(0.0, tf.float32, "budget_fraction_per_step")
        self._base = 0.0  # seconds spent before this process's clock started
        self._started: float | None = None
        self._seconds_per_step: float | None = None
        self._traced = False
        self._reached = 0.0  # the fraction the last loop's last step was given
        # The last loop: (first step, start time, start fraction, fraction per step).
        self._loop: tuple[int, float, float, float] | None = None

    # ------------------------------------------------------------------------- host side

    def start(self, train_steps: int) -> None:
        """Starts the clock from the (restored) elapsed seconds, and says so.

        Args:
            train_steps: the step count the schedule was planned for (named in the line).
        """
        self._base = float(self.elapsed_variable.numpy())
        self._started = time.perf_counter()
        self._seconds_per_step = None
        self._traced = False
        self._reached = self.fraction()
        logging.info("Time budget %s (%.0f s spent before): the schedule of train_steps=%d runs "
                     "on its fraction", durations.format_duration(self.seconds), self._base,
                     train_steps)

    def elapsed(self) -> float:
        """Seconds of the budget spent (this process's and the restored ones)."""
        if self._started is None:
            return float(self.elapsed_variable.numpy())
        return self._base + time.perf_counter() - self._started

    def fraction(self) -> float:
        """The fraction of the budget spent, in [0, 1]."""
        return min(self.elapsed() / self.seconds, 1.0)

    def spent(self) -> bool:
        """Whether the run should stop: less than half a step's time is left."""
        remaining = self.seconds - self.elapsed()
        return remaining <= 0.5 * (self._seconds_per_step or 0.0)

    def plan_loop(self, step: int, iteration: int, max_steps: int) -> int:
        """Sizes the next loop and sets the fraction the schedule reads during it.

        Args:
            step: the global step now.
            iteration: the optimizer's iteration now (the schedule's argument).
            max_steps: the most steps the loop may run (the next summary, checkpoint, ...).

        Returns:
            Steps to run: as many as the remaining time buys, in [1, max_steps]. The first
            two loops of a process run one step each: the first traces the step, the second
            measures it.
        """
        remaining = self.seconds - self.elapsed()
        steps, per_step = 1, 0.0
        # Never below the fraction the last loop's steps reached (a loop slower than its
        # estimate ran ahead of the clock): the rate never jumps back. Each step then takes
        # its share of what is left, so the fraction reaches 1 as the budget ends.
        start = max(self.fraction(), self._reached)
        if self._seconds_per_step:
            steps = max(1, min(max_steps, round(remaining / self._seconds_per_step)))
            per_step = (1.0 - start) * self._seconds_per_step / max(remaining, 1e-9)
        self._start_fraction.assign(start)
        self._start_step.assign(iteration)
        self._per_step.assign(per_step)
        self._loop = (step, time.perf_counter(), start, per_step)
        return steps

    def loop_done(self, step: int) -> bool:
        """Measures the last loop's seconds per step (called after it ran).

        Returns:
            Whether the budget is spent (that loop was the last).
        """
        first, started, start, per_step = self._loop
        self._reached = min(start + (step - first) * per_step, 1.0)
        if step > first and self._traced:
            self._seconds_per_step = (time.perf_counter() - started) / (step - first)
        self._traced = True  # the first loop of a process traces the step: not a measurement
        return self.spent()

    def sync(self) -> None:
        """Writes the elapsed seconds into `elapsed_variable` (before a save)."""
        self.elapsed_variable.assign(self.elapsed())

    def finish(self, step: int, start_step: int) -> dict:
        """What the run records (the budget, the seconds spent, the steps it bought), logged.

        Args:
            step: the step the run ended at.
            start_step: the step this process started from.
        """
        logging.info("Time budget %s spent: %d steps in %.1f s",
                     durations.format_duration(self.seconds), step, self.elapsed())
        return {"seconds": self.seconds, "budget": durations.format_duration(self.seconds),
                "elapsed_seconds": round(self.elapsed(), 3), "steps": step,
                "steps_this_process": step - start_step}

    # --------------------------------------------------------------------------- in graph

    def fraction_at(self, iteration) -> tf.Tensor:
        """The fraction of the budget spent at an optimizer iteration (float32, in [0, 1])."""
        steps = tf.cast(tf.cast(iteration, tf.int64) - self._start_step, tf.float32)
        return tf.clip_by_value(self._start_fraction + steps * self._per_step, 0.0, 1.0)


class BudgetSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A step schedule of `train_steps` steps stretched over a time budget.

    rate(iteration) = schedule(clock.fraction_at(iteration) * train_steps).

    Args:
        schedule: the step schedule (`optimization.build_schedule(config, train_steps)`).
        train_steps: the step count the schedule was planned for (its end).
        clock: the run's `BudgetClock`.
    """

    def __init__(self, schedule, train_steps: int, clock: BudgetClock):
        self.schedule = schedule
        self.train_steps = train_steps
        self.clock = clock

    def __call__(self, step):
        return self.schedule(self.clock.fraction_at(step) * float(self.train_steps))

    def get_config(self):
        # The clock is the run's state, not configuration: what is saved is the step schedule.
        return {"schedule": keras.saving.serialize_keras_object(self.schedule),
                "train_steps": self.train_steps, "time_budget_seconds": self.clock.seconds}


def check_resume(model_dir: str, budget: float | None) -> None:
    """Refuses to resume a budget run without a budget, or a run of steps with one.

    A budget run's schedule runs on the fraction of its budget, a run of steps' on the step:
    switching halfway would jump the learning rate. Checked on the latest checkpoint (nothing
    to check in a fresh model_dir); the trainer's checkpoint holds `elapsed_variable` under
    `resume.TIME_BUDGET_KEY`.

    Raises:
        UserError: naming the model_dir and the fix.
    """
    prefix = tf.train.latest_checkpoint(model_dir)
    if prefix is None:
        return
    try:
        held = resume.TIME_BUDGET_KEY in dict(tf.train.list_variables(prefix))
    except (tf.errors.OpError, ValueError):
        return  # unreadable: the restore reports it (and falls back to an earlier one)
    if held and budget is None:
        raise UserError(f"model_dir {model_dir} holds a time-budget run ({prefix}); resume it "
                        "with --time_budget (TrainerConfig.time_budget), or use a new "
                        "--model_dir")
    if budget is not None and not held:
        raise UserError(f"model_dir {model_dir} holds a run of steps without a time budget "
                        f"({prefix}); resume it without --time_budget, or use a new --model_dir")
