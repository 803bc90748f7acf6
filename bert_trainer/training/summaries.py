"""TensorBoard summaries, the operative gin config, and the terminal progress line.

Events go to `model_dir/train` and `model_dir/eval`. Only the chief writes; other workers get
no-op writers (their numbers are the same, as metrics are summed over all replicas).
"""

import math
import os
import time

import gin
import tensorflow as tf
from absl import logging

from bert_trainer.checkpoints import storage

OPERATIVE_CONFIG_FILE = "operative_config.gin"


class SummaryWriter:
    """A `tf.summary` writer for one subdirectory that does nothing on non-chief workers.

    Args:
        directory: the event directory, e.g. `model_dir/train`.
        enabled: False on non-chief workers.
    """

    def __init__(self, directory: str, enabled: bool = True):
        self.directory = directory
        self.enabled = enabled
        self._file_writer = None

    @property
    def _writer(self):
        # Created at the first write: creating it makes the directory and an event file, and a
        # run that fails before writing anything must leave its model_dir as it was.
        if self._file_writer is None:
            self._file_writer = (tf.summary.create_file_writer(self.directory) if self.enabled
                                 else tf.summary.create_noop_writer())
        return self._file_writer

    def scalars(self, values: dict[str, float], step: int) -> None:
        """Writes one scalar per entry at `step` (non-finite values are written as they are)."""
        with self._writer.as_default(step=step):
            for name, value in values.items():
                tf.summary.scalar(name, value)

    def text(self, name: str, text: str, step: int) -> None:
        """Writes a text summary (shown in TensorBoard's Text tab) at `step`."""
        with self._writer.as_default(step=step):
            tf.summary.text(name, text)

    def flush(self) -> None:
        if self._file_writer is not None:
            self._file_writer.flush()

    def close(self) -> None:
        if self._file_writer is not None:
            self._file_writer.close()


def write_operative_config(model_dir: str, writer: SummaryWriter | None = None,
                           step: int = 0, derived=(), resumed: bool = False) -> str:
    """Writes gin's operative config to `model_dir/operative_config.gin` and to TensorBoard.

    The operative config lists every gin parameter that the run actually used (defaults
    included), so the run can be repeated exactly. Call it after the task, model, optimizer and
    input pipeline are built: gin only records configurables that have been called.

    A resumed run keeps the file of the run it continues (it repeats the run from its start);
    a config that differs from it (a longer run, another batch size) goes to
    `operative_config-STEP.gin`, STEP being the step the run resumed at.

    Args:
        model_dir: the run directory.
        writer: where the text summary goes (None: file only).
        step: the step the text summary is recorded at.
        derived: binding lines of settings the command derived and passed as arguments
            (gin does not list those); appended under a header comment.
        resumed: the run resumed from a checkpoint of `model_dir`.

    Returns:
        The config text (empty when nothing was configured with gin).
    """
    config = gin.operative_config_str()
    if derived:
        header = "# Derived by the command (passed as arguments, not bound in gin):"
        config = "\n".join([config.rstrip("\n"), "", header, *derived]).lstrip("\n") + "\n"
    tf.io.gfile.makedirs(model_dir)
    path = os.path.join(model_dir, OPERATIVE_CONFIG_FILE)
    if resumed and tf.io.gfile.exists(path):
        with tf.io.gfile.GFile(path) as f:
            original = f.read()
        path = None if original == config else resumed_config_path(model_dir, step)
    if path is not None:
        storage.write_text_atomically(path, config)
    if writer is not None:
        # Markdown would reflow the config; indenting each line makes it a code block.
        body = "\n".join("    " + line for line in config.splitlines()) or "    (no gin bindings)"
        writer.text("operative_config", body, step)
        writer.flush()
    return config


def resumed_config_path(model_dir: str, step: int) -> str:
    """Where the operative config of a run resumed at `step` goes when it differs."""
    stem, extension = os.path.splitext(OPERATIVE_CONFIG_FILE)
    return os.path.join(model_dir, f"{stem}-{step}{extension}")


def format_duration(seconds: float) -> str:
    """Formats seconds as e.g. "1h02m", "3m05s" or "42s" ("?" when unknown)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class ProgressLogger:
    """Logs one line per training loop: step/total, loss, steps/s, examples/s and ETA.

    The rates are measured over the last loop only, so a slow first loop (tracing, XLA
    compilation) does not distort the ETA for the rest of the run.

    Args:
        total_steps: the run's last step.
        start_step: the step the run (re)starts from.
        budget: the run's `time_budget.BudgetClock`: the line shows the fraction of the budget
            spent instead of step/total, and the ETA is the time left (None: no budget).
    """

    def __init__(self, total_steps: int, start_step: int = 0, budget=None):
        self.total_steps = total_steps
        self.budget = budget
        self._step = start_step
        self._examples = 0.0
        self._time = time.perf_counter()

    def reset(self, step: int, examples: float) -> None:
        """Measures the next rates from `step` (e.g. after a rollback moved the step back)."""
        self._step, self._examples, self._time = step, examples, time.perf_counter()

    def update(self, step: int, loss: float, examples: float) -> dict[str, float]:
        """Logs the line for a loop that ended at `step`.

        Args:
            step: the global step now.
            loss: the mean training loss to show.
            examples: examples trained on since this run started (a running total).

        Returns:
            {"steps_per_second", "examples_per_second"} of the loop.
        """
        now = time.perf_counter()
        elapsed = max(now - self._time, 1e-9)
        steps_per_second = (step - self._step) / elapsed
        examples_per_second = (examples - self._examples) / elapsed
        eta = (self.total_steps - step) / steps_per_second if steps_per_second > 0 else math.inf
        width = len(str(self.total_steps))
        where = f"{step:{width}d}/{self.total_steps}"
        if self.budget is not None:
            where = f"{step} ({100 * self.budget.fraction():.0f}% of the time budget)"
            eta = max(self.budget.seconds - self.budget.elapsed(), 0.0)
        logging.info("step %s | loss %.4f | %.2f steps/s | %.1f examples/s | ETA %s", where,
                     loss, steps_per_second, examples_per_second, format_duration(eta))
        self._step, self._examples, self._time = step, examples, now
        return {"steps_per_second": steps_per_second, "examples_per_second": examples_per_second}
