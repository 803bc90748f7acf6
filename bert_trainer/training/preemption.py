"""Stopping cleanly on SIGTERM/SIGINT/SIGHUP: finish the step, checkpoint, flush, exit resumable.

`Trainer.train_and_evaluate` runs inside `watch(...)`. When a stop signal arrives it ends the
current step, writes a checkpoint at that step, flushes TensorBoard and raises `Preempted`
(the CLI prints one line and exits with `errors.EXIT_PREEMPTED`). A restart in the same
`model_dir` resumes there. Which mechanism is used depends on the strategy:

* One worker (default, one_device, mirrored, TPU): `StopSignals` with a stop flag. A Python
  signal handler only runs when the main thread executes bytecode, which it does not do while
  a compiled loop of `steps_per_loop` steps runs. So the handler is paired with
  `signal.set_wakeup_fd`: CPython's C-level handler writes the signal number to a pipe at
  once, a watcher thread reading the pipe sets `stop_flag` (a `tf.Variable`), and the compiled
  loop reads that flag before every step. The loop ends at the next step boundary.
* Multi-worker (`MultiWorkerMirroredStrategy` with a cluster in `TF_CONFIG`): every worker must
  stop after the same step, or the others hang in their collective ops. tf.distribute's
  `PreemptionCheckpointHandler` agrees on that point through the coordination service; it is
  polled between loop calls (its `termination_watcher_fn` asks our `StopSignals` whether a
  signal came), so a stop takes effect within one or two `steps_per_loop` calls. SIGTERM and
  SIGINT work on any worker.

SIGHUP (a closed terminal, a dropped ssh session) stops a run as SIGTERM does, unless the run
was started with SIGHUP ignored (`nohup`): a run its user detached on purpose keeps training.

A second signal while stopping raises KeyboardInterrupt at once (the checkpoint being written,
if any, is not published: the previous one stays the latest).
"""

import contextlib
import os
import signal
import threading

import tensorflow as tf
from absl import logging

from bert_trainer.errors import Preempted

__all__ = ["ClusterStop", "Preempted", "StopSignals", "watch"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_WAKE_UP = 0  # a byte no signal has: tells the watcher thread to end


class StopSignals:
    """Turns SIGTERM/SIGINT/SIGHUP into a stop request that a running compiled loop can see.

    Use as a context manager around training; handlers and the wakeup fd are restored on
    exit. Outside the main thread (where Python cannot install handlers) it watches nothing.

    Args:
        stop_flag: a scalar bool `tf.Variable` set to True when a signal arrives (None: only
            `requested` is set, for callers that poll).
        signals: the signals that request a stop (SIGHUP only where it is not ignored: a
            `nohup` run is meant to outlive its terminal).

    Attributes:
        requested: the name of the first stop signal received, or None.
    """

    def __init__(self, stop_flag: tf.Variable | None = None, signals=STOP_SIGNALS):
        self.stop_flag = stop_flag
        self.signals = tuple(s for s in signals
                             if s != signal.SIGHUP or signal.getsignal(s) != signal.SIG_IGN)
        self.requested: str | None = None
        self._active = False
        self._handled = 0

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is not threading.main_thread():
            logging.warning("Training outside the main thread: stop signals are not handled")
            return self
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)  # set_wakeup_fd requires it
        self._previous = {s: signal.signal(s, self._handle) for s in self.signals}
        self._previous_wakeup = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="StopSignals", daemon=True)
        self._thread.start()
        self._active = True
        return self

    def __exit__(self, *exc_info) -> None:
        if not self._active:
            return
        self._active = False
        signal.set_wakeup_fd(self._previous_wakeup)
        for s, handler in self._previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        os.write(self._write_fd, bytes([_WAKE_UP]))
        self._thread.join()
        os.close(self._read_fd)
        os.close(self._write_fd)

    def _watch(self) -> None:
        """Watcher thread: reads signal numbers from the wakeup pipe as they arrive."""
        announced = False
        while True:
            for number in os.read(self._read_fd, 64):
                if number == _WAKE_UP:
                    return
                if number not in self.signals:
                    continue
                # The Python-level handler may have run first and set `requested` already.
                self.requested = self.requested or signal.Signals(number).name
                if self.stop_flag is not None:
                    self.stop_flag.assign(True)
                if not announced:
                    announced = True
                    logging.warning("%s received: stopping after the current step, then "
                                    "writing a checkpoint (send it again to stop at once)",
                                    self.requested)

    def _handle(self, signum, frame) -> None:
        """Python-level handler: runs in the main thread once it executes bytecode again."""
        del frame
        self._handled += 1
        if self._handled > 1:
            raise KeyboardInterrupt(f"second stop signal ({signal.Signals(signum).name})")
        # The watcher thread may not have read the pipe yet; either way a stop is requested.
        self.requested = self.requested or signal.Signals(signum).name


