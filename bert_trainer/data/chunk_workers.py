"""Chunks of documents turned into records on worker processes, results in chunk order.

`create_pretraining_data` cuts the corpus into chunks of consecutive documents and hands each
chunk, with its index, to `work(state, chunk)` (the objective's, from its family's corpus
writer, which passes it in: this module imports none); a chunk's result depends only on the
chunk, its index and the seed, never on which process made it, so the output is the same for
any number of workers. The parent reads the text and writes the shards; the workers tokenize
and make examples.

Workers are processes forked from a `forkserver` that has imported TensorFlow but run nothing
(TensorFlow's runtime and `fork` do not mix; starting each worker with `spawn` would import
TensorFlow once per worker instead); each holds its own `state` (a tokenizer) built once by
`make_state(*state_args)`. At most `window` chunks per
worker are in flight, so memory stays bounded whatever the corpus size. A worker that raises
stops the run with its exception; a worker that dies (killed, out of memory) stops it with a
one-line `UserError`. With one worker everything runs in this process.

The pool takes seconds to start (the forkserver imports TensorFlow, then each worker builds
its state), and starting a worker blocks whoever asks for it until the forkserver has forked
it. So the pool is started on a thread, and meanwhile the parent makes the first chunks itself
(with its own state, built on its first chunk) instead of waiting: they are the next in order,
since nothing has been handed to the pool yet. Once a worker has run a no-op probe, every later
chunk goes to the pool. A corpus shorter than the start-up is made by the parent alone, which
then does not wait for the forkserver's import (only for workers already forked, to stop them).
"""

import collections
import contextlib
import itertools
import multiprocessing
import os
import pickle
import signal
import threading
from concurrent import futures
from concurrent.futures.process import BrokenProcessPool

from bert_trainer.errors import UserError

_END = object()  # What `next` returns once the chunks are all taken.
_WORKER = {}  # The state of this worker process (set by `_start_worker`).
PRELOAD = "bert_trainer.data.worker_preload"  # What the forkserver imports before any fork.


def default_num_workers() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0))


def check_num_workers(num_workers: int) -> None:
    if num_workers < 1:
        raise UserError(f"--num_workers={num_workers} must be >= 1 (default: the "
                        f"{default_num_workers()} cores of this machine)")


def _start_worker(pickled_state: bytes) -> None:
    """A worker's start: Ctrl-C is the parent's to handle; TensorFlow loads quietly.

    `pickled_state` is (make_state, state_args), unpickled only here, once stderr is
    redirected: unpickling imports their modules, and with them TensorFlow.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    saved = os.dup(2)
    with open(os.devnull, "wb") as devnull:  # TensorFlow's C++ start-up lines.
        os.dup2(devnull.fileno(), 2)
        try:
            import tensorflow as tf  # noqa: PLC0415

            make_state, state_args = pickle.loads(pickled_state)
            # One worker per core: more threads per worker would only contend.
            tf.config.threading.set_intra_op_parallelism_threads(1)
            tf.config.threading.set_inter_op_parallelism_threads(1)
            tf.config.list_physical_devices()  # Logs "failed call to cuInit" without a GPU.
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    _WORKER["state"] = make_state(*state_args)


class Results:
    """The results in chunk order, and how many processes made them (`num_workers`: 1 when
    the corpus was one chunk, whatever was asked; the pool's size otherwise, the chunks the
    parent made while the pool started included)."""

    def __init__(self, results, num_workers: int):
        self._results = results
        self.num_workers = num_workers

    def __iter__(self):
        return self._results


def _run(work, chunk):
    return work(_WORKER["state"], chunk)


def _ready() -> None:
    """A worker's first task: once one is done, a worker has started (the probe)."""


def _start_pool(context, executor, num_workers: int, started: threading.Event,
                errors: list) -> None:
    """Starts the pool's workers, one probe each; `started` is set when a probe ends.

    Runs on a thread: starting a process waits until the forkserver has forked it, which for
    the first one means until the forkserver has imported TensorFlow. A throwaway process waits
    for that first, so that `submit`, which holds the executor's lock while it starts a worker,
    only ever waits for a fork: an interrupted run shuts the executor down at once.
    """
    try:
        first = context.Process(target=_ready, daemon=True)
        first.start()
        first.join()
        for _ in range(num_workers):  # One probe per worker: each submit starts one.
            executor.submit(_ready).add_done_callback(lambda _: started.set())
    except Exception as e:  # E.g. BrokenProcessPool, raised in the parent by `map_chunks`,
        # or, once the parent made every chunk, the executor's shutdown.
        errors.append(e)
        started.set()


def _made_here(work, make_state, state_args: tuple, chunks, started: threading.Event):
    """`work` on the next chunks in this process until `started` is set or none are left.

    `chunks` is an iterator, left at the first chunk not taken. Returns whether none are left.
    """
    state = None
    while not started.is_set():
        chunk = next(chunks, _END)
        if chunk is _END:
            return True
        if state is None:
            state = make_state(*state_args)
        yield work(state, chunk)


@contextlib.contextmanager
def map_chunks(work, make_state, state_args: tuple, chunks, num_workers: int,
               window: int = 2):
    """Yields an iterator over `work(state, chunk)` for every chunk, in the chunks' order.

    Args:
      work: a module-level function (state, chunk) -> result; chunks and results are pickled.
      make_state: a module-level function building a worker's state from `state_args`.
      state_args: picklable arguments of `make_state`.
      chunks: an iterable of chunks, consumed lazily.
      num_workers: processes; 1 (or a single chunk) runs `work` in this process.
      window: chunks in flight per worker (bounds memory).

    Raises:
      UserError: a worker process died.
    """
    check_num_workers(num_workers)
    chunks = iter(chunks)
    head = list(itertools.islice(chunks, 2))
    chunks = itertools.chain(head, chunks)
    if num_workers == 1 or len(head) < 2:  # One chunk: a pool would only add its start-up.
        state = make_state(*state_args)
        yield Results((work(state, chunk) for chunk in chunks), 1)
        return
    context = multiprocessing.get_context("forkserver")
    # The generic pieces quietly first, then the modules of `work` and `make_state` (a
    # family's corpus writer, which this layer does not import): the workers fork with them.
    context.set_forkserver_preload(list(dict.fromkeys(
        [PRELOAD, work.__module__, make_state.__module__])))
    executor = futures.ProcessPoolExecutor(
        num_workers, mp_context=context,
        initializer=_start_worker, initargs=(pickle.dumps((make_state, state_args)),))
    started, start_errors = threading.Event(), []
    starter = threading.Thread(target=_start_pool, name="chunk_workers-start", daemon=True,
                               args=(context, executor, num_workers, started, start_errors))
    starter.start()
    pending = collections.deque()

    def results():
        try:
            if (yield from _made_here(work, make_state, state_args, chunks, started)):
                return  # The parent made every chunk: no need to wait for the pool.
            starter.join()
            if start_errors:
                raise start_errors[0]
            for chunk in chunks:
                pending.append(executor.submit(_run, work, chunk))
                if len(pending) >= window * num_workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        except BrokenProcessPool:
            raise UserError(
                f"a worker process of --num_workers={num_workers} died (killed, or out of "
                "memory?); nothing was written: run again, with a smaller --num_workers if "
                "memory is short") from None

    try:
        yield Results(results(), num_workers)
    finally:
        for future in pending:
            future.cancel()
        # Does not wait for `starter` if it still waits for the forkserver: it then finds the
        # executor shut down and ends.
        executor.shutdown(wait=True, cancel_futures=True)
