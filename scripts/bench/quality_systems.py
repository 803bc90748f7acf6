"""How each system of the pretraining-quality benchmark pretrains for a wall-clock budget.

Every system runs in its own process, launched by the harness; its budgets count from the
launch (start-up, data loading and tracing included, as a user waits for them). Each is first
run for a few steps (calibration) to learn its step rate, so that its learning-rate schedule
can end where its largest budget does: `max_steps = rate * (budget - start-up)`.

- bert-train: `bert-train pretrain` (configs/mini.gin: the BERT recipe; configs/cram.gin: the
  budget recipe; ablations add gin bindings), checkpointing every few seconds; the snapshot of
  a budget is the last checkpoint written by then (its file time). The run is stopped with
  SIGTERM (bert-train checkpoints and exits) if it has not finished at the largest budget.
- pytorch (`quality_torch.py`, in the PyTorch interpreter) and keras-hub
  (`quality_keras_hub.py`) save their snapshots themselves when a budget's time is up.
"""

import dataclasses
import glob
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = pathlib.Path(__file__).resolve().parent
RATE = re.compile(r"\| ([0-9.]+) steps/s \|")

# Recipe name -> (gin file, extra bindings). Each ablation reverts one switch of cram.gin.
RECIPES = {
    "bert": ("configs/mini.gin", ()),
    "cram": ("configs/cram.gin", ()),
    "cram-post_norm": ("configs/cram.gin", ("build_encoder.norm_first = False",)),
    "cram+nsp": ("configs/cram.gin", ("PretrainingConfig.use_next_sentence_label = True",)),
    "cram+dropout": ("configs/cram.gin", ("build_encoder.output_dropout = 0.1",
                                          "build_encoder.attention_dropout = 0.1")),
    "cram-one_cycle": ("configs/cram.gin", ("OptimizerConfig.schedule = 'bert'",
                                            "OptimizerConfig.warmup_fraction = 0.1")),
    "cram-adam": ("configs/cram.gin", ("OptimizerConfig.beta_2 = 0.999",
                                       "OptimizerConfig.epsilon = 1e-6",
                                       "OptimizerConfig.clip_norm = 1.0")),
}
WORKERS = {"pytorch": "quality_torch.py", "keras-hub": "quality_keras_hub.py"}


@dataclasses.dataclass(frozen=True)
class Setup:
    """What every system shares: sizes, data shape, budgets."""

    sizes: dict  # hidden_size, num_layers, num_attention_heads, inner_dim, max_sequence_length
    seq_length: int
    max_predictions: int
    batch_size: int
    learning_rate: float  # the BERT recipe's peak (pytorch, keras-hub, bert-train bert)
    budgets_s: tuple[float, ...]
    calibrate_steps: int  # at least 2 loops of 10: the first one's rate includes tracing
    checkpoint_seconds: float
    planned_steps: int | None = None  # given: no calibration, the schedule ends here
    seed: int = 1


def size_bindings(setup: Setup) -> list[str]:
    return [f"build_encoder.{k} = {v}" for k, v in setup.sizes.items()]


def _wait_until(process: subprocess.Popen, deadline: float) -> bool:
    """Waits for `process` until `deadline` (epoch seconds); True when it exited."""
    try:
        process.wait(timeout=max(0.0, deadline - time.time()))
        return True
    except subprocess.TimeoutExpired:
        return False


