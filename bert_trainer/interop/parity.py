"""Parity report: a float64 numpy BERT forward pass from the source weights vs the Keras model.

The numpy pass reads the reference layout of `formats.py` directly, so it shares no code with
the Keras encoder or with the weight mapping: a wrong transpose, a swapped LayerNorm or a
mis-split head shows up as a large difference in the first layer it touches.
"""

import json
import math

import numpy as np

from bert_trainer import features
from bert_trainer.interop import formats

TOLERANCE = 1e-4  # fp32 model vs float64 reference, per element.

_erf = np.vectorize(math.erf, otypes=[np.float64])
_ACTIVATIONS = {
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),  # exact erf form, as BERT.
    "relu": lambda x: np.maximum(x, 0.0),
    "tanh": np.tanh,
}


def reference_forward(ckpt: formats.BertCheckpoint, inputs: dict) -> dict:
    """Runs BERT in float64 numpy from reference-named weights.

    Args:
      ckpt: the source checkpoint.
      inputs: `input_word_ids`, `input_mask`, `input_type_ids`, int arrays [batch, seq].

    Returns:
      dict with `embedding_output` [batch, seq, hidden], `encoder_outputs` (list of
      [batch, seq, hidden], one per layer), `sequence_output` [batch, seq, hidden] and, when the
      checkpoint has a pooler, `pooled_output` [batch, hidden].
    """
    w = {k: v.astype(np.float64) for k, v in ckpt.weights.items()}
    config = ckpt.config
    ids = np.asarray(inputs[features.INPUT_WORD_IDS])
    mask = np.asarray(inputs[features.INPUT_MASK])
    types = np.asarray(inputs[features.INPUT_TYPE_IDS])
    seq_len = ids.shape[1]
    e = "bert/embeddings/"
    x = (w[e + "word_embeddings"][ids] + w[e + "position_embeddings"][:seq_len][None]
         + w[e + "token_type_embeddings"][types])  # (batch, seq, hidden)
    x = _layer_norm(x, w[e + "LayerNorm/gamma"], w[e + "LayerNorm/beta"], config.norm_epsilon)
    outputs = {"embedding_output": x,
               features.ENCODER_OUTPUTS: _run_layers(x, mask, w, config, first_layer=0)}
    x = outputs[features.ENCODER_OUTPUTS][-1]
    outputs[features.SEQUENCE_OUTPUT] = x
    if "bert/pooler/dense/kernel" in w:
        outputs[features.POOLED_OUTPUT] = np.tanh(
            x[:, 0] @ w["bert/pooler/dense/kernel"] + w["bert/pooler/dense/bias"])
    return outputs


def reference_layers(ckpt: formats.BertCheckpoint, hidden, input_mask, *,
                     first_layer: int = 0) -> list:
    """Runs the float64 transformer layers `first_layer`.. from a given hidden state.

    For sensitivity studies: how much a small change of one layer's output (e.g. fp32
    round-off) moves the later layers' outputs.

    Args:
      ckpt: the source checkpoint.
      hidden: the input of layer `first_layer` (the embedding output for 0, else the output
        of layer `first_layer - 1`), [batch, seq, hidden].
      input_mask: [batch, seq], 1 for real tokens.
      first_layer: index of the first layer to run.

    Returns:
      The outputs of layers `first_layer`..`num_layers - 1`, each float64 [batch, seq, hidden].
    """
    w = {k: v.astype(np.float64) for k, v in ckpt.weights.items()}
    return _run_layers(np.asarray(hidden, np.float64), np.asarray(input_mask), w, ckpt.config,
                       first_layer=first_layer)


def _run_layers(x, mask, w, config, *, first_layer):
    """Layers `first_layer`.. on x (batch, seq, hidden) with float64 weights `w`."""
    # Additive mask: padded keys get -1e9 before the softmax, so their weight is exactly 0.
    bias = (1.0 - mask[:, None, None, :].astype(np.float64)) * -1e9  # (batch, 1, 1, seq)
    outputs = []
    for i in range(first_layer, config.num_layers):
        x = _layer(x, bias, w, formats.layer_prefix(i), config)
        outputs.append(x)
    return outputs


def _layer(x, bias, w, p, config):
    """One post-norm transformer layer. x: (batch, seq, hidden); bias: (batch, 1, 1, seq)."""
    batch, seq, hidden = x.shape
    heads = config.num_attention_heads
    head_dim = hidden // heads

    def split(name):  # (batch, seq, hidden) -> (batch, heads, seq, head_dim)
        y = x @ w[p + f"attention/self/{name}/kernel"] + w[p + f"attention/self/{name}/bias"]
        return y.reshape(batch, seq, heads, head_dim).transpose(0, 2, 1, 3)

    q, k, v = split("query"), split("key"), split("value")
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head_dim) + bias  # (batch, heads, seq, seq)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, seq, hidden)
    attention = context @ w[p + "attention/output/dense/kernel"] + w[
        p + "attention/output/dense/bias"]
    x = _layer_norm(x + attention, w[p + "attention/output/LayerNorm/gamma"],
                    w[p + "attention/output/LayerNorm/beta"], config.norm_epsilon)
    inner = _ACTIVATIONS[config.inner_activation](
        x @ w[p + "intermediate/dense/kernel"] + w[p + "intermediate/dense/bias"])
    out = inner @ w[p + "output/dense/kernel"] + w[p + "output/dense/bias"]
    return _layer_norm(x + out, w[p + "output/LayerNorm/gamma"], w[p + "output/LayerNorm/beta"],
                       config.norm_epsilon)


def _layer_norm(x, gamma, beta, epsilon):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + epsilon) * gamma + beta


