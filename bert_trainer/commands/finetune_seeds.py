"""`bert-train finetune --seeds=1,2,3` (or `--num_seeds=N`): one fine-tune per seed.

Each seed runs the whole fine-tune into model_dir/seed-N/ from the gin config parsed anew plus
its seed bindings (bert_trainer/tasks/multi_seed.py derives them); then each seed's metrics, with
their mean, sample standard deviation, min and max, go to model_dir/eval_results.json. A rerun
skips finished seeds and resumes a half-done one. Each seed's run is built by
`runs.finetuning` and started by `finetune`'s `run_one`, so this module knows the seeds and
nothing of the task.
"""

import os
from collections.abc import Callable

from bert_trainer.commands import common
from bert_trainer.runs import gin_config


def run_seeds(model_dir: str, seeds: list[int], settings, run_one: Callable[..., int]) -> int:
    """Fine-tunes once per seed into model_dir/seed-N/, then reports the metrics' spread.

    Each seed's run starts from the gin config parsed anew plus its seed bindings, in a fresh
    Keras session: nothing one seed binds or builds reaches the next.

    Args:
      model_dir: the multi-seed run's directory.
      seeds: the seeds, in order.
      settings: the run's `runs.finetuning.FinetuneSettings`, its gin config parsed.
      run_one: `run_one(model_dir, label=...)` runs one seed's fine-tune, returns its exit code.
    """
    from bert_trainer.runs import finetuning  # noqa: PLC0415
    from bert_trainer.tasks import multi_seed, registry  # noqa: PLC0415

    finetuning.check_seed_bindings()
    gin_files = finetuning.recipe_files(settings)
    flag_bindings = settings.gin_bindings(registry.family_of(settings.task))
    config = _run_config(gin_files, flag_bindings, settings)
    with common.one_line_errors(), common.model_dir_lock(model_dir, "finetune --seeds",
                                                           settings.strategy):
        previous = multi_seed.check_multi_seed_dir(model_dir, config)
        # What each seed's run checks before writing, checked once before anything is written.
        task, run_settings = finetuning.plan(settings)
        final_step = run_settings.train_steps
        multi_seed.write_manifest(model_dir, config, seeds, previous)
        records = {}
        for seed in seeds:
            code, records[seed] = _run_seed(model_dir, seed, final_step, gin_files,
                                            flag_bindings, settings, run_one)
            if code:
                return code
        if any(r is None for r in records.values()):
            return 0  # a non-chief worker: the chief writes the results
        path, summary = multi_seed.write_results(model_dir, records, task=task.name,
                                                 family=task.task_data.family_name)
    print(f"bert-train finetune: {len(seeds)} seeds ({', '.join(map(str, seeds))}), mean ± "
          f"sample standard deviation | results {path}", flush=True)
    for name, stats in summary.items():
        # Counts (num_examples, cut_texts: inputs cut to fit) are the same for every seed.
        if not name.startswith(("num_", "cut_")):
            print("  " + multi_seed.format_metric(name, stats), flush=True)
    return 0


def _run_seed(model_dir: str, seed: int, final_step: int, gin_files: list[str],
              flag_bindings: list[str], settings, run_one) -> tuple[int, dict | None]:
    """Runs seed `seed` into model_dir/seed-N/ unless it is finished.

    Returns:
      (the exit code, the seed's final eval_results.json record or None).
    """
    from bert_trainer.tasks import multi_seed  # noqa: PLC0415

    record = multi_seed.finished_results(model_dir, seed, final_step, settings.data.eval_file)
    if record is not None:
        print(f"bert-train finetune: seed {seed}: finished at step {final_step}, skipped",
              flush=True)
        return 0, record
    _reset_run_state()
    gin_config.parse_gin(gin_files, settings.gin_params,
                         [*flag_bindings, *multi_seed.gin_bindings(seed)])
    directory = multi_seed.seed_dir(model_dir, seed)
    with common.model_dir_lock(directory, "finetune", settings.strategy):
        code = run_one(directory, label=f"seed {seed}: ")
    return code, multi_seed.finished_results(model_dir, seed, final_step,
                                             settings.data.eval_file)


def _run_config(gin_files: list[str], flag_bindings: list[str], settings) -> dict:
    """The flags that make a run what it is; every seed of a multi-seed run shares them."""
    def path(value):
        return value if value is None or "://" in value else os.path.abspath(value)

    s, data, columns = settings, settings.data, settings.columns
    return {"task": s.task, "train_file": path(data.train_file),
            "eval_file": path(data.eval_file), "data_dir": data.data_dir,
            "init_checkpoint": path(s.init_checkpoint), "vocab_file": path(s.vocab_file),
            "lower_case": s.lower_case,
            "gin_files": [gin_config.resolve_gin_file(f) for f in gin_files],
            "gin_params": list(s.gin_params), "flag_bindings": flag_bindings,
            "max_train_examples": data.max_train_examples,
            "max_eval_examples": data.max_eval_examples,
            **{name: columns.get(name) for name in ("text_column", "text_b_column",
                                                     "label_column")},
            # Only when given: a manifest written before these flags existed still matches.
            **{name: columns[name] for name in ("source_column", "target_column")
               if name in columns},
            "header": s.header,
            "label_names": list(s.label_names) if s.label_names else None,
            "skip_bad_rows": data.skip_bad_rows}


def _reset_run_state() -> None:
    """Clears gin's bindings and Keras' session (layer name counters, global seed)."""
    import gin  # noqa: PLC0415
    import keras  # noqa: PLC0415

    gin.clear_config()
    keras.backend.clear_session()