class ClusterStop:
    """A multi-worker stop: all workers checkpoint the same step, then raise `Preempted`.

    Wraps `tf.distribute.experimental.PreemptionCheckpointHandler`. Its own checkpoint manager
    is not used (it would restore the latest checkpoint again, bypassing the integrity and
    architecture checks): it gets an empty `tf.train.Checkpoint` and saves through `save_fn`.

    Args:
        strategy: a MultiWorkerMirroredStrategy with a cluster.
        signals: the `StopSignals` watching this worker (polled once a second).
        save_fn: `save_fn(step) -> checkpoint path`, called by every worker at the agreed step.
        scratch_dir: a directory only this worker uses (the handler may create a folder there).
    """

    def __init__(self, strategy, signals: StopSignals, save_fn, scratch_dir: str):
        self._save_fn = save_fn
        self._saved: tuple[int, str] | None = None
        self._signals = signals
        config = tf.distribute.experimental.TerminationConfig(
            termination_watcher_fn=lambda: signals.requested is not None,
            exit_fn=self._exit, save_fn=self._save)
        self._handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            strategy.cluster_resolver, tf.train.Checkpoint(),
            checkpoint_dir=os.path.join(scratch_dir, "preemption"), termination_config=config)

    def _save(self, step: int) -> None:
        self._saved = (step, self._save_fn(step))

    def _exit(self) -> None:
        step, path = self._saved
        raise Preempted(step, path, self._signals.requested or "a peer worker's stop signal")

    def check(self, step: int) -> None:
        """Call on every worker after each loop; raises `Preempted` once all have saved."""
        self._handler.save_checkpoint_if_preempted(step)

    def close(self) -> None:
        """Ends the handler's watcher threads (there is no public API for it)."""
        self._handler._stop_poll_termination_signal_thread()  # noqa: SLF001
        self._handler._stop_cluster_wise_termination_watcher_thread()  # noqa: SLF001


def is_multi_worker(strategy) -> bool:
    """True for a MultiWorkerMirroredStrategy that spans a cluster."""
    resolver = getattr(strategy, "cluster_resolver", None)
    return (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and resolver is not None and bool(resolver.cluster_spec().jobs))


@contextlib.contextmanager
def watch(strategy, stop_flag: tf.Variable, save_fn, scratch_dir: str, enabled: bool = True):
    """Watches for stop signals during training.

    Args:
        strategy: the run's strategy (picks the mechanism, see the module docstring).
        stop_flag: the compiled loop's stop flag (set only in single-worker runs).
        save_fn: `save_fn(step) -> checkpoint path` (used by the multi-worker mechanism).
        scratch_dir: this worker's private directory (multi-worker only).
        enabled: False: watch nothing (signals keep their default behaviour).

    Yields:
        (signals, cluster): the `StopSignals` (its `requested` is checked after each loop)
        and a `ClusterStop` in multi-worker runs (else None; call its `check(step)` instead).
    """
    if not enabled:
        yield StopSignals(None, signals=()), None
        return
    multi_worker = is_multi_worker(strategy)
    with StopSignals(None if multi_worker else stop_flag) as signals:
        cluster = ClusterStop(strategy, signals, save_fn, scratch_dir) if multi_worker else None
        try:
            yield signals, cluster
        finally:
            if cluster is not None:
                cluster.close()
