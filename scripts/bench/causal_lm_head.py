#!/usr/bin/env python3
"""How much of a causal-LM training step the tied vocabulary head takes, both ways.

Times the forward and backward pass of the output head alone at the train-step section's
shapes (hidden states [batch, seq, width] times the [vocab, width] table transposed, then
next-token cross-entropy at every position but the last; gradients of the hidden states and
the table), written as keras-hub's `ReversibleEmbedding(reverse=True)` + TensorFlow's sparse
softmax cross-entropy, and as bert-train's `CausalLM` + `CausalLMTask` compute it (a 2-D matmul
with the transposed table, then `bert_trainer.losses.sparse_softmax_cross_entropy`, the fused
CPU kernel). Both do the same matrix products; compare the medians with the step times of
`causal_lm.py --only=step` at a similar load to see the share of the step that the rest of the
model can win back.

  scripts/bench/causal_lm_head.py                 # batch 16 x 256, vocabulary 30,522, width 256
  scripts/bench/causal_lm_head.py --rounds=5 --vocab_size=8000
"""

import argparse
import os
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository


def heads(batch: int, seq: int, width: int, vocab: int) -> dict:
    """{name: tf.function returning the gradients of the head's loss}, on random inputs."""
    import tensorflow as tf  # noqa: PLC0415

    from bert_trainer import losses  # noqa: PLC0415

    hidden = tf.Variable(tf.random.stateless_normal([batch, seq, width], (1, 2)) * 0.1)
    table = tf.Variable(tf.random.stateless_normal([vocab, width], (3, 4)) * 0.02)
    ids = tf.random.stateless_uniform([batch, seq], (5, 6), 5, vocab, tf.int32)

    @tf.function
    def keras_hub_head():
        with tf.GradientTape() as tape:
            logits = tf.matmul(hidden, table, transpose_b=True)  # (batch, seq, vocab)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                ids[:, 1:], logits[:, :-1]))
        return tape.gradient(loss, [hidden, table])

    @tf.function
    def bert_train_head():
        with tf.GradientTape() as tape:
            rows = tf.reshape(hidden, [-1, width])  # (batch * seq, width)
            logits = tf.reshape(tf.linalg.matmul(rows, table, transpose_b=True),
                                [batch, seq, vocab])
            loss = tf.reduce_mean(losses.sparse_softmax_cross_entropy(ids[:, 1:],
                                                                      logits[:, :-1]))
        return tape.gradient(loss, [hidden, table])

    return {"keras-hub head (matmul + TF sparse cross-entropy)": keras_hub_head,
            "bert-train head (2-D matmul + fused cross-entropy)": bert_train_head}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--seq_length", type=int, default=256)
    p.add_argument("--hidden_size", type=int, default=256)
    p.add_argument("--vocab_size", type=int, default=30522)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    functions = heads(args.batch_size, args.seq_length, args.hidden_size, args.vocab_size)
    for fn in functions.values():  # Tracing and oneDNN primitives, untimed.
        [g.numpy() for g in fn()]
    times = {name: [] for name in functions}
    load = os.getloadavg()
    for _ in range(args.rounds):  # Alternating, so load drifts hit both.
        for name, fn in functions.items():
            start = time.perf_counter()
            [g.numpy() for g in fn()]
            times[name].append(time.perf_counter() - start)
    flops = 3 * 2 * args.batch_size * args.seq_length * args.hidden_size * args.vocab_size
    print(f"load average {load[0]:.2f} -> {os.getloadavg()[0]:.2f}; "
          f"{flops / 1e9:.1f} GFLOP of matrix products per pass")
    for name, values in times.items():
        print(f"{name}: median {statistics.median(values):.3f} s "
              f"(rounds {', '.join(f'{v:.3f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
