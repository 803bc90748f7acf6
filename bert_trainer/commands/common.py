"""Helpers shared by the training commands (`pretrain`, `finetune`, `evaluate`).

The training flags (`--gin_file`, `--gin_param`, `--strategy`, `--tpu`) are defined here and
`--model_dir` is declared here (it is defined in `shared_flags`, as `predict` and `export` take
it too); a command module shows them in its `--help` with `flags.adopt_module_key_flags(common)`
and merges `common.SHARED_FLAGS` into its own. The helpers turn every bad input into a one-line
`UserError`: a model_dir that is a file or not writable names the flag, and so does one that
another run holds (`model_dir_lock`). Runs are built by the library (`bert_trainer/runs`),
which parses gin (`runs.gin_config`).

TensorFlow is imported inside the functions, so `bert-train pretrain --help` stays fast.
"""

import contextlib
import os
import sys

from absl import logging

from bert_trainer.commands import shared_flags
from bert_trainer.commands.shared_flags import Flag
from bert_trainer.errors import EXIT_NONFINITE, UserError, first_line

# Kept in sync with `training.strategies.STRATEGY_NAMES` (a test checks); not imported from
# there because that module imports TensorFlow.
STRATEGY_NAMES = ("default", "one_device", "mirrored", "multi_worker_mirrored", "tpu")

SHARED_FLAGS = shared_flags.declare(
    __name__,
    model_dir=shared_flags.Usage(None, "Directory for checkpoints, summaries and the operative "
                                 "config; a run in an existing one resumes from its checkpoint."),
    gin_file=Flag(
        "multi_string", [],
        "A .gin config file; repeat to layer several. Looked up as given, then among the "
        "shipped configs (configs/base.gin or base.gin)."),
    gin_param=Flag(
        "multi_string", [],
        "A gin binding applied after the files, e.g. --gin_param='TrainerConfig.train_steps = "
        "100'; repeatable."),
    strategy=Flag("enum", "default", "tf.distribute strategy.", enum_values=STRATEGY_NAMES),
    tpu=Flag("string", None, "TPU name or grpc:// address (with --strategy=tpu)."))


def setup_logging(verbosity_given: bool) -> None:
    """Shows INFO logs (progress lines, eval results) unless `--verbosity` was given.

    Args:
        verbosity_given: whether the command line gave `--verbosity`
            (`FLAGS["verbosity"].present`, read by the command's `main`).
    """
    if not verbosity_given:
        logging.set_verbosity(logging.INFO)


def check_model_dir(path: str | None, flag: str = "--model_dir") -> str:
    """Validates a model directory before anything is built.

    Args:
        path: the flag's value (may not exist yet).
        flag: the flag named in error messages.

    Returns:
        The path, made absolute (remote paths such as gs://... are returned as given).

    Raises:
        UserError: the flag is missing, the path is a file, or it cannot be written.
    """
    if not path:
        raise UserError(f"{flag} is required: the directory for checkpoints, summaries and "
                        "the operative config")
    if "://" in path:
        return path  # Remote file systems are checked by the first write.
    path = os.path.abspath(os.path.expanduser(path))
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UserError(f"{flag}={path}: {existing} is a file; give a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{flag}={path}: {existing} is not writable; choose another directory")
    return path


@contextlib.contextmanager
def model_dir_lock(model_dir: str, command: str, strategy_name: str):
    """Holds `model_dir`'s run lock (`training.run_lock`) for the block: one run per model_dir.

    A non-chief worker of a multi-worker run takes no lock: its chief holds it for the run,
    and it writes only its private directory inside model_dir.

    Args:
        model_dir: the directory to lock.
        command: the command named in the lock, e.g. "pretrain".
        strategy_name: the run's --strategy (one of `STRATEGY_NAMES`).

    Raises:
        UserError: another run holds `model_dir` (the message names it).
    """
    from bert_trainer.training import run_lock, strategies, throughput  # noqa: PLC0415

    # The environment the run reads later, checked before the lock: the first thing it writes.
    throughput.check_peak_env()
    if strategy_name == "multi_worker_mirrored":
        strategies.check_tf_config()
    chief = _is_chief(strategy_name)
    lock = run_lock.acquire(model_dir, f"bert-train {command}") if chief else None
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def _is_chief(strategy_name: str) -> bool:
    """Whether this process writes model_dir: not a non-chief worker named by TF_CONFIG."""
    if strategy_name != "multi_worker_mirrored":
        return True
    from bert_trainer.training.strategies import tf_config  # noqa: PLC0415 (imports TF)

    cluster, task = tf_config()  # a bad TF_CONFIG was refused by `model_dir_lock`
    kind, index = task.get("type"), task.get("index", 0)
    return kind in (None, "chief") or (kind == "worker" and index == 0 and "chief" not in cluster)


@contextlib.contextmanager
def one_line_errors():
    """Strips the lines gin appends to a UserError raised inside a configurable call."""
    try:
        yield
    except UserError as e:
        if len(str(e).strip().splitlines()) > 1:
            raise UserError(first_line(e)) from None
        raise


def get_strategy(strategy_name: str, tpu: str | None):
    """The strategy of --strategy/--tpu (see `training.strategies.get_strategy`).

    Args:
        strategy_name: --strategy, one of `STRATEGY_NAMES`.
        tpu: --tpu, a TPU name or grpc:// address, or None.
    """
    from bert_trainer.training import strategies  # noqa: PLC0415

    return strategies.get_strategy(strategy_name, tpu_address=tpu)


def train_and_report(trainer, command: str, *, label: str = "", write_results=None) -> int:
    """Runs `trainer.train_and_evaluate()`, prints a one-line summary, returns the exit code.

    A stop signal ends the run with `Preempted` after a checkpoint; it is left to the runner,
    which prints it and exits with `errors.EXIT_PREEMPTED` (running it again resumes).

    Args:
        trainer: a built `training.trainer.Trainer`.
        command: the command's name for the summary line, e.g. "pretrain".
        label: put before the step, e.g. "seed 2: ".
        write_results: called as `write_results(trainer, result)` on the chief when the run
            evaluated; the summary names the path it returns instead of the model_dir.

    Returns:
        0; `errors.EXIT_NONFINITE` when the loss or gradient norm became NaN/Inf (the
        message names the step and the last good checkpoint).
    """
    from bert_trainer.training.trainer import NonFiniteError  # noqa: PLC0415

    try:
        result = trainer.train_and_evaluate()
    except NonFiniteError as e:
        print(f"bert-train {command}: error: {label}{e}", file=sys.stderr, flush=True)
        return EXIT_NONFINITE
    parts = [f"bert-train {command}: {label}step {result.step}"]
    if result.time_budget:  # what the budget bought
        parts.append(f"time budget {result.time_budget['budget']}: {result.time_budget['steps']} "
                     f"steps in {result.time_budget['elapsed_seconds']:.0f} s")
    if "loss" in result.train:  # absent when a finished run is started again
        parts.append(f"train loss {result.train['loss']:.4f}")
    written = None
    if result.eval:
        if write_results is not None and trainer.is_chief:
            written = write_results(trainer, result)
        parts.append("eval " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(result.eval.items())))
    parts.append(f"results {written}" if written else f"model_dir {trainer.model_dir}")
    print(" | ".join(parts), flush=True)
    return 0
