"""Worker side of the causal-LM benchmark's training sections (bench/worker.py entry points).

- `build_step`: the timed A/B. keras-hub's GPT2CausalLM trains the usual way a keras-hub user
  writes a TensorFlow loop: one `tf.function` step (GradientTape, next-token cross-entropy,
  global-norm clipping at 1.0, AdamW as the other benchmarks configure it) per batch.
  bert-train trains through its own Trainer and causal-LM task where they are in the tree
  (`causal_lm_trainer`); until then its CausalLM runs in the same loop as keras-hub (the row
  says which). run(n) = n steps on `NUM_BATCHES` fixed batches of random full blocks, cycled
  (dense compute does not depend on the token values).
- `build_budget`: the quality section. run(n > 0) trains for n seconds (whole steps); run(0)
  scores the held-out blocks: perplexity = exp(mean next-token cross-entropy over every
  position that has a next token), and next-token accuracy. Every model trains in the same
  loop on the same shuffled blocks, with the same optimizer and schedule.
"""

import math
import time

import keras
import numpy as np
import tensorflow as tf

from bench import causal_lm_data as data_lib
from bench import causal_lm_models as models
from bench import keras_hub_step

CLIP_NORM = 1.0
NUM_BATCHES = 4
KINDS = ("bert_train", "keras_hub", "lstm")


