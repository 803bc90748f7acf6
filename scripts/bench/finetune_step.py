"""bert-train's real fine-tuning path, timed step by step: the task and trainer `finetune` builds.

`build` does what `bert-train finetune --task=T --train_file=F --init_checkpoint=MINILM
--max_train_examples=N --seq_length=S --batch_size=B --train_steps=K [--skip_bad_rows]`
does before its loop (`bert_trainer/runs/finetuning.py`): the task family's gin recipe
(`Family.recipe`, configs/tasks/<family>.gin) with the flags as bindings, the task data with
its label names, the encoder spec read from the Hugging Face directory,
`registry.build_task`, the `Trainer` with the run length and warmup derived from the task,
and the warm start of the encoder: the library's run builder (`runs.finetuning.parse_config`,
`build_finetuning_run`, as `bert-train finetune` builds its run), so the benchmark cannot
drift from what the command runs. Then run(n) trains n steps through `Trainer.run_steps` on
the trainer's own training input (the task's `build_inputs`: tokenization, batching and
whatever length bucketing the pipeline does), so the benchmark times whatever the command would run.

It also writes the raw training examples the task reads (decoded, one JSON object a line) so
the PyTorch baseline (`torch_finetune.py`) trains on exactly the same examples in the same
order.
"""

import dataclasses
import json
import os
import tempfile


def _decode(value):
    """JSON-ready Python value of one raw-example feature (bytes -> str, arrays -> lists)."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def write_examples(task, path: str) -> int:
    """Writes the task's raw training examples to `path` (JSON lines); returns their count.

    Classification rows are {"text", ["text_b"], "label"}; tagging rows {"tokens", "tags"}
    (tag ids in the task's label order), as `TaskData.load` yields them.
    """
    count = 0
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        for example in task.raw_examples(task.train_split).as_numpy_iterator():
            f.write(json.dumps({k: _decode(v) for k, v in example.items()}) + "\n")
            count += 1
    os.replace(path + ".tmp", path)
    return count


def build_task_and_trainer(*, task: str, train_file: str, init_checkpoint: str,
                           max_train_examples: int, seq_length: int, batch_size: int,
                           train_steps: int, model_dir: str, skip_bad_rows: bool = False,
                           gin_params=()):
    """The task and trainer of `bert-train finetune` with these flags, built by the library's
    run builder (`runs.finetuning`: see the module doc).

    The run does not evaluate (`TrainerConfig.eval_steps = 0`, no best checkpoint), so no
    evaluation data is read; the trainer warm-starts the encoder from `init_checkpoint`.

    Returns:
      (task, trainer, optimizer_config).
    """
    import gin
    import tensorflow as tf

    from bert_trainer.runs import finetuning as runs
    from bert_trainer.tasks import finetuning

    gin.clear_config()
    settings = runs.FinetuneSettings(
        task=task, init_checkpoint=init_checkpoint, seq_length=seq_length,
        batch_size=batch_size, train_steps=train_steps,
        data=finetuning.DataConfig(train_file=train_file, max_train_examples=max_train_examples,
                                   skip_bad_rows=skip_bad_rows),
        gin_params=("TrainerConfig.eval_steps = 0", "TrainerConfig.best_metric = None",
                    *gin_params))
    runs.parse_config(settings)
    run = runs.build_finetuning_run(settings, model_dir, tf.distribute.get_strategy())
    return run.task, run.trainer, run.trainer.optimizer_config


def build(*, task: str, train_file: str, init_checkpoint: str, max_train_examples: int,
          seq_length: int, batch_size: int, train_steps: int, examples_out: str,
          skip_bad_rows: bool = False, gin_params=()):
    """Builds the fine-tuning trainer; worker entry point.

    Args:
      task: a `bert-train finetune --task` name (sst2, conll2003, imdb, ...).
      train_file: the task's training file (GLUE TSV, CoNLL, ...).
      init_checkpoint: the pretrained model directory (Hugging Face MiniLM).
      max_train_examples: the first N training examples only (the benchmark's pool).
      seq_length, batch_size: `--seq_length`, `--batch_size`.
      train_steps: the run length the schedule is built for (warmup 10 % of it).
      examples_out: where the raw training examples are written for the PyTorch side.
      skip_bad_rows: `--skip_bad_rows` (the IMDB sample has rows broken by newlines).
      gin_params: extra `--gin_param` bindings.

    Returns:
      (info, run): info holds the parameter count, the examples written, the label names and
      the optimizer settings the PyTorch side copies; run(n) trains n steps and returns the
      examples, real tokens and token slots (padding included) they trained on, as the
      train step counts them, the running loss and the tf.function traces they caused.
    """
    model_dir = tempfile.TemporaryDirectory(prefix="bert_train_bench_finetune_")
    built, trainer, optimizer = build_task_and_trainer(
        task=task, train_file=train_file, init_checkpoint=init_checkpoint,
        max_train_examples=max_train_examples, seq_length=seq_length, batch_size=batch_size,
        train_steps=train_steps, model_dir=model_dir.name, skip_bad_rows=skip_bad_rows,
        gin_params=gin_params)
    written = write_examples(built, examples_out)
    iterator = trainer.train_iterator()

    def run(num_steps: int, _keep=model_dir) -> dict:
        # The compiled step's own counters (TensorBoard's throughput) and its traces (a new
        # input shape that retraces shows there).
        before, traces = trainer.step_counts(), trainer.tracing_count()
        trainer.run_steps(iterator, num_steps)  # Ends with a host read (the NaN guard).
        after = trainer.step_counts()
        out = {"examples": after.examples - before.examples,
               "loss": trainer.train_results()["loss"],
               "traces": trainer.tracing_count() - traces}
        if after.tokens is not None:  # None until the first trace has counted tokens.
            out["tokens"] = after.tokens - (before.tokens or 0.0)
            out["token_slots"] = after.token_slots - (before.token_slots or 0.0)
        return out

    td = built.task_data
    return {
        "params": int(trainer.model.count_params()),
        "examples_written": written,
        "family": td.family_name,
        "label_names": list(td.label_names or ()),
        "learning_rate": float(optimizer.learning_rate),
        "warmup_steps": int(optimizer.warmup_steps or 0),
        "weight_decay": float(optimizer.weight_decay),
        "epsilon": float(optimizer.epsilon),
        "clip_norm": optimizer.clip_norm and float(optimizer.clip_norm),
        "dropout_rate": float(built.config.dropout_rate),
        "finetune_config": dataclasses.asdict(built.config),
    }, run
