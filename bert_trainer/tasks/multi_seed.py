"""Multi-seed fine-tuning: one run per seed, and the spread of their evaluation metrics.

A fine-tuning score moves with the random seed (Dodge et al. 2020, "Fine-Tuning Pretrained
Language Models: Weight Initializations, Data Orders, and Early Stopping"), so one number can
mislead. `bert-train finetune --seeds=1,2,3` (or `--num_seeds=N`, the seeds 1..N) runs the
same fine-tune once per seed and reports each metric's mean and spread:

```
MODEL_DIR/multi_seed.json   written first, it makes MODEL_DIR a multi-seed run's:
                            {"format": "bert_train_multi_seed", "version": 1,
                             "config": {...the run's flags...},
                             "seeds": {"1": {"init_seed": ..., "data_seed": ...}, ...}}
MODEL_DIR/seed-N/           a whole single-seed finetune model directory (checkpoints, lock,
                            bert_train.json, operative_config.gin, eval_results.json)
MODEL_DIR/eval_results.json each seed's metrics and, per metric, mean, sample standard
                            deviation (n - 1), min and max
MODEL_DIR/.bert_train.lock  while the run trains
```

Seeds. A run seed `s` is split into two independent streams with NumPy's `SeedSequence`
(`init_seed = SeedSequence([s, 0])`, `data_seed = SeedSequence([s, 1])`, one 32-bit word each):
`init_seed` is `TrainerConfig.seed` (it seeds Keras' generator before the model is built: the
head's initial weights and the dropout masks; the warm-started encoder is not random) and
`data_seed` is `FinetuneConfig.seed` (the training data's shuffle order). So two run seeds never
share a stream, and one stream never equals the other's (seed 1's data order is not seed 2's
initialization). Both are bound as gin parameters, so each seed-N/operative_config.gin records
them; multi_seed.json and eval_results.json list them too.

Resume: a seed is finished when seed-N/eval_results.json holds the evaluation of the run's eval
file at its final step; a rerun skips finished seeds and resumes a half-done one from its last
checkpoint (a seed trained to the end is only evaluated again).

A multi-seed MODEL_DIR belongs to one run: its seeds share one configuration (the flags in
multi_seed.json; a rerun with others is refused, adding seeds is not), a single-seed run's
directory is refused as a multi-seed parent and the reverse, and commands that read one model
(evaluate, export, predict) are told to pass `--model_dir=MODEL_DIR/seed-N`. Reading that
layout and deciding whose a directory is lives with the model directory
(`bert_trainer/checkpoints/multi_seed_dir.py`); its names are re-exported here.
"""

import json
import math
import os
import re
import statistics

import numpy as np

from bert_trainer import outputs
from bert_trainer.checkpoints.multi_seed_dir import (
    EVAL_RESULTS_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_FILE,
    check_multi_seed_dir,
    check_single_run_dir,
    read_manifest,
    refuse_parent,
    seed_dir,
)
from bert_trainer.errors import UserError

STD_KIND = "sample standard deviation (n - 1 denominator)"
_INIT_STREAM, _DATA_STREAM = 0, 1

__all__ = [
    "EVAL_RESULTS_FILE", "FORMAT_NAME", "FORMAT_VERSION", "MANIFEST_FILE", "STD_KIND",
    "aggregate", "check_multi_seed_dir", "check_single_run_dir", "derived_seeds",
    "finished_results", "format_metric", "gin_bindings", "parse_seeds", "read_manifest",
    "refuse_parent", "seed_dir", "write_manifest", "write_results"]


# -- which seeds --------------------------------------------------------------------------

def parse_seeds(seeds: list[str] | None, num_seeds: int | None) -> list[int] | None:
    """The run seeds of `--seeds` / `--num_seeds`; None when neither is given.

    Args:
      seeds: --seeds as absl's list flag gives it (strings), or None.
      num_seeds: --num_seeds, or None. It means the seeds 1..num_seeds.

    Returns:
      The seeds in the order given, or None for a single-seed run.

    Raises:
      UserError: both flags, an empty list, a seed that is not an integer >= 0, a repeated
        seed, or num_seeds < 1.
    """
    if seeds is not None and num_seeds is not None:
        raise UserError("--seeds and --num_seeds are exclusive: --num_seeds=N means "
                        "--seeds=1,...,N; pass one of them")
    if num_seeds is not None:
        if num_seeds < 1:
            raise UserError(f"--num_seeds={num_seeds} must be >= 1 (it runs the seeds 1..N)")
        return list(range(1, num_seeds + 1))
    if seeds is None:
        return None
    parsed = []
    for text in seeds:
        text = text.strip()
        if not re.fullmatch(r"\d+", text):
            raise UserError(f"--seeds={','.join(seeds)}: {text!r} is not a seed; give integers "
                            ">= 0, e.g. --seeds=1,2,3")
        if int(text) in parsed:
            raise UserError(f"--seeds={','.join(seeds)} lists {int(text)} twice; each seed "
                            "runs once")
        parsed.append(int(text))
    if not parsed:
        raise UserError("--seeds is empty; give integers >= 0, e.g. --seeds=1,2,3")
    return parsed