def next_token_losses(ids: tf.Tensor, logits: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Per-position cross-entropy of predicting ids[:, t + 1] from logits[:, t], and weights.

    Args:
      ids: [batch, seq] int32 token ids (0 = [PAD]: no loss where it is the target).
      logits: [batch, seq, vocab] float32.

    Returns:
      (losses [batch, seq - 1] float32, weights [batch, seq - 1] float32: 1 where scored).
    """
    targets = ids[:, 1:]
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets,
                                                            logits=logits[:, :-1])
    return losses, tf.cast(tf.not_equal(targets, 0), tf.float32)


def mean_loss(ids: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    losses, weights = next_token_losses(ids, logits)
    return tf.reduce_sum(losses * weights) / tf.maximum(tf.reduce_sum(weights), 1.0)


def build_model(kind: str, vocab_size: int, size: str, max_length: int, dropout: float,
                lstm_units: int = 512, lstm_layers: int = 2) -> keras.Model:
    """A built model of a benchmark kind (see KINDS)."""
    parsed = models.Size.parse(size)
    if kind == "bert_train":
        return models.bert_train_causal_lm(vocab_size, parsed, max_length, dropout)
    if kind == "keras_hub":
        model = models.keras_hub_gpt2(vocab_size, parsed, max_length, dropout)
    elif kind == "lstm":
        model = models.LstmLM(vocab_size, parsed.hidden_size, lstm_units, lstm_layers, dropout)
    else:
        raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")
    models.logits_of(model, tf.ones([1, 2], tf.int32), training=False)  # Builds the variables.
    return model


def make_train_step(model: keras.Model, optimizer, batch_size: int, seq_length: int):
    """The compiled step: GradientTape, next-token loss, clip at CLIP_NORM, optimizer update."""
    variables = model.trainable_variables
    optimizer.build(variables)

    @tf.function(input_signature=[tf.TensorSpec([batch_size, seq_length], tf.int32)])
    def train_step(ids):
        with tf.GradientTape() as tape:
            loss = mean_loss(ids, models.logits_of(model, ids, training=True))
        grads = tape.gradient(loss, variables)
        grads, _ = tf.clip_by_global_norm(grads, CLIP_NORM)
        optimizer.apply_gradients(zip(grads, variables, strict=True))
        return loss

    return train_step


def random_blocks(vocab_size: int, batch_size: int, seq_length: int, seed: int = 0):
    """NUM_BATCHES batches of full blocks of random ids (no [PAD]), the same for every kind."""
    rng = np.random.default_rng(seed)
    return [rng.integers(5, vocab_size, (batch_size, seq_length)).astype(np.int32)
            for _ in range(NUM_BATCHES)]


def build_step(kind: str, vocab_size: int, size: str, seq_length: int, batch_size: int,
               dropout: float = 0.1, seed: int = 0):
    """Worker entry: run(n) trains n steps; info has params, FLOPs per step and the loop used."""
    keras.utils.set_random_seed(seed)
    batches = random_blocks(vocab_size, batch_size, seq_length, seed)
    flops = models.train_flops(models.Size.parse(size), vocab_size, batch_size, seq_length)
    if kind == "bert_train":  # bert-train's own Trainer on its causal-LM task
        from bench import causal_lm_trainer  # noqa: PLC0415

        info, run = causal_lm_trainer.build(vocab_size, size, seq_length, batch_size, dropout,
                                            batches)
        return {"flops_per_step": flops, **info}, run
    model = build_model(kind, vocab_size, size, seq_length, dropout)
    if hasattr(model, "flops_per_example"):  # bert-train's own count (what its trainer logs)
        flops = batch_size * float(model.flops_per_example(seq_length))
    train_step = make_train_step(model, keras_hub_step.make_optimizer(), batch_size,
                                 seq_length)
    position = [0]

    def run(n: int) -> dict:
        loss = None
        for _ in range(n):
            loss = train_step(batches[position[0] % NUM_BATCHES])
            position[0] += 1
        return {"loss": float(loss)}  # float() waits for the last step.

    return {"params": models.num_params(model), "flops_per_step": flops,
            "loop": "the benchmark's tf.function step"}, run


class WarmupConstant(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `peak` over `warmup` steps, then constant (a wall-clock budget has no
    known end to decay towards)."""

    def __init__(self, peak: float, warmup: int):
        self.peak, self.warmup = peak, max(int(warmup), 1)

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        return self.peak * tf.minimum(1.0, step / float(self.warmup))

    def get_config(self):
        return {"peak": self.peak, "warmup": self.warmup}


def heldout_scores(model: keras.Model, blocks: np.ndarray, batch_size: int) -> dict:
    """Perplexity and next-token accuracy over every scored position of the held-out blocks."""

    @tf.function(reduce_retracing=True)
    def sums(ids):
        logits = models.logits_of(model, ids, training=False)
        losses, weights = next_token_losses(ids, logits)
        correct = tf.cast(tf.equal(tf.argmax(logits[:, :-1], -1, output_type=tf.int32),
                                   ids[:, 1:]), tf.float32)
        return (tf.reduce_sum(losses * weights), tf.reduce_sum(correct * weights),
                tf.reduce_sum(weights))

    total = np.zeros(3)
    for start in range(0, len(blocks), batch_size):
        total += [float(x) for x in sums(tf.constant(blocks[start:start + batch_size]))]
    loss = total[0] / total[2]
    return {"perplexity": math.exp(loss), "loss": loss, "next_token_accuracy": total[1] / total[2],
            "scored_tokens": int(total[2])}


def build_budget(kind: str, train_file: str, heldout_file: str, vocab_size: int, size: str,
                 dropout: float, batch_size: int, learning_rate: float, warmup_steps: int,
                 lstm_units: int = 512, lstm_layers: int = 2, max_eval_blocks: int = 0,
                 seed: int = 0):
    """Worker entry: run(n > 0) trains for n seconds (at least one step); run(0) scores the
    held-out blocks. The build ends with one untimed step (tracing), counted in "steps"."""
    keras.utils.set_random_seed(seed)
    train, heldout = np.load(train_file), np.load(heldout_file)
    if max_eval_blocks:  # Evenly spaced, so every held-out document keeps its share.
        heldout = heldout[np.linspace(0, len(heldout) - 1, min(max_eval_blocks, len(heldout)),
                                      dtype=int)]
    block = train.shape[1]
    model = build_model(kind, vocab_size, size, block, dropout, lstm_units, lstm_layers)
    optimizer = keras.optimizers.AdamW(WarmupConstant(learning_rate, warmup_steps),
                                       weight_decay=0.01, beta_1=0.9, beta_2=0.98, epsilon=1e-6)
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    train_step = make_train_step(model, optimizer, batch_size, block)
    stream = data_lib.batches_forever(train, batch_size, seed)
    float(train_step(next(stream)))  # Tracing: not training time, but a step.
    totals = {"steps": 1, "train_seconds": 0.0}

    def run(n: int) -> dict:
        if n == 0:
            start = time.perf_counter()
            scores = heldout_scores(model, heldout, batch_size)
            return {**scores, "eval_seconds": time.perf_counter() - start, **totals}
        start, steps, loss = time.perf_counter(), 0, None
        while steps == 0 or time.perf_counter() - start < n:
            loss = float(train_step(next(stream)))  # float(): the clock sees finished steps.
            steps += 1
        totals["steps"] += steps
        totals["train_seconds"] += time.perf_counter() - start
        return {"loss": loss, **totals}

    return {"params": models.num_params(model), "block_size": block,
            "heldout_blocks": len(heldout)}, run
