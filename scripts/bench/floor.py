"""bert-train's step with everything but its matrix products taken away: the matmul floor.

`products(step, last_layer_rows)` lists every matrix product of bert-train's pretraining
step, forward and backward, with its shape; their FLOPs add up to exactly
`spec.train_flops(step, last_layer_rows)` (the backward pass does two products per forward
one: the input gradient and the weight gradient). `build` runs all of them, on distinct
random operands, once per unit. Its time is what a step would take if dropout, LayerNorm,
GELU, softmax, the loss, the optimizer update and op scheduling were free, with this
TensorFlow's own kernels (oneDNN on CPU) on the step's own shapes. The measured step over
this floor says how much of the step is not matmul.
"""

import dataclasses

from bench import spec as spec_lib


@dataclasses.dataclass(frozen=True)
class Product:
    """One `tf.matmul(a, b, transpose_a, transpose_b)` of `batch` [m, k] x [k, n] products."""

    name: str
    m: int
    k: int
    n: int
    batch: int = 1
    transpose_a: bool = False
    transpose_b: bool = False

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.k * self.n

    def operand_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        a = (self.k, self.m) if self.transpose_a else (self.m, self.k)
        b = (self.n, self.k) if self.transpose_b else (self.k, self.n)
        lead = (self.batch,) if self.batch > 1 else ()
        return lead + a, lead + b


def _dense(name: str, rows: int, width_in: int, width_out: int) -> list[Product]:
    """y = x @ W: forward, dx = dy @ W^T, dW = x^T @ dy."""
    return [Product(f"{name}", rows, width_in, width_out),
            Product(f"{name} dx", rows, width_out, width_in, transpose_b=True),
            Product(f"{name} dW", width_in, rows, width_out, transpose_a=True)]


def _attention(name: str, heads: int, queries: int, keys: int, head_dim: int) -> list[Product]:
    """scores = Q K^T and context = P V per (sequence, head), and their four gradients."""
    q, s, d = queries, keys, head_dim
    return [Product(f"{name} QK^T", q, d, s, heads, transpose_b=True),
            Product(f"{name} PV", q, s, d, heads),
            Product(f"{name} dP = dC V^T", q, d, s, heads, transpose_b=True),
            Product(f"{name} dV = P^T dC", s, q, d, heads, transpose_a=True),
            Product(f"{name} dQ = dS K", q, s, d, heads),
            Product(f"{name} dK = dS^T Q", s, q, d, heads, transpose_a=True)]


def products(step: spec_lib.StepSpec, last_layer_rows: int | None = None,
             mlm_rows: int | None = None, tokens: int | None = None) -> list[Product]:
    """Every matrix product of one pretraining step of `step`.

    Args:
      step: the step's sizes.
      last_layer_rows: query rows per sequence of the last layer (bert-train's pretrainer:
        1 + P); None computes it on every row (keras-hub).
      mlm_rows: rows the masked LM computes per step (bert-train's pretrainer: the weighted
        predictions, `spec.computed_mlm_rows` rounded); None: all batch x P.
      tokens: rows per step the dense layers compute (bert-train's pretrainer packs the real
        tokens: `spec.computed_tokens` rounded); None: all batch x seq. Attention keeps the
        padded [seq, seq] layout.

    Returns:
      Products whose FLOPs sum to `spec.train_flops(step, last_layer_rows, mlm_rows,
      tokens)`.
    """
    m, b, s, p = step.size, step.batch_size, step.seq_length, step.max_predictions
    h, f, v = m.hidden_size, m.inner_dim, m.vocab_size
    heads, head_dim = b * m.num_attention_heads, h // m.num_attention_heads
    tokens = b * s if tokens is None else tokens
    out = []
    for layer in range(m.num_layers):
        last = layer == m.num_layers - 1 and last_layer_rows is not None
        rows = b * last_layer_rows if last else tokens
        tag = f"layer {layer}"
        if last:  # K and V on every position, Q only at the rows computed.
            out += _dense(f"{tag} KV", tokens, h, 2 * h) + _dense(f"{tag} Q", rows, h, h)
        else:
            out += _dense(f"{tag} QKV", tokens, h, 3 * h)
        out += _attention(tag, heads, last_layer_rows if last else s, s, head_dim)  # padded
        out += _dense(f"{tag} attention output", rows, h, h)
        out += _dense(f"{tag} FFN in", rows, h, f) + _dense(f"{tag} FFN out", rows, f, h)
    out += _dense("pooler", b, h, h) + _dense("next sentence", b, h, 2)
    predictions = b * p if mlm_rows is None else mlm_rows
    out += _dense("MLM transform", predictions, h, h)
    # The tied projection: logits = x @ table^T, dx = dlogits @ table, dtable = dlogits^T @ x.
    out += [Product("MLM vocabulary", predictions, h, v, transpose_b=True),
            Product("MLM vocabulary dx", predictions, v, h),
            Product("MLM vocabulary dtable", v, predictions, h, transpose_a=True)]
    return out


def build(step: dict, dtype: str = "float32", last_layer_rows: int | None = None,
          mlm_rows: int | None = None, tokens: int | None = None):
    """Worker entry point: random operands for every product and a runner.

    Args:
      step: a JSON `StepSpec`.
      dtype: "float32" or "bfloat16" (the step's compute dtype).
      last_layer_rows, mlm_rows, tokens: as `products`.

    Returns:
      (info, run): run(k) performs every product k times, ends with a host sync and returns
      {"flops": FLOPs done}.
    """
    import tensorflow as tf  # noqa: PLC0415 - only in the worker process

    spec = spec_lib.StepSpec.from_json(step)
    listed = products(spec, last_layer_rows, mlm_rows, tokens)
    operands = []
    for i, product in enumerate(listed):
        shapes = product.operand_shapes()
        operands.append([tf.cast(tf.random.stateless_normal(shape, seed=(i, j)), dtype)
                         for j, shape in enumerate(shapes)])

    @tf.function
    def run_all(operands):
        # One corner of each product keeps it alive; the products themselves are whole.
        corners = [tf.matmul(a, b_, transpose_a=p.transpose_a, transpose_b=p.transpose_b)
                   [..., :1, :1] for p, (a, b_) in zip(listed, operands, strict=True)]
        return tf.add_n([tf.reduce_sum(tf.cast(c, tf.float32)) for c in corners])

    run_all(operands).numpy()  # Warm-up: tracing and oneDNN primitive creation.
    flops = sum(p.flops for p in listed)

    def run(k: int) -> dict:
        total = None
        for _ in range(k):
            total = run_all(operands)
        total.numpy()
        return {"flops": flops * k}

    return {"products": len(listed), "flops_per_step": flops, "dtype": dtype}, run