def derived_seeds(seed: int) -> dict[str, int]:
    """The two streams of run seed `seed` (see the module docstring).

    Returns:
      {"init_seed": TrainerConfig.seed, "data_seed": FinetuneConfig.seed}, each in [0, 2**32).
    """
    return {name: int(np.random.SeedSequence([seed, stream]).generate_state(1)[0])
            for name, stream in (("init_seed", _INIT_STREAM), ("data_seed", _DATA_STREAM))}


def gin_bindings(seed: int) -> list[str]:
    """The gin bindings that make a fine-tune run seed `seed`."""
    derived = derived_seeds(seed)
    return [f"TrainerConfig.seed = {derived['init_seed']}",
            f"FinetuneConfig.seed = {derived['data_seed']}"]


# -- the manifest -------------------------------------------------------------------------

def write_manifest(model_dir: str, config: dict, seeds: list[int],
                   previous: dict | None) -> str:
    """Writes MODEL_DIR/multi_seed.json (aside, then renamed): the config and every seed run.

    Args:
      model_dir: the parent directory.
      config: the run's configuration (see `check_multi_seed_dir`).
      seeds: this invocation's seeds; those of `previous` are kept.
      previous: the manifest read before, or None.

    Returns:
      The path written.
    """
    known = {int(s) for s in (previous or {}).get("seeds", {})} | set(seeds)
    manifest = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "config": config,
                "seed_derivation": "init_seed = SeedSequence([seed, 0]), data_seed = "
                                   "SeedSequence([seed, 1]) (numpy), one 32-bit word each",
                "seeds": {str(s): derived_seeds(s) for s in sorted(known)}}
    path = os.path.join(model_dir, MANIFEST_FILE)
    with outputs.new_file(path, writing="the multi-seed manifest") as f:
        f.write(json.dumps(manifest, indent=2) + "\n")
    return path


# -- resume -------------------------------------------------------------------------------

def finished_results(model_dir: str, seed: int, final_step: int,
                     eval_file: str | None = None) -> dict | None:
    """Seed `seed`'s eval_results.json when it holds the run's evaluation at `final_step`.

    Args:
      model_dir: the parent directory.
      seed: the run seed.
      final_step: the run's last step.
      eval_file: the run's --eval_file (None: the TFDS split); results of another file
        (`evaluate --eval_file=...` on the seed's directory) are not the run's.

    Returns:
      The record, or None for a half-done seed (no results yet, or results of an earlier step
      or another file): the run resumes it (a trained seed is only evaluated again).
    """
    path = os.path.join(seed_dir(model_dir, seed), EVAL_RESULTS_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("step") != final_step:
        return None
    if not isinstance(record.get("metrics"), dict):
        return None
    written = record.get("eval_file")
    if (written is None) != (eval_file is None) or (
            written is not None and os.path.abspath(written) != os.path.abspath(eval_file)):
        return None
    return record


# -- the report ---------------------------------------------------------------------------

def aggregate(per_seed: dict[int, dict[str, float]]) -> dict[str, dict]:
    """Each metric's mean, sample standard deviation, min and max over the seeds.

    Args:
      per_seed: {seed: {metric: value}}; a metric missing from any seed is left out.

    Returns:
      {metric: {"mean", "std", "min", "max", "n"}}; "std" is the sample standard deviation
      (n - 1 denominator, as papers report it), None for one seed.
    """
    if not per_seed:
        return {}
    names = set.intersection(*(set(m) for m in per_seed.values()))
    summary = {}
    for name in sorted(names):
        values = [float(per_seed[s][name]) for s in sorted(per_seed)]
        summary[name] = {"mean": statistics.fmean(values),
                         "std": statistics.stdev(values) if len(values) > 1 else None,
                         "min": min(values), "max": max(values), "n": len(values)}
    return summary


def write_results(model_dir: str, records: dict[int, dict], *, task: str,
                  family: str | None) -> tuple[str, dict]:
    """Writes MODEL_DIR/eval_results.json (aside, then renamed) for the seeds of `records`.

    Args:
      model_dir: the parent directory.
      records: {seed: that seed's eval_results.json record}.
      task, family: the task's name and family.

    Returns:
      (the path written, the per-metric summary of `aggregate`).
    """
    summary = aggregate({s: r["metrics"] for s, r in records.items()})
    runs = [{"seed": s, **derived_seeds(s), "model_dir": os.path.basename(seed_dir(model_dir, s)),
             "step": r.get("step"), "checkpoint": r.get("checkpoint"), "metrics": r["metrics"]}
            for s, r in sorted(records.items())]
    record = {"task": task, "family": family, "seeds": sorted(records),
              "eval_file": next(iter(records.values())).get("eval_file") if records else None,
              "std": STD_KIND, "metrics": summary, "runs": runs}
    path = os.path.join(model_dir, EVAL_RESULTS_FILE)
    with outputs.new_file(path, writing="the multi-seed evaluation results") as f:
        f.write(json.dumps(record, indent=2) + "\n")
    return path, summary


def format_metric(name: str, stats: dict) -> str:
    """One report line, e.g. "accuracy 0.835 ± 0.004 (3 seeds)".

    Three decimals, more when the standard deviation would round to zero (to its first
    significant digit, up to six).
    """
    std, n = stats["std"], stats["n"]
    digits = 3
    if std:
        digits = min(6, max(3, -math.floor(math.log10(std))))
    spread = f" ± {std:.{digits}f}" if std is not None else ""
    return f"{name} {stats['mean']:.{digits}f}{spread} ({n} seed{'s' * (n != 1)})"
