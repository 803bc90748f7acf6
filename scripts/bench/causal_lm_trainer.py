"""bert-train's own causal-LM training step for the benchmark: the real task and trainer code.

`build` makes bert-train's `CausalLMTask` for a `CausalLM` of the benchmark's size, replaces
its input by the benchmark's in-memory blocks (the ones keras-hub trains on; the input pipeline
is not what is measured), builds a `Trainer` around it with checkpoints, summaries and
evaluation out of reach, and returns run(n): n optimizer steps through the trainer's compiled
loop (`Trainer.run_steps`), ending with the loop's own host sync. Model, loss, metrics,
optimizer (the default `OptimizerConfig`: AdamW lr 1e-4, weight decay 0.01 except biases and
LayerNorm, epsilon 1e-6, clip 1.0), NaN guard: bert-train's code as `bert-train pretrain` runs it.
"""

import os
import tempfile

import numpy as np
import tensorflow as tf

from bench import causal_lm_models as models
from bert_trainer import features

NEVER = 10**9  # An interval the benchmark never reaches (no checkpoint, summary or eval).
SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def _vocab_file(directory: str, vocab_size: int) -> str:
    """A vocab.txt of `vocab_size` tokens: the task checks it against the model's size."""
    path = os.path.join(directory, "vocab.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{t}\n" for t in SPECIAL)
        f.writelines(f"tok{i}\n" for i in range(vocab_size - len(SPECIAL)))
    return path


def build(vocab_size: int, size: str, seq_length: int, batch_size: int, dropout: float,
          batches: list[np.ndarray]):
    """(info, run) of bert-train's trainer on `batches` ([batch, seq] int32 blocks, cycled)."""
    from bert_trainer.models import CausalLM
    from bert_trainer.tasks.causal_lm.task import CausalLMConfig, CausalLMTask
    from bert_trainer.training import optimization
    from bert_trainer.training import trainer as trainer_lib

    parsed = models.Size.parse(size)
    # Deleted when the worker exits (the closure below keeps it alive until then).
    workdir = tempfile.TemporaryDirectory(prefix="bert_train_causal_bench_")
    config = CausalLMConfig(vocab_file=_vocab_file(workdir.name, vocab_size),
                            block_size=seq_length, train_batch_size=batch_size)

    def model_fn():
        return CausalLM(vocab_size=vocab_size, hidden_size=parsed.hidden_size,
                        num_layers=parsed.num_layers,
                        num_attention_heads=parsed.num_attention_heads,
                        inner_dim=parsed.inner_dim, max_sequence_length=seq_length,
                        output_dropout=dropout, attention_dropout=dropout)

    task = CausalLMTask(config, model_fn)
    stacked = np.stack(batches)  # (num_batches, batch, seq)

    def inputs(input_context):
        del input_context  # One replica: the global batch is the batch.
        ids = tf.data.Dataset.from_tensor_slices(stacked)
        return ids.map(lambda x: {features.INPUT_WORD_IDS: x,
                                  features.INPUT_MASK: tf.ones_like(x)}).repeat().prefetch(2)

    trainer_config = trainer_lib.TrainerConfig(
        train_steps=NEVER, steps_per_loop=NEVER, checkpoint_interval=NEVER,
        summary_interval=NEVER, eval_steps=0, seed=0)
    trainer = trainer_lib.Trainer(task, os.path.join(workdir.name, "model"),
                                  config=trainer_config,
                                  optimizer=optimization.OptimizerConfig())
    # Only the input is the benchmark's (the trainer's in-memory input hook); everything else
    # is the task's own.
    iterator = trainer.train_iterator(inputs=inputs)

    def run(num_steps: int, _keep=workdir) -> dict:
        trainer.run_steps(iterator, num_steps)
        # The running mean since the start (no summaries are written, so nothing resets it).
        return {"loss": trainer.train_results()["loss"]}

    flops = batch_size * float(trainer.model.flops_per_example(seq_length))
    return {"params": int(trainer.model.count_params()), "flops_per_step": flops,
            "loop": "bert-train's Trainer.run_steps on its CausalLMTask"}, run
