#!/usr/bin/env python3
"""Launches N local workers of a multi-worker run, each with its own TF_CONFIG.

  scripts/launch_workers.py --num_workers=2 -- \\
      bert-train pretrain --strategy=multi_worker_mirrored --gin_file=configs/smoke.gin \\
      --model_dir=runs/mw --train_data='data/train-*.tfrecord' --vocab_file=vocab.txt

Every worker runs the same command; worker 0 is the chief (it writes `model_dir`). The
cluster lives on 127.0.0.1 with distinct free ports (or --base_port, --base_port+1, ...).
Each output line is prefixed with "[worker i]". SIGTERM/SIGINT sent to this launcher are
forwarded to every worker, so they all stop at the same step and checkpoint (see
bert_trainer/training/preemption.py). When a worker fails, the others cannot go on without
it (their collective ops wait for it): they get --failure_grace seconds to exit on their own,
then SIGTERM, then SIGKILL. Exit code: 0 when all succeed, else the first failing worker's
(a signal's number as 128 + N).
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports that are free on `host` now (held open until all are chosen)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def tf_config(addresses: list[str], index: int) -> str:
    """The TF_CONFIG of worker `index` in a cluster of `addresses` ("host:port" each)."""
    return json.dumps({"cluster": {"worker": list(addresses)},
                       "task": {"type": "worker", "index": index}})


def start_workers(command: list[str], addresses: list[str], stdout=None) -> list[subprocess.Popen]:
    """Starts one process per address running `command` with its TF_CONFIG.

    Args:
        command: the program and its arguments.
        addresses: "host:port" of every worker, worker 0 (the chief) first.
        stdout: where the workers write (default: a pipe each, read by `relay_output`).

    Returns:
        The processes, in worker order.
    """
    workers = []
    for index in range(len(addresses)):
        env = dict(os.environ, TF_CONFIG=tf_config(addresses, index))
        workers.append(subprocess.Popen(
            command, env=env, text=True, stdout=stdout or subprocess.PIPE,
            stderr=subprocess.STDOUT if stdout is None else None))
    return workers


def relay_output(workers: list[subprocess.Popen]) -> list[threading.Thread]:
    """Copies each worker's output to ours, line by line, prefixed with "[worker i]"."""
    def relay(index, stream):
        for line in stream:
            sys.stdout.write(f"[worker {index}] {line}")
            sys.stdout.flush()

    threads = [threading.Thread(target=relay, args=(i, w.stdout), daemon=True)
               for i, w in enumerate(workers) if w.stdout is not None]
    for thread in threads:
        thread.start()
    return threads


def wait_for_workers(workers: list[subprocess.Popen], failure_grace: float) -> int:
    """Waits for every worker; after a failure, stops the rest. Returns the exit code."""
    failed, failed_at = None, None
    while any(w.poll() is None for w in workers):
        if failed is None:
            failed = _first_failure(workers, failure_grace)
            failed_at = time.monotonic()
        elif time.monotonic() - failed_at > failure_grace:
            _stop(workers)
            break
        time.sleep(0.2)
    for w in workers:
        w.wait()
    if failed is None:
        failed = _first_failure(workers, failure_grace=None)
    if failed is None:
        return 0
    code = workers[failed].returncode
    return code if code > 0 else 128 - code  # killed by signal N: 128 + N, like a shell


def _first_failure(workers: list[subprocess.Popen], failure_grace: float | None) -> int | None:
    """The index of the first worker that exited non-zero (announced on stderr), or None."""
    for i, w in enumerate(workers):
        if w.returncode not in (None, 0):
            grace = (f"; the others get {failure_grace:.0f} s to finish"
                     if failure_grace is not None else "")
            print(f"launch_workers: worker {i} exited with {w.returncode}{grace}",
                  file=sys.stderr, flush=True)
            return i
    return None


def _stop(workers: list[subprocess.Popen], timeout: float = 30.0) -> None:
    """SIGTERM to the workers still running, then SIGKILL to those that ignore it."""
    running = [w for w in workers if w.poll() is None]
    for w in running:
        w.terminate()
    deadline = time.monotonic() + timeout
    for w in running:
        try:
            w.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            w.kill()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     usage="%(prog)s [--num_workers=N] -- COMMAND [ARGS...]")
    parser.add_argument("--num_workers", type=int, default=2, help="workers to launch (>= 1)")
    parser.add_argument("--base_port", type=int, default=None,
                        help="use ports base_port, base_port+1, ... (default: free ports)")
    parser.add_argument("--failure_grace", type=float, default=60.0,
                        help="seconds the other workers get after one fails")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command every worker runs")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --, e.g. -- bert-train pretrain ...")
    if args.num_workers < 1:
        parser.error(f"--num_workers={args.num_workers} must be >= 1")
    ports = (free_ports(args.num_workers) if args.base_port is None
             else [args.base_port + i for i in range(args.num_workers)])
    addresses = [f"127.0.0.1:{port}" for port in ports]
    print(f"launch_workers: {args.num_workers} worker(s) on {', '.join(addresses)}; worker 0 is "
          "the chief", flush=True)
    try:
        workers = start_workers(command, addresses)
    except OSError as e:
        print(f"launch_workers: error: cannot run {command[0]!r} ({e.strerror})", file=sys.stderr)
        return 2
    threads = relay_output(workers)

    def forward(signum, frame):
        del frame
        for w in workers:
            if w.poll() is None:
                w.send_signal(signum)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, forward)
    code = wait_for_workers(workers, args.failure_grace)
    for thread in threads:
        thread.join(timeout=5)
    return code


if __name__ == "__main__":
    sys.exit(main())
