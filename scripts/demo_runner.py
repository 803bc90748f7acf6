"""Runs `make demo`'s stages: prints each command first, tees its output, times it.

Parent side, `Stages`: every stage's command is printed before it runs, its output is shown
(without TensorFlow's C++ log lines) and written to WORKDIR/logs/STAGE.log, and its wall and
CPU seconds are recorded.

Child side, `python scripts/demo_runner.py` (a JSON list of [stage, argv] on stdin): runs
several `bert-train` commands one after another through the console script's own entry
point, `bert_trainer.cli.main`, so a batch pays TensorFlow's start-up (~3.5 CPU seconds) once
rather than once per command. Between commands it clears what a fresh process would not
have (gin bindings, Keras' session). A marker line before and after each command tells the
parent where a stage's output starts and ends, its exit code and its CPU seconds.
"""

import json
import os
import re
import resource
import shlex
import subprocess
import sys
import time

MARK = "\x1edemo-stage "  # Starts a marker line; \x1e (record separator) never starts a log line.
# TensorFlow's C++ log lines (glog format: "E0000 00:00:17952.. 123 file.cc:52] ...").
_NATIVE_LOG = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ \S+:\d+\]")


class StageError(RuntimeError):
    """A stage's command failed; the message names the stage and its log."""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bert_train_args(command: str, **flags) -> list[str]:
    """`[command, --name=value, ...]`; None and False values are left out, True is `--name`."""
    args = [f"--{k}={v}" for k, v in flags.items() if v is not None and v is not False]
    return [command, *(a.removesuffix("=True") for a in args)]


class Stages:
    """Runs stages in order and keeps their timings.

    Args:
      log_dir: where each stage's full output goes, as STAGE.log.
    """

    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        os.makedirs(log_dir, exist_ok=True)
        self.timings = []  # dicts: stage, seconds (wall), cpu_seconds, status ("ran"/"reused")

    def reuse(self, name: str, what: str) -> None:
        print(f"\n== {name}: reusing {what}", flush=True)
        self.timings.append({"stage": name, "seconds": 0.0, "cpu_seconds": 0.0,
                             "status": "reused"})

    def _ran(self, name: str, wall: float, cpu: float) -> None:
        self.timings.append({"stage": name, "seconds": round(wall, 1),
                             "cpu_seconds": round(cpu, 1), "status": "ran"})

    def run(self, name: str, argv: list[str], shown: list[str]) -> None:
        """Runs `argv` in a child process, printing `shown` (the command as a user types it)."""
        print(f"\n== {name}\n$ {shlex.join(shown)}", flush=True)
        start, cpu = time.perf_counter(), _children_cpu()
        log_path = os.path.join(self.log_dir, f"{name}.log")
        with open(log_path, "w", encoding="utf-8") as log, _spawn(argv) as child:
            for line in child.stdout:
                _show(line, log)
        if child.returncode:
            raise StageError(f"stage {name} failed with exit code {child.returncode}: "
                             f"{shlex.join(shown)}; full log: {log_path}")
        self._ran(name, time.perf_counter() - start, _children_cpu() - cpu)

    def bert_train(self, batch: list[tuple[str, list[str]]]) -> None:
        """Runs `bert-train` commands, [(stage, [command, *flags]), ...], in one child process.

        Raises:
          StageError: a command exited non-zero (the later ones did not run).
        """
        if not batch:
            return
        argv = [sys.executable, os.path.abspath(__file__)]
        shown = {name: shlex.join(["bert-train", *args]) for name, args in batch}
        log, name, start, failed = None, None, 0.0, None
        with _spawn(argv, stdin=json.dumps(batch)) as child:
            for line in child.stdout:
                if not line.strip():  # the newline that puts each marker on a line of its own
                    continue
                if not line.startswith(MARK):
                    _show(line, log)
                    continue
                event, name, *rest = line[len(MARK):].split()
                if event == "start":
                    print(f"\n== {name}\n$ {shown[name]}", flush=True)
                    log = open(os.path.join(self.log_dir, f"{name}.log"), "w", encoding="utf-8")
                    start = time.perf_counter()
                    continue
                log.close()
                log, (rc, cpu) = None, rest
                if int(rc):
                    failed = (name, int(rc))
                else:
                    self._ran(name, time.perf_counter() - start, float(cpu))
        if log is not None:  # The child died inside a command.
            log.close()
            failed = (name, child.returncode)
        if failed or child.returncode:
            name, rc = failed or (name or batch[0][0], child.returncode)
            raise StageError(f"stage {name} failed with exit code {rc}: {shown[name]}; full "
                             f"log: {os.path.join(self.log_dir, name + '.log')}")

    def in_process(self, name: str, description: str, fn):
        """Runs `fn()` here (Python, no TensorFlow) and returns its result."""
        print(f"\n== {name}\n# {description}", flush=True)
        start, cpu = time.perf_counter(), time.process_time()
        result = fn()
        self._ran(name, time.perf_counter() - start, time.process_time() - cpu)
        return result


def _spawn(argv: list[str], stdin: str | None = None) -> subprocess.Popen:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    child = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env, errors="replace")
    if stdin:
        child.stdin.write(stdin)
        child.stdin.close()
    return child


def _show(line: str, log) -> None:
    """Writes a child's line to the stage log, and to the terminal unless it is C++ noise."""
    if log is not None:
        log.write(line)
    if not _NATIVE_LOG.match(line) and "Sharding callback" not in line:
        print("   " + line.rstrip(), flush=True)


def run_batch(batch: list[list]) -> int:
    """Child side: runs each [stage, argv] through `cli.main`; stops at the first failure."""
    from bert_trainer import cli  # noqa: PLC0415 (cli.main imports TensorFlow quietly)

    for index, (name, args) in enumerate(batch):
        if index:  # What the previous command left that a fresh process would not have.
            import gin  # noqa: PLC0415
            import keras  # noqa: PLC0415

            gin.clear_config()
            keras.backend.clear_session()
        print(f"\n{MARK}start {name}", flush=True)  # own line even after a partial one
        cpu = time.process_time()
        rc = cli.main(["bert-train", *args])
        sys.stderr.flush()
        print(f"\n{MARK}end {name} {rc} {time.process_time() - cpu:.2f}", flush=True)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(run_batch(json.load(sys.stdin)))
