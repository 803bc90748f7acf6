"""Measurement method: build in parallel, warm up, then time A/B/A/B round robin; summarize.

Method (the same for every training measurement):
  1. Each variant (implementation x XLA x precision) runs in its own worker process; all are
     built before anything is timed.
  2. Warm-up: each runs `warmup` steps, untimed (tracing, XLA compilation, oneDNN primitive
     creation, allocator growth).
  3. `rounds` rounds; in each, every variant in turn runs `steps` steps, timed inside its
     process, A B C A B C ... so slow drifts of machine load hit every variant alike.
  4. Step time = median over rounds of (round seconds / steps).
"""

import statistics

from bench import spec as spec_lib
from bench.worker import Worker, WorkerError

# Error prefixes that mean "not measured on purpose": a plug-in whose code is not there yet,
# or a point left out to stay within the time budget.
SKIP_PREFIXES = ("NotAvailable", "skipped")


def alternate(workers: list[Worker], *, warmup: int, rounds: int,
              steps: int | list[int]) -> list[dict]:
    """Warms up and times `workers` round robin; a failing worker leaves the rotation.

    Args:
      workers: started workers (their builds may still be running).
      warmup: untimed units per worker before the first round.
      rounds: timed rounds.
      steps: units per worker per round: one count for all, or one per worker.

    Returns:
      One dict per worker: {"build": build reply, "warmup_s": seconds, "runs": [replies]} or
      {"error": message} if it failed.
    """
    counts = steps if isinstance(steps, list) else [steps] * len(workers)
    outcomes = [{"runs": []} for _ in workers]
    for worker, outcome in zip(workers, outcomes, strict=True):
        try:
            outcome["build"] = worker.wait_built()
        except WorkerError as e:
            outcome["error"] = str(e)
    for worker, outcome in zip(workers, outcomes, strict=True):
        if "error" not in outcome and warmup > 0:
            try:
                outcome["warmup_s"] = worker.run(warmup)["seconds"]
            except WorkerError as e:
                outcome["error"] = str(e)
    for _ in range(rounds):
        for worker, outcome, count in zip(workers, outcomes, counts, strict=True):
            if "error" in outcome:
                continue
            try:
                outcome["runs"].append(worker.run(count))
            except WorkerError as e:
                outcome["error"] = str(e)
    return outcomes


def median_unit_seconds(runs: list[dict], units_key: str | None = None,
                        units: int | None = None) -> float:
    """Median over runs of seconds per unit (units from `units_key` of each run, or fixed)."""
    return statistics.median(r["seconds"] / (r[units_key] if units_key else units) for r in runs)


def training_entry(step: spec_lib.StepSpec, implementation: str, outcome: dict,
                   steps: int, group: str, real_token_fraction: float) -> dict:
    """One row of results["training"] from a worker outcome.

    Args:
      step: what was trained.
      implementation: "bert_train" or "keras_hub".
      outcome: from `alternate`.
      steps: steps per round.
      group: "compare", "seq_growth" or "size_growth".
      real_token_fraction: non-padding fraction of the benchmark batches.

    Returns:
      dict with status "ok", "skipped" (see SKIP_PREFIXES) or "failed", and for "ok" the
      median step time, sequences/s, tokens/s, GFLOP/s, params, peak RSS. GFLOP/s count the
      FLOPs the step executes (`executed_flops_per_step`, from the implementation when it
      reports them, else the formula's `flops_per_step`). MFU is added once the matmul peak is
      known (`add_mfu`).
    """
    entry = {
        "group": group, "implementation": implementation, "jit_compile": step.jit_compile,
        "mixed_precision": step.mixed_precision,
        "size": step.size.name, "num_layers": step.size.num_layers,
        "hidden_size": step.size.hidden_size, "batch_size": step.batch_size,
        "seq_length": step.seq_length, "max_predictions": step.max_predictions,
        "flops_per_step": spec_lib.train_flops(step),
        "params_expected": spec_lib.num_params(step.size),
    }
    if "error" in outcome or not outcome["runs"]:
        error = outcome.get("error", "no timed run")
        entry["status"] = "skipped" if error.startswith(SKIP_PREFIXES) else "failed"
        entry["note"] = error
        return entry
    seconds = median_unit_seconds(outcome["runs"], units=steps)
    build = outcome["build"]
    entry.update({
        "status": "ok",
        "step_time_s": seconds,
        "step_times_s": [r["seconds"] / steps for r in outcome["runs"]],
        "sequences_per_s": step.batch_size / seconds,
        "tokens_per_s": step.batch_size * step.seq_length / seconds,
        "real_tokens_per_s": step.batch_size * step.seq_length * real_token_fraction / seconds,
        # What the step executes: bert-train's pretrainer computes its last layer at [CLS] and
        # the masked positions only, so it reports fewer FLOPs than the formula's full model.
        "executed_flops_per_step": build["info"].get("executed_flops_per_step",
                                                     spec_lib.train_flops(step)),
        "params": build["info"].get("params"),
        "build_s": build["build_s"],
        "warmup_s": outcome.get("warmup_s"),
        "rss_after_import_mb": build["rss_after_import_mb"],
        "peak_rss_mb": max(r["peak_rss_mb"] for r in outcome["runs"]),
        "final_loss": outcome["runs"][-1].get("loss"),
    })
    entry.update({k: v for k, v in build["info"].items() if k not in ("params",)})
    entry["gflops"] = entry["executed_flops_per_step"] / seconds / 1e9
    if entry["executed_flops_per_step"] != entry["flops_per_step"]:
        entry["note"] = (f"executes {entry['executed_flops_per_step'] / 1e9:.1f} of the "
                         f"formula's {entry['flops_per_step'] / 1e9:.1f} GFLOP/step")
    return entry


def add_mfu(entries: list[dict], peak_gflops: float | None,
            bf16_peak_gflops: float | None = None) -> None:
    """Sets entry["mfu"] = achieved GFLOP/s / fp32 matmul peak for every measured entry.

    bfloat16 entries also get entry["mfu_bfloat16"], against the bfloat16 matmul peak.
    """
    for entry in entries:
        if entry.get("status") == "ok" and peak_gflops:
            entry["mfu"] = entry["gflops"] / peak_gflops
        if (entry.get("status") == "ok" and bf16_peak_gflops
                and entry.get("mixed_precision") == "bfloat16"):
            entry["mfu_bfloat16"] = entry["gflops"] / bf16_peak_gflops