def parity_inputs(config: formats.BertConfig, *, batch_size: int = 4, seq_length: int = 32,
                  seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic random inputs with padding on every row and a sentence pair in half.

    Returns:
      `input_word_ids`, `input_mask`, `input_type_ids`: int32 [batch_size, seq_length].
    """
    seq_length = min(seq_length, config.max_sequence_length)
    rng = np.random.default_rng(seed)
    ids = np.zeros((batch_size, seq_length), np.int32)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for row in range(batch_size):
        length = int(rng.integers(max(2, seq_length // 3), seq_length))  # < seq: padding
        ids[row, :length] = rng.integers(1, config.vocab_size, size=length)
        mask[row, :length] = 1
        if row % 2 and config.type_vocab_size > 1:
            types[row, length // 2:length] = 1
    return {features.INPUT_WORD_IDS: ids, features.INPUT_MASK: mask,
            features.INPUT_TYPE_IDS: types}


def compare(reference: dict, converted: dict) -> dict[str, float]:
    """Max |difference| per output, in the order embedding, layer_0.., sequence, pooled.

    Args:
      reference, converted: dicts shaped like `reference_forward`'s result; an output absent
        from either side is skipped.
    """
    diffs = {}
    if "embedding_output" in reference and "embedding_output" in converted:
        diffs["embedding_output"] = _max_diff(reference["embedding_output"],
                                              converted["embedding_output"])
    pairs = zip(reference[features.ENCODER_OUTPUTS], converted[features.ENCODER_OUTPUTS],
                strict=True)
    for i, (a, b) in enumerate(pairs):
        diffs[f"layer_{i}"] = _max_diff(a, b)
    for name in (features.SEQUENCE_OUTPUT, features.POOLED_OUTPUT):
        if name in reference and name in converted:
            diffs[name] = _max_diff(reference[name], converted[name])
    return diffs


def _max_diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def make_report(diffs: dict[str, float], inputs: dict, *, source: str,
                tolerance: float = TOLERANCE, degenerate: str | None = None) -> dict:
    """The JSON-ready parity report: per-output max |diff|, worst, and pass/fail.

    Args:
      degenerate: what `degenerate` found wrong with the outputs (they fail), or None.
    """
    worst = max(diffs, key=diffs.get)
    return {"source": source, "inputs_shape": list(inputs[features.INPUT_WORD_IDS].shape),
            "max_abs_diff": diffs, "worst": worst, "tolerance": tolerance,
            "degenerate": degenerate, "passed": diffs[worst] <= tolerance and not degenerate}


def degenerate(name: str, output) -> str | None:
    """Why an output says nothing about the weights (it is one constant, e.g. all zeros), or
    None. Two models of zeros agree perfectly: a parity check must not pass them."""
    output = np.asarray(output, np.float64)
    if output.size and not np.isfinite(output).all():
        return f"{name} holds NaN/Inf"
    if output.size and np.ptp(output) == 0:
        return f"{name} is constant ({float(output.flat[0]):g} everywhere)"
    return None


def format_report(report: dict) -> str:
    """Human-readable table of a `make_report` result."""
    lines = [f"parity vs {report['source']} on inputs {report['inputs_shape']} "
             "(float64 numpy reference vs converted Keras model):"]
    lines += [f"  {name:<18} max|diff| = {diff:.3e}"
              for name, diff in report["max_abs_diff"].items()]
    verdict = "PASS" if report["passed"] else "FAIL"
    lines.append(f"  {verdict}: worst {report['worst']} "
                 f"{report['max_abs_diff'][report['worst']]:.3e} (tolerance {report['tolerance']})")
    if report.get("degenerate"):
        lines.append(f"  FAIL: {report['degenerate']}: the outputs are degenerate, so the "
                     "weights carry no information; check the source checkpoint")
    return "\n".join(lines)


def write_report(path: str, report: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
        f.write("\n")


def keras_forward(encoder, inputs: dict) -> dict:
    """The converted encoder's outputs shaped like `reference_forward`'s, as numpy.

    The embedding output is read from the encoder's own graph (the output of its
    `embeddings_layer_norm`), not recomputed.
    """
    import keras  # noqa: PLC0415 (the numpy reference above needs no Keras)

    batch = [inputs[k] for k in features.ENCODER_INPUTS]
    outputs = encoder(batch, training=False)
    embedding = keras.Model(encoder.inputs, encoder.embeddings_layer_norm.output)(batch)
    result = {"embedding_output": keras.ops.convert_to_numpy(embedding),
              features.ENCODER_OUTPUTS: [keras.ops.convert_to_numpy(x)
                                         for x in outputs[features.ENCODER_OUTPUTS]],
              features.SEQUENCE_OUTPUT: keras.ops.convert_to_numpy(
                  outputs[features.SEQUENCE_OUTPUT])}
    result[features.POOLED_OUTPUT] = keras.ops.convert_to_numpy(outputs[features.POOLED_OUTPUT])
    return result


def verify(ckpt: formats.BertCheckpoint, encoder, *, inputs: dict | None = None,
           source: str | None = None) -> dict:
    """Parity report of `encoder` against the float64 forward pass of `ckpt`'s weights.

    Args:
      ckpt: the source weights.
      encoder: the converted BertEncoder.
      inputs: encoder inputs; default `parity_inputs(ckpt.config)`.
      source: name of the source in the report (default ckpt.weights_file).
    """
    inputs = parity_inputs(ckpt.config) if inputs is None else inputs
    converted = keras_forward(encoder, inputs)
    diffs = compare(reference_forward(ckpt, inputs), converted)
    return make_report(diffs, inputs, source=source or ckpt.weights_file, degenerate=degenerate(
        features.SEQUENCE_OUTPUT, converted[features.SEQUENCE_OUTPUT]))
