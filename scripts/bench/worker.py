"""One measurement per process: the worker loop (child side) and its client (parent side).

Each measured thing (a training step, the matmul peak, the input pipeline, a tokenizer) lives
in its own Python process so that (1) its peak RSS (`ru_maxrss`, a high-water mark that never
goes down) is its own, and (2) several steps can be kept built and warm at once while the parent
alternates between them A/B/A/B. An idle worker blocks on its stdin pipe and uses no CPU, so
alternation does not make the measured process share the cores with the others.

Protocol: JSON lines. The parent sends {"cmd": "build", "kind": K, "params": {...}} once, then
{"cmd": "run", "n": N} any number of times, then {"cmd": "quit"}. Every reply is one JSON line;
`run` replies carry the wall seconds of the N units measured inside the child (no pipe latency).

`preload_workers()` (the --smoke runs') forks workers from one process that imported TensorFlow
and Keras once (nothing of theirs has run in it) instead of starting a fresh interpreter each:
the same protocol and worker loop, without paying the imports per worker. Real runs start
fresh processes, so each worker's import time and peak RSS are its own.
"""

import atexit
import gc
import json
import os
import pathlib
import resource
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

SCRIPTS_DIR = pathlib.Path(__file__).resolve().parents[1]


def _builders() -> dict:
    """kind -> "module:function"; imported lazily so a worker only imports what it needs."""
    return {
        "keras_hub": "bench.keras_hub_step:build_from_params",
        "bert_train": "bench.bert_train_step:build_from_params",
        "bert_train_tf_ops": "bench.bert_train_step:build_tf_ops_from_params",
        "matmul": "bench.peak:build",
        "matmul_floor": "bench.floor:build",
        "pipeline": "bench.pipeline:build",
        "tokenizer": "bench.tokenizer_bench:build",
        "bert_train_finetune": "bench.finetune_step:build",
        "torch_finetune": "bench.torch_finetune:build",
        "seq2seq_step": "bench.seq2seq_train:build_step",
        "seq2seq_budget": "bench.seq2seq_train:build_budget",
        "causal_lm_step": "bench.causal_lm_train:build_step",
        "causal_lm_budget": "bench.causal_lm_train:build_budget",
        "causal_lm_generate": "bench.causal_lm_generate:build",
    }


def peak_rss_mb() -> float:
    """High-water resident set size of this process in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    """Resident set size now, in MiB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _serve(proto_out) -> None:
    """Child main loop: reads commands from stdin, writes one JSON reply per command."""
    run = None
    for line in sys.stdin:
        request = json.loads(line)
        reply = {"ok": True}
        try:
            if request["cmd"] == "build":
                module_name, fn_name = _builders()[request["kind"]].split(":")
                t0 = time.perf_counter()
                module = __import__(module_name, fromlist=[fn_name])
                # The frameworks' objects live as long as the worker: out of every garbage
                # collection, whose pauses would otherwise land in the timed steps.
                gc.freeze()
                reply["import_s"] = time.perf_counter() - t0
                reply["rss_after_import_mb"] = current_rss_mb()
                t0 = time.perf_counter()
                reply["info"], run = getattr(module, fn_name)(**request["params"])
                reply["build_s"] = time.perf_counter() - t0
            elif request["cmd"] == "run":
                t0 = time.perf_counter()
                reply.update(run(request["n"]))
                reply["seconds"] = time.perf_counter() - t0
            elif request["cmd"] == "quit":
                return
            reply["peak_rss_mb"] = peak_rss_mb()
        except Exception as e:  # Reported to the parent, which records it and goes on.
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}".splitlines()[0][:500],
                     "traceback": traceback.format_exc()}
        proto_out.write(json.dumps(reply) + "\n")
        proto_out.flush()


def main() -> None:
    # The protocol owns the real stdout; anything a library prints goes to stderr instead.
    proto_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    _serve(proto_out)


PRELOAD = ("tensorflow", "keras")  # Imported (not run) by the fork server.


def _fork_server(fd: int) -> None:
    """Forks one worker per request on the socket `fd`; reaps them all before exiting.

    A request is the worker's environment (JSON) with its stdin, stdout and stderr descriptors;
    the reply is the child's pid. Its children are waited for, so their CPU time counts as
    this process's children's, and this process is waited for by the benchmark.
    """
    import importlib  # noqa: PLC0415

    sock = socket.socket(fileno=fd)
    for module in PRELOAD:
        importlib.import_module(module)
    children = set()

    def reap(*_):
        for pid in list(children):
            try:
                done, _status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                children.discard(pid)

    signal.signal(signal.SIGCHLD, reap)
    while True:
        message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        if not message:  # The benchmark closed its end: no more workers.
            break
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                sock.close()
                for target, source in enumerate(fds):
                    os.dup2(source, target)
                    os.close(source)
                env = json.loads(message)
                os.environ.clear()
                os.environ.update(env)
                paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
                sys.path[:0] = [p for p in paths if p not in sys.path]
                main()
                code = 0
            except BaseException:  # noqa: BLE001 - reported on stderr, the worker's log
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children.add(pid)
        for f in fds:
            os.close(f)
        sock.send(str(pid).encode())
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for pid in children:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


