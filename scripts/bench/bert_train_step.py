"""The plug-in point for bert-train's own pretraining step: the real task and trainer code.

`build(step)` makes bert-train's `PretrainingTask` for the step's sizes, builds a `Trainer`
around it with checkpoints, summaries and evaluation pushed out of reach, feeds it the
benchmark's in-memory batches (the same arrays keras-hub trains on; the input pipeline is
measured separately) through the trainer's input hook (`Trainer.train_iterator(inputs=...)`),
and returns run(n): n optimizer steps through the trainer's compiled loop
(`Trainer.run_steps`), ending with the loop's own host sync.

Everything else - model, losses, metrics, optimizer, clipping, NaN guard, XLA - is bert-train's
code as `bert-train pretrain` runs it.
"""

import os
import tempfile

import numpy as np
import tensorflow as tf

from bench import spec as spec_lib

NUM_DATA_BATCHES = spec_lib.NUM_DATA_BATCHES
NEVER = 10**9  # An interval the benchmark never reaches (no checkpoint, summary or eval).


def benchmark_inputs(step: spec_lib.StepSpec):
    """The benchmark batches as the trainer's input hook takes them: only the input is the
    benchmark's, so whatever else the trainer asks of the task (model, losses, metrics,
    model_inputs) is bert-train's code."""
    batches = spec_lib.make_batches(step, NUM_DATA_BATCHES)
    stacked = {k: np.stack([b[k] for b in batches]) for k in batches[0]}

    def inputs(input_context):
        del input_context  # One replica: the global batch is the batch.
        return tf.data.Dataset.from_tensor_slices(stacked).repeat().prefetch(2)

    return inputs


def make_pretraining_task(step: spec_lib.StepSpec):
    """bert-train's PretrainingTask for the step's sizes (fp32, dropout 0.1, GELU).

    masking="static" lets the config go without a vocab file: the benchmark batches replace
    the task's input, so neither masking nor the vocabulary is used.
    """
    from bert_trainer.encoders import build_encoder
    from bert_trainer.tasks.masked_lm import task as pretraining

    size = step.size
    config = pretraining.PretrainingConfig(
        masking="static", seq_length=step.seq_length,
        max_predictions_per_seq=step.max_predictions, train_batch_size=step.batch_size)

    def encoder_fn():
        return build_encoder(
            "bert", vocab_size=size.vocab_size, hidden_size=size.hidden_size,
            num_layers=size.num_layers, num_attention_heads=size.num_attention_heads,
            inner_dim=size.inner_dim, max_sequence_length=spec_lib.MAX_SEQUENCE_LENGTH,
            type_vocab_size=spec_lib.TYPE_VOCAB_SIZE)

    return pretraining.PretrainingTask(config, encoder_fn)


def build(step: spec_lib.StepSpec):
    """Builds bert-train's trainer for `step`.

    Args:
      step: sizes, shapes, `jit_compile` and `mixed_precision` (the trainer's own options).

    Returns:
      (info, run): info holds the parameter count; run(n) trains n steps and returns
      {"loss": mean training loss so far}.
    """
    from bert_trainer.training import optimization
    from bert_trainer.training import trainer as trainer_lib

    task = make_pretraining_task(step)
    if task.global_batch_size(True) != step.batch_size:
        raise ValueError(f"the task's batch {task.global_batch_size(True)} is not the "
                         f"benchmark's {step.batch_size}")
    config = trainer_lib.TrainerConfig(
        train_steps=NEVER, steps_per_loop=NEVER, checkpoint_interval=NEVER,
        summary_interval=NEVER, eval_steps=0, jit_compile=step.jit_compile,
        mixed_precision=step.mixed_precision, seed=0)
    # Deleted when the worker exits (the closure below keeps it alive until then).
    model_dir = tempfile.TemporaryDirectory(prefix="bert_train_bench_")
    trainer = trainer_lib.Trainer(task, model_dir.name, config=config,
                                  optimizer=optimization.OptimizerConfig())
    # The trainer's own benchmark hook: the distributed input, then `run_steps` (the compiled
    # loop of `num_steps` steps; it ends by reading the NaN guard, a host sync).
    iterator = trainer.train_iterator(inputs=benchmark_inputs(step))

    def run(num_steps: int, _keep=model_dir) -> dict:
        trainer.run_steps(iterator, num_steps)
        # A sanity value only (finite, plausible): the running mean since the start (the
        # benchmark writes no summaries, so nothing resets it).
        return {"loss": trainer.train_results()["loss"]}

    # The trainer's own FLOPs count (TensorBoard's `mfu`): the FLOPs the step executes. Its
    # masked LM computes only the weighted predictions where shapes may vary (not under XLA):
    # the mean over the batches it cycles through.
    # Its encoder packs the real tokens there too: the batches' mean.
    computed = tokens = None
    if not step.jit_compile and trainer.model.skips_unweighted_predictions():
        computed = spec_lib.computed_mlm_rows(step, NUM_DATA_BATCHES) / step.batch_size
    if not step.jit_compile and trainer.model.packs_tokens():
        tokens = spec_lib.computed_tokens(step, NUM_DATA_BATCHES) / step.batch_size
    executed = step.batch_size * trainer.model.flops_per_example(
        step.seq_length, step.max_predictions, computed_predictions=computed,
        computed_tokens=tokens)
    return {"params": int(trainer.model.count_params()),
            "executed_flops_per_step": int(round(executed))}, run


def build_from_params(step: dict):
    """Worker entry point: `build` from a JSON `StepSpec`."""
    return build(spec_lib.StepSpec.from_json(step))


def build_tf_ops_from_params(step: dict):
    """Worker entry point: `build` with the fused CPU kernels off (TensorFlow's own ops), the
    baseline that measures what the kernels buy. A worker is its own process, so the
    setting is this worker's alone."""
    from bert_trainer import ops

    os.environ[ops.MODE_ENV] = "off"
    return build(spec_lib.StepSpec.from_json(step))
