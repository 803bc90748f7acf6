"""Shared helpers of the robustness tests, and a toy training run to start as a subprocess.

As a script it trains the toy task (tests/toy_task.py) the way a `bert-train` command does:
through `commands.run_command`, so a clean stop exits with `EXIT_PREEMPTED` and one line.

    python tests/robust_testing.py --spec='{"model_dir": ..., "trainer": {...}, ...}'

spec keys: model_dir; trainer, task, optimizer: keyword arguments of TrainerConfig, ToyConfig
and OptimizerConfig; strategy: "default" or "multi_worker_mirrored" (reads TF_CONFIG);
weights: an .npz path for the final trainable weights; probe: a file that gets the number of
training batches made so far; delay: seconds each training batch takes to make (so that a
test can signal a run mid-loop).
"""

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time

TESTS = pathlib.Path(__file__).resolve().parent
REPO = TESTS.parent
RESULT = "RESULT "


# ------------------------------------------------------------------------ used by the tests

def subprocess_env(**extra) -> dict:
    """The environment of a toy-run subprocess: quiet TensorFlow, tests/ and the repo importable."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([str(TESTS), str(REPO)]))
    env.update(extra)
    return env


def start_toy_run(spec: dict, log_path, **env) -> subprocess.Popen:
    """Starts `python tests/robust_testing.py --spec=...` with stdout+stderr to `log_path`."""
    log = open(log_path, "w")  # noqa: SIM115 (the child owns it; closed when the test ends)
    return subprocess.Popen([sys.executable, str(TESTS / "robust_testing.py"),
                             f"--spec={json.dumps(spec)}"], stdout=log, stderr=subprocess.STDOUT,
                            env=subprocess_env(**env))


def wait_for(condition, timeout: float, what: str, poll: float = 0.05):
    """Polls `condition()` until it returns something truthy; fails the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def batches_made(probe) -> int:
    """The count a probed run last wrote to its probe file (0 before the first batch)."""
    try:
        return int(pathlib.Path(probe).read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def checkpoint_steps(model_dir) -> list[int]:
    """The steps of the complete (indexed) ckpt-N checkpoints in `model_dir`, ascending."""
    names = os.listdir(model_dir) if os.path.isdir(model_dir) else []
    return sorted(int(n[len("ckpt-"):-len(".index")]) for n in names
                  if n.startswith("ckpt-") and n.endswith(".index"))


def result_line(log_path) -> dict:
    """The RESULT json a finished toy run printed."""
    lines = [line for line in pathlib.Path(log_path).read_text().splitlines()
             if line.startswith(RESULT)]
    assert lines, pathlib.Path(log_path).read_text()[-3000:]
    return json.loads(lines[-1][len(RESULT):])


def load_weights(path) -> list:
    import numpy as np  # noqa: PLC0415

    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def max_difference(a, b) -> float:
    import numpy as np  # noqa: PLC0415

    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


def tree_digest(directory) -> dict[str, str]:
    """{relative path: sha256} of every file under `directory` ({} when it does not exist)."""
    digests = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                digests[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return digests


# ----------------------------------------------------------------- the toy run (subprocess)

def probed_task(task_config, probe: str | None = None, delay: float = 0.0, on_batch=None):
    """A ToyTask whose training input calls back (in Python) as it makes each batch.

    Args:
        task_config: the ToyConfig.
        probe: a file that gets the number of batches made so far.
        delay: seconds to sleep per batch (makes a loop slow enough to signal mid-way).
        on_batch: `on_batch(n)` after the n-th batch (1-based) is made.
    """
    import tensorflow as tf  # noqa: PLC0415
    from toy_task import ToyTask  # noqa: PLC0415

    class ProbedToyTask(ToyTask):
        def build_inputs(self, split, input_context, *, is_training):
            dataset = super().build_inputs(split, input_context, is_training=is_training)
            if not is_training:
                return dataset

            def touch(index):
                time.sleep(delay)
                if probe:
                    pathlib.Path(probe).write_text(str(int(index) + 1))
                if on_batch:
                    on_batch(int(index) + 1)
                return index

            def probed(index, batch):
                done = tf.py_function(touch, [index], tf.int64)
                with tf.control_dependencies([done]):  # the batch waits for the callback
                    return {k: tf.identity(v) for k, v in batch.items()}

            return dataset.enumerate().map(probed)

    return ProbedToyTask(task_config)


def main(argv) -> int:
    from absl import flags  # noqa: PLC0415

    spec = json.loads(flags.FLAGS.spec)
    del argv
    import tensorflow as tf  # noqa: PLC0415

    # A MultiWorkerMirroredStrategy must exist before any other TensorFlow op runs.
    strategy = (tf.distribute.MultiWorkerMirroredStrategy()
                if spec.get("strategy") == "multi_worker_mirrored" else None)
    import numpy as np  # noqa: PLC0415
    from toy_task import ToyConfig  # noqa: PLC0415

    from bert_trainer import training  # noqa: PLC0415
    from bert_trainer.errors import EXIT_NONFINITE  # noqa: PLC0415

    task = probed_task(ToyConfig(**spec.get("task", {})), spec.get("probe"),
                       spec.get("delay", 0.0))
    trainer = training.Trainer(
        task, spec["model_dir"], config=training.TrainerConfig(**spec["trainer"]),
        optimizer=training.OptimizerConfig(**spec.get("optimizer", {})), strategy=strategy)
    print(f"STARTED at step {int(trainer.global_step.numpy())}", flush=True)
    try:
        result = trainer.train_and_evaluate()
    except training.NonFiniteError as e:
        print(f"toy: error: {e}", file=sys.stderr)
        return EXIT_NONFINITE
    if spec.get("weights"):
        np.savez(spec["weights"], *[v.numpy() for v in trainer.model.trainable_variables])
    print(RESULT + json.dumps({"step": result.step, "loss": result.train.get("loss"),
                               "chief": trainer.is_chief}), flush=True)
    return 0


def run_cli_batch(cases: list[list[str]]) -> list[dict]:
    """Runs `bert-train ARGS...` cases one after another in this process (`cli.main`).

    Returns:
        [{"rc", "stderr"}] per case; stderr is captured at the file-descriptor level, so
        anything native code or a logging handler writes is in it too. An exception escaping
        `cli.main` gives rc "uncaught" and its traceback in stderr.
    """
    import tempfile  # noqa: PLC0415
    import traceback  # noqa: PLC0415

    from bert_trainer import cli  # noqa: PLC0415

    results = []
    for args in cases:
        sys.stderr.flush()
        saved = os.dup(2)
        with tempfile.TemporaryFile() as captured:
            os.dup2(captured.fileno(), 2)
            try:
                rc = cli.main(["bert-train", *args])
            except BaseException:  # noqa: BLE001 (an escaped exception is what a case reports)
                rc = "uncaught"
                traceback.print_exc()  # into the captured stderr
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
            captured.seek(0)
            results.append({"rc": rc, "stderr": captured.read().decode(errors="replace")})
    return results


if __name__ == "__main__" and sys.argv[1:2] == ["--cli_batch"]:
    # Cases as JSON on stdin; results as one RESULT line (see run_cli_batch).
    sys.path[:0] = [str(TESTS), str(REPO)]
    print(RESULT + json.dumps(run_cli_batch(json.load(sys.stdin))), flush=True)
elif __name__ == "__main__":
    sys.path[:0] = [str(TESTS), str(REPO)]
    from absl import flags

    from bert_trainer.commands import run_command

    flags.DEFINE_string("spec", "{}", "the run, as JSON (see the module docstring)")
    sys.exit(run_command(sys.modules[__name__], ["toy", *sys.argv[1:]]))