def bert_train_pretrain(recipe: str, data, setup: Setup, out_dir: str, log) -> dict:
    """Pretrains with a bert-train recipe; returns {"snapshots": [...], "steps", "rate"}."""
    gin_file, extra = RECIPES[recipe]
    common = [f"--gin_file={gin_file}", f"--train_data={data.train_glob}",
              f"--vocab_file={data.vocab_file}"]
    bindings = [*size_bindings(setup), f"build_encoder.vocab_size = {data.vocab_size}",
                f"PretrainingConfig.seq_length = {setup.seq_length}",
                f"PretrainingConfig.max_predictions_per_seq = {setup.max_predictions}",
                f"PretrainingConfig.train_batch_size = {setup.batch_size}",
                "TrainerConfig.eval_interval = None", "TrainerConfig.eval_steps = 0",
                "TrainerConfig.steps_per_loop = 10", "TrainerConfig.summary_interval = 10",
                f"TrainerConfig.seed = {setup.seed}", *extra]

    def run(model_dir, steps, interval):
        args = [*common, f"--model_dir={model_dir}",
                *(f"--gin_param={b}" for b in bindings),
                f"--gin_param=TrainerConfig.train_steps = {steps}",
                f"--gin_param=TrainerConfig.checkpoint_interval = {interval}",
                "--gin_param=TrainerConfig.max_checkpoints = 100000"]
        log_file = open(model_dir + ".log", "w")  # noqa: SIM115 - closed by the caller
        launched = time.time()
        process = subprocess.Popen([sys.executable, "-m", "bert_trainer.cli", "pretrain", *args],
                                   cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT)
        return process, launched, log_file

    if setup.planned_steps:  # about 20 checkpoints, every 10 steps at most
        rate, steps = None, setup.planned_steps
        interval = max(10, steps // 200 * 10)
    else:
        calibration = os.path.join(out_dir, "calibrate")
        process, launched, log_file = run(calibration, setup.calibrate_steps, 10_000)
        code = process.wait()
        log_file.close()
        wall = time.time() - launched
        rates = [float(r) for r in RATE.findall(pathlib.Path(calibration + ".log").read_text())]
        if code or not rates:
            raise RuntimeError(f"bert-train {recipe}: calibration failed ({code}); see "
                               f"{calibration}.log")
        rate = rates[-1]
        steps = _planned_steps(rate, wall, setup)
        interval = max(10, round(rate * setup.checkpoint_seconds / 10) * 10)
        log(f"bert-train {recipe}: {rate:.2f} steps/s, start-up "
            f"{wall - setup.calibrate_steps / rate:.0f} s -> {steps} steps, a checkpoint every "
            f"{interval}")
    model_dir = os.path.join(out_dir, "run")
    process, launched, log_file = run(model_dir, steps, interval)
    if not _wait_until(process, launched + max(setup.budgets_s)):
        process.send_signal(signal.SIGTERM)  # bert-train checkpoints, then exits
        process.wait()
    log_file.close()
    return {"snapshots": _snapshots(model_dir, launched, setup.budgets_s), "rate": rate,
            "planned_steps": steps}


def _planned_steps(rate: float, calibration_wall: float, setup: Setup) -> int:
    startup = max(0.0, calibration_wall - setup.calibrate_steps / rate)
    return max(setup.calibrate_steps, int(rate * (max(setup.budgets_s) - startup)))


def _snapshots(model_dir: str, launched: float, budgets_s) -> list[dict]:
    """For each budget, the last checkpoint of `model_dir` written by then (or None)."""
    written = []
    for index in glob.glob(os.path.join(model_dir, "ckpt-*.index")):
        step = int(re.search(r"ckpt-(\d+)\.index$", index).group(1))
        written.append((os.path.getmtime(index) - launched, step, index[:-len(".index")]))
    written.sort()
    snapshots = []
    for budget in sorted(budgets_s):
        done = [w for w in written if w[0] <= budget]
        if done:
            elapsed, step, prefix = done[-1]
            snapshots.append({"seconds": budget, "step": step, "elapsed": elapsed,
                              "dir": prefix})
        else:
            snapshots.append({"seconds": budget, "step": None, "elapsed": None, "dir": None})
    return snapshots


def worker_pretrain(system: str, data, setup: Setup, out_dir: str, python: str, log) -> dict:
    """Pretrains pytorch or keras-hub in its worker; returns as `bert_train_pretrain`."""
    params = {"train_npz": data.train_npz, "vocab_file": data.vocab_file,
              "vocab_size": data.vocab_size, "sizes": setup.sizes,
              "batch_size": setup.batch_size, "learning_rate": setup.learning_rate,
              "max_predictions": setup.max_predictions, "seed": setup.seed, "out_dir": out_dir}

    def run(name, deadline_s, **extra):
        params_file = os.path.join(out_dir, f"{name}_params.json")
        result_file = os.path.join(out_dir, f"{name}_result.json")
        launched = time.time()
        with open(params_file, "w") as f:
            json.dump({**params, **extra, "launched": launched}, f)
        with open(os.path.join(out_dir, f"{name}.log"), "w") as log_file:
            process = subprocess.Popen([python, str(BENCH / WORKERS[system]), params_file,
                                        result_file], cwd=out_dir, stdout=log_file,
                                       stderr=subprocess.STDOUT)
            if not _wait_until(process, launched + deadline_s):
                process.kill()
                process.wait()
        if process.returncode:
            raise RuntimeError(f"{system}: {name} failed ({process.returncode}); see "
                               f"{out_dir}/{name}.log")
        with open(result_file) as f:
            return json.load(f), time.time() - launched

    if setup.planned_steps:
        rate, steps = None, setup.planned_steps
    else:
        result, wall = run("calibrate", 1800, calibrate_steps=setup.calibrate_steps)
        rate = result["steps_per_s"]
        steps = _planned_steps(rate, wall, setup)
        log(f"{system}: {rate:.2f} steps/s, start-up {wall - setup.calibrate_steps / rate:.0f} "
            f"s -> {steps} steps")
    result, _ = run("run", max(setup.budgets_s) + 1800, budgets_s=list(setup.budgets_s),
                    max_steps=steps)
    snapshots = {s["seconds"]: s for s in result["snapshots"]}
    return {"snapshots": [snapshots.get(b, {"seconds": b, "step": None, "elapsed": None,
                                            "dir": None}) for b in sorted(setup.budgets_s)],
            "rate": rate, "planned_steps": steps}
