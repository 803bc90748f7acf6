"""How each system of the pretraining-quality benchmark pretrains for a wall-clock budget.

Every system runs in its own process, launched by the harness.

- bert-train: `bert-train pretrain --time_budget` (configs/mini.gin: the BERT recipe;
  configs/cram.gin: the budget recipe; ablations add gin bindings), one run per budget: its
  learning-rate schedule runs on the fraction of the budget spent, so each snapshot is a run
  whose schedule ended with its budget, whatever the step rate (no calibration, no planned
  step count). The snapshot is the checkpoint the run writes when its budget is spent. The
  budget counts the training loop (the first step's tracing included); the start-up before
  it (imports, input, model: `startup` in the snapshot, seconds) does not, as for a user of
  `--time_budget`; `elapsed` is the launch to the final checkpoint.
- pytorch (`quality_torch.py`, in the PyTorch interpreter) and keras-hub
  (`quality_keras_hub.py`): the same, one run per budget: each worker's learning rate is set
  before every step from the fraction of its budget spent (linear warmup, linear decay to 0
  at the budget), its budget counts its training loop (from the loop's start; the start-up
  before it recorded as `startup`), and it stops at the first step past the budget and saves
  that model. So every system's schedule ends at its budget, and its time is counted alike.
"""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = pathlib.Path(__file__).resolve().parent

# Recipe name -> (gin file, extra bindings). Each ablation reverts one switch of cram.gin.
RECIPES = {
    "bert": ("configs/mini.gin", ()),
    "bert+nsp": ("configs/mini.gin", ("PretrainingConfig.use_next_sentence_label = True",)),
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
    """Pretrains with a bert-train recipe, one `--time_budget` run per budget; returns
    {"snapshots": [...], "rate": None, "planned_steps": None} (no calibration)."""
    gin_file, extra = RECIPES[recipe]
    bindings = [*size_bindings(setup), f"build_encoder.vocab_size = {data.vocab_size}",
                f"PretrainingConfig.seq_length = {setup.seq_length}",
                f"PretrainingConfig.max_predictions_per_seq = {setup.max_predictions}",
                f"PretrainingConfig.train_batch_size = {setup.batch_size}",
                "TrainerConfig.eval_interval = None", "TrainerConfig.eval_steps = 0",
                "TrainerConfig.steps_per_loop = 10", "TrainerConfig.summary_interval = 10",
                f"TrainerConfig.seed = {setup.seed}", *extra]
    snapshots = []
    for budget in sorted(setup.budgets_s):
        model_dir = os.path.join(out_dir, f"run-{budget:g}s")
        args = [f"--gin_file={gin_file}", f"--train_data={data.train_glob}",
                f"--vocab_file={data.vocab_file}", f"--model_dir={model_dir}",
                f"--time_budget={budget:g}s", *(f"--gin_param={b}" for b in bindings)]
        launched = time.time()
        with open(model_dir + ".log", "w") as log_file:
            process = subprocess.Popen(
                [sys.executable, "-m", "bert_trainer.cli", "pretrain", *args], cwd=REPO,
                stdout=log_file, stderr=subprocess.STDOUT)
            if not _wait_until(process, launched + budget + 1800):
                process.kill()
                process.wait()
        if process.returncode:
            raise RuntimeError(f"bert-train {recipe}: its {budget:g} s run failed "
                               f"({process.returncode}); see {model_dir}.log")
        snapshot = budget_snapshot(model_dir, launched, budget)
        log(f"bert-train {recipe}: {budget / 60:g} min bought {snapshot['step']} steps "
            f"(start-up {snapshot['startup']:.0f} s)")
        snapshots.append(snapshot)
    return {"snapshots": snapshots, "rate": None, "planned_steps": None}


def budget_snapshot(model_dir: str, launched: float, budget_s: float) -> dict:
    """The snapshot of a `--time_budget` run: its final checkpoint, the steps its budget
    bought (bert_train.json's "time_budget"), the seconds from the launch to that checkpoint
    and the start-up before its training loop."""
    with open(os.path.join(model_dir, "bert_train.json")) as f:
        record = json.load(f)["time_budget"]
    prefix = os.path.join(model_dir, f"ckpt-{record['steps']}")
    elapsed = os.path.getmtime(prefix + ".index") - launched
    return {"seconds": budget_s, "step": record["steps"], "elapsed": elapsed, "dir": prefix,
            "startup": elapsed - record["elapsed_seconds"],
            "loop_seconds": record["elapsed_seconds"]}


def worker_pretrain(system: str, data, setup: Setup, out_dir: str, python: str, log) -> dict:
    """Pretrains pytorch or keras-hub in its worker, one run per budget; returns as
    `bert_train_pretrain`."""
    params = {"train_npz": data.train_npz, "vocab_file": data.vocab_file,
              "vocab_size": data.vocab_size, "sizes": setup.sizes,
              "batch_size": setup.batch_size, "learning_rate": setup.learning_rate,
              "max_predictions": setup.max_predictions, "seed": setup.seed, "out_dir": out_dir}
    snapshots = []
    for budget in sorted(setup.budgets_s):
        snapshot = run_worker(python, WORKERS[system], {**params, "budget_s": budget},
                              out_dir, f"run-{budget:g}s")
        log(f"{system}: {budget / 60:g} min bought {snapshot['step']} steps "
            f"(start-up {snapshot['startup']:.0f} s)")
        snapshots.append(snapshot)
    return {"snapshots": snapshots, "rate": None, "planned_steps": None}


def run_worker(python: str, worker: str, params: dict, out_dir: str, name: str) -> dict:
    """Runs `worker` (a script beside this one) on `params` in `python`; returns its result."""
    params_file = os.path.join(out_dir, f"{name}_params.json")
    result_file = os.path.join(out_dir, f"{name}_result.json")
    launched = time.time()
    with open(params_file, "w") as f:
        json.dump({**params, "launched": launched}, f)
    with open(os.path.join(out_dir, f"{name}.log"), "w") as log_file:
        process = subprocess.Popen([python, str(BENCH / worker), params_file, result_file],
                                   cwd=out_dir, stdout=log_file, stderr=subprocess.STDOUT)
        if not _wait_until(process, launched + params["budget_s"] + 1800):
            process.kill()
            process.wait()
    if process.returncode:
        raise RuntimeError(f"{worker}: {name} failed ({process.returncode}); see "
                           f"{out_dir}/{name}.log")
    with open(result_file) as f:
        return json.load(f)