class _ForkServer:
    """The benchmark's side of `_fork_server`: started on first use, waited for at exit."""

    def __init__(self, env: dict, log):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock, self._lock, self.children = ours, threading.Lock(), []
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "bench.worker", "--fork_server", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            env=env)
        theirs.close()
        atexit.register(self.close)

    def start(self, env: dict, stdin: int, stdout: int, stderr: int) -> int:
        with self._lock:
            socket.send_fds(self._sock, [json.dumps(env).encode()], [stdin, stdout, stderr])
            return int(self._sock.recv(64))

    def close(self) -> None:
        for child in self.children:  # A worker left open ends at the end of its stdin.
            if not child.stdin.closed:
                child.stdin.close()
        self._sock.close()
        self._proc.wait()


class _ForkedChild:
    """What `Worker` uses of a `subprocess.Popen`, for a worker forked by the fork server."""

    def __init__(self, server: _ForkServer, env: dict, log):
        child_in, self_in = os.pipe()
        self_out, child_out = os.pipe()
        try:
            self.pid = server.start(env, child_in, child_out, log.fileno())
        finally:
            os.close(child_in)
            os.close(child_out)
        self.stdin = os.fdopen(self_in, "w")
        self.stdout = os.fdopen(self_out, "r")
        self.returncode = None
        server.children.append(self)

    def poll(self):
        if self.returncode is None:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self.returncode = -1  # Gone; its status went to the fork server.
        return self.returncode

    def wait(self, timeout=None):
        """Waits for the child's end of the protocol pipe to close (the child exited)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired("bench.worker", timeout)
            ready, _, _ = select.select([self.stdout], [], [], left)
            if ready and not os.read(self.stdout.fileno(), 1 << 16):
                self.returncode = -1
        return self.returncode

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


_fork_server_state = {"enabled": False, "server": None}
_fork_server_lock = threading.Lock()


def preload_workers(enabled: bool = True) -> None:
    """Fork this process's later workers (this checkout's, this Python) from a fork server."""
    _fork_server_state["enabled"] = enabled


class WorkerError(RuntimeError):
    """A worker failed to build or run; the message is the child's one-line error."""


class Worker:
    """Parent-side handle of one worker process.

    Args:
      kind: a key of `_builders()`.
      params: keyword arguments of the builder (JSON-serializable).
      log_path: file receiving the child's stderr (TensorFlow logs, tracebacks).
      timeout_s: longest wait for one reply; a silent worker is killed and reported.
      checkout: run another checkout's `scripts/bench` and `bert_trainer` (None: this one's).
      python: the interpreter of the child (None: this one), e.g. one with torch installed.
    """

    def __init__(self, kind: str, params: dict, log_path: str, timeout_s: float = 900.0,
                 checkout: str | None = None, python: str | None = None):
        self.kind, self.params, self.timeout_s = kind, params, timeout_s
        env = dict(os.environ)
        # Another checkout's benchmark and package code first on the path (A/B of two trees).
        paths = ([str(pathlib.Path(checkout) / "scripts"), str(checkout)] if checkout
                 else [str(SCRIPTS_DIR)])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, env.get("PYTHONPATH")]))
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        self._log = open(log_path, "a")
        if _fork_server_state["enabled"] and checkout is None and python is None:
            with _fork_server_lock:  # Sections may start workers from several threads.
                if _fork_server_state["server"] is None:
                    _fork_server_state["server"] = _ForkServer(env, self._log)
            self._proc = _ForkedChild(_fork_server_state["server"], env, self._log)
        else:
            # `-m` puts the working directory first on sys.path, before PYTHONPATH: another
            # checkout's worker starts in that checkout, or it would import this one's package.
            self._proc = subprocess.Popen(
                [python or sys.executable, "-m", "bench.worker"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=self._log, text=True, env=env, cwd=checkout)
        self._send({"cmd": "build", "kind": kind, "params": params})
        self.build_reply = None

    def _send(self, request: dict) -> None:
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()

    def _receive(self) -> dict:
        # One request, one reply line: nothing is left buffered between replies, so waiting on
        # the pipe's descriptor is exact.
        ready, _, _ = select.select([self._proc.stdout], [], [], self.timeout_s)
        if not ready:
            self._proc.kill()
            raise WorkerError(f"{self.kind} worker gave no answer in {self.timeout_s:g} s; "
                              "killed it")
        line = self._proc.stdout.readline()
        if not line:
            raise WorkerError(f"{self.kind} worker exited (code {self._proc.wait()}); "
                              f"see {self._log.name}")
        reply = json.loads(line)
        if not reply["ok"]:
            self._log.write(reply.get("traceback", ""))
            self._log.flush()
            raise WorkerError(reply["error"])
        return reply

    def wait_built(self) -> dict:
        """Waits for the build sent at construction; returns its reply (info, timings)."""
        if self.build_reply is None:
            self.build_reply = self._receive()
        return self.build_reply

    def run(self, n: int) -> dict:
        """Runs n units in the child; returns its reply ("seconds", "peak_rss_mb", extras)."""
        self.wait_built()
        self._send({"cmd": "run", "n": n})
        return self._receive()

    def close(self) -> None:
        """Asks the child to exit and waits for it (kills it after 30 s)."""
        if self._proc.poll() is None:
            try:
                self._send({"cmd": "quit"})
                self._proc.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--fork_server"]:
        _fork_server(int(sys.argv[2]))
    else:
        main()
