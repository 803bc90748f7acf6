"""One measurement per process: the worker loop (child side) and its client (parent side).

Each measured thing (a training step, the matmul peak, the input pipeline, a tokenizer) lives
in its own Python process so that (1) its peak RSS (`ru_maxrss`, a high-water mark that never
goes down) is its own, and (2) several steps can be kept built and warm at once while the parent
alternates between them A/B/A/B. An idle worker blocks on its stdin pipe and uses no CPU, so
alternation does not make the measured process share the cores with the others.

Protocol: JSON lines. The parent sends {"cmd": "build", "kind": K, "params": {...}} once, then
{"cmd": "run", "n": N} any number of times, then {"cmd": "quit"}. Every reply is one JSON line;
`run` replies carry the wall seconds of the N units measured inside the child (no pipe latency).
"""

import gc
import json
import os
import pathlib
import resource
import select
import subprocess
import sys
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
        self._proc = subprocess.Popen(
            [python or sys.executable, "-m", "bench.worker"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log, text=True, env=env)
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
    main()
