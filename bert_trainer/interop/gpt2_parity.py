"""Parity report of a GPT-2 conversion: a float64 numpy GPT-2 forward pass vs the CausalLM.

The numpy pass reads the GPT-2 tensors as Hugging Face names them (`gpt2.GPT2Checkpoint`),
fused `c_attn` included, so it shares no code with `CausalLM` or with the weight mapping of
`gpt2.load_weights`: a swapped q/k/v block, a transposed `Conv1D` or a wrong head split shows
up as a large difference in the first layer it touches. The report has `parity.py`'s form.
"""

import math

import numpy as np

from bert_trainer import features
from bert_trainer.interop import gpt2, parity


def _layer_norm(x, gamma, beta, epsilon):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + epsilon) * gamma + beta


def reference_forward(ckpt: gpt2.GPT2Checkpoint, ids: np.ndarray) -> dict[str, np.ndarray]:
    """Runs GPT-2 in float64 numpy, as transformers' `GPT2LMHeadModel` defines it.

    Args:
      ckpt: the source checkpoint.
      ids: int `[batch, t]` token ids, t <= the positions.

    Returns:
      `{"layer_i": [batch, t, hidden] after block i, "hidden": after ln_f, "logits":
      [batch, t, vocab]}`.
    """
    w = {k: v.astype(np.float64) for k, v in ckpt.weights.items()}
    c = ckpt.config
    act = gpt2.ACTIVATION_VALUES[c.inner_activation]
    eps, heads = c.norm_epsilon, c.num_attention_heads
    batch, t = ids.shape
    x = w["wte.weight"][ids] + w["wpe.weight"][:t]  # (batch, t, hidden)
    future = np.triu(np.ones((t, t), bool), k=1)
    out = {}
    for n in range(c.num_layers):
        p = f"h.{n}."
        h = _layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]  # (batch, t, 3 hidden)
        q, k, v = (a.reshape(batch, t, heads, -1).transpose(0, 2, 1, 3)
                   for a in np.split(qkv, 3, axis=-1))  # (batch, heads, t, head_dim)
        scores = np.where(future, -np.inf, q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1]))
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, t, -1)
        x = x + context @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = _layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        inner = act(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + inner @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
        out[f"layer_{n}"] = x
    out["hidden"] = _layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], eps)
    out["logits"] = out["hidden"] @ w["wte.weight"].T
    return out


def keras_forward(model, ids: np.ndarray) -> dict[str, np.ndarray]:
    """The CausalLM's outputs shaped like `reference_forward`'s, through its public sublayers."""
    import keras  # noqa: PLC0415 (the numpy reference above needs no Keras)

    word = model.word_embeddings(ids)
    x = word + model.position_embedding(word)  # (batch, t, hidden)
    out = {}
    for i, layer in enumerate(model.transformer_layers):
        x = layer(x, training=False)  # causal self-attention by default
        out[f"layer_{i}"] = keras.ops.convert_to_numpy(x)
    out["hidden"] = keras.ops.convert_to_numpy(model.final_layer_norm(x))
    out["logits"] = keras.ops.convert_to_numpy(
        model({features.INPUT_WORD_IDS: ids}, training=False)[features.LOGITS])
    return out


def parity_ids(config: gpt2.GPT2Config, *, batch_size: int = 4, seq_length: int = 32,
               seed: int = 0) -> np.ndarray:
    """Deterministic random token ids, int32 `[batch_size, min(seq_length, positions)]`."""
    length = min(seq_length, config.max_sequence_length)
    rng = np.random.default_rng(seed)
    return rng.integers(0, config.vocab_size, size=(batch_size, length)).astype(np.int32)


def verify(ckpt: gpt2.GPT2Checkpoint, model, *, ids: np.ndarray | None = None,
           source: str | None = None) -> dict:
    """Parity report of `model` against the float64 forward pass of `ckpt`'s weights.

    The logits are compared relative to their largest magnitude (GPT-2's reach ~100, where
    float32 carries ~1e-5 absolute); the hidden states absolutely, as for BERT.

    Args:
      ckpt: the source weights.
      model: the converted CausalLM.
      ids: token ids; default `parity_ids(ckpt.config)`.
      source: the source named in the report (default ckpt.weights_file).

    Returns:
      `parity.make_report`'s dict: max |diff| of layer_i, hidden, logits_relative.
    """
    ids = parity_ids(ckpt.config) if ids is None else ids
    reference, ours = reference_forward(ckpt, ids), keras_forward(model, ids)
    diffs = {name: float(np.max(np.abs(reference[name] - ours[name]))) for name in reference}
    diffs["logits_relative"] = diffs.pop("logits") / max(
        1.0, float(np.max(np.abs(reference["logits"]))))
    return parity.make_report(diffs, {features.INPUT_WORD_IDS: ids},
                              source=source or ckpt.weights_file,
                              degenerate=parity.degenerate("logits", ours["logits"]))
