"""Hugging Face GPT-2 (`GPT2LMHeadModel`) safetensors into bert-train's `CausalLM`.

A GPT-2 directory holds `config.json` (model_type "gpt2") and `model.safetensors`. Tensor
names carry a `transformer.` prefix when written by `save_pretrained` and none in the hub's
original files; both are read. Every tensor maps onto one `CausalLM` variable, except
`c_attn`, which holds the query, key and value projections side by side:

    wte.weight [V, H]            word_embeddings (the output projection is tied to it)
    wpe.weight [P, H]            position_embedding
    h.N.ln_1.{weight,bias}       transformer_layer_N.self_attention_layer_norm
    h.N.attn.c_attn.weight [H, 3H], .bias [3H]
                                 self_attention.{query,key,value}_dense: columns q | k | v,
                                 each [H, heads, head_dim] with heads as contiguous blocks
    h.N.attn.c_proj.weight [H, H]  self_attention.output_dense [heads, head_dim, H]
    h.N.ln_2.{weight,bias}       transformer_layer_N.output_layer_norm (before the MLP)
    h.N.mlp.c_fc, h.N.mlp.c_proj intermediate_dense, output_dense
    ln_f.{weight,bias}           final_layer_norm

GPT-2's `Conv1D` stores its weight [in, out], a Keras kernel's orientation, so nothing is
transposed (BERT's `Linear` weights are). Old files also carry the causal-mask buffers
`h.N.attn.bias` / `h.N.attn.masked_bias`; they are not weights and are skipped. A pickle
`pytorch_model.bin` is refused as for BERT (`formats.pickle_refusal`).

GPT-2 tokenizes with a byte-level BPE (vocab.json + merges.txt), not WordPiece: bert-train
runs such a model on token ids only (`TEXT_REFUSAL`).
"""

import dataclasses
import math
import os
import re

import keras
import numpy as np
from absl import logging

from bert_trainer.errors import UserError
from bert_trainer.interop import formats, hf
from bert_trainer.models.causal_lm import CausalLM

MODEL_TYPE = formats.GPT2  # config.json's model_type
_PREFIX = "transformer."
_TIED_HEAD = "lm_head.weight"  # tied to wte; `save_pretrained` leaves it out
# GPT-2's config keys and the BERT ones whose bounds they take (formats.SIZE_BOUNDS).
_SIZE_KEYS = {"vocab_size": "vocab_size", "n_embd": "hidden_size", "n_layer": "num_hidden_layers",
              "n_head": "num_attention_heads", "n_inner": "intermediate_size",
              "n_positions": "max_position_embeddings"}
_BUFFER = re.compile(r"^h\.\d+\.attn\.(bias|masked_bias)$")

_APPROXIMATE = "gelu_approximate"  # CausalLM's name for the tanh form
# Hugging Face activation name -> the CausalLM inner_activation that computes the same.
_ACTIVATIONS = {"gelu_new": _APPROXIMATE, "gelu_pytorch_tanh": _APPROXIMATE, "gelu": "gelu",
                "relu": "relu", "tanh": "tanh"}
# Fields whose other values change the computation in ways CausalLM does not implement:
# (field, the value CausalLM computes, what the other value means).
_REQUIRED = (
    ("scale_attn_weights", True, "unscaled attention"),
    ("scale_attn_by_inverse_layer_idx", False, "scores divided by the layer index"),
    ("add_cross_attention", False, "cross-attention to an encoder"),
    ("tie_word_embeddings", True, "an output projection apart from the embeddings"),
)
# `reorder_and_upcast_attn` is accepted: it computes the same scores, only upcast to float32
# (which a float32 CausalLM is anyway).

_erf = np.vectorize(math.erf, otypes=[np.float64])
# Each CausalLM activation in float64 numpy: the reference pass of `gpt2_parity`, and the
# check of a model's activation by value (its name may be an alias, e.g. "gelu_new").
ACTIVATION_VALUES = {
    _APPROXIMATE: lambda x: 0.5 * x * (1.0 + np.tanh(
        math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),  # the exact erf form
    "relu": lambda x: np.maximum(x, 0.0),
    "tanh": np.tanh,
}

TEXT_REFUSAL = ("{source} is a GPT-2 model: it tokenizes with GPT-2's byte-level BPE, which "
                "bert-train cannot run (it tokenizes with WordPiece); use the model on token ids "
                "from Python (bert_trainer.interop.gpt2.from_gpt2), or train a causal LM with a "
                "WordPiece vocabulary")


def text_refusal(source: str) -> str:
    """The one-line message for a GPT-2 model asked to read or write text."""
    return TEXT_REFUSAL.format(source=source)


def check_text_support(task: dict | None, source: str) -> None:
    """Refuses, in one line, text for a model converted from GPT-2.

    Args:
      task: the `task` entry of the model's bert_train.json (`convert` writes
        `"source": "gpt2"` there).
      source: the model directory, named in the message.

    Raises:
      UserError: `text_refusal(source)` for a model converted from GPT-2.
    """
    if isinstance(task, dict) and task.get("source") == MODEL_TYPE:
        raise UserError(text_refusal(source))


@dataclasses.dataclass(frozen=True)
class GPT2Config:
    """The architecture of a GPT-2 checkpoint, in the RFC's argument names.

    `inner_activation` is the CausalLM's ("gelu_approximate" for "gelu_new").
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    inner_dim: int
    max_sequence_length: int
    inner_activation: str = _APPROXIMATE
    norm_epsilon: float = 1e-5
    output_dropout: float = 0.1
    attention_dropout: float = 0.1
    initializer_range: float = 0.02

    @classmethod
    def from_json(cls, path: str) -> "GPT2Config":
        """Reads a GPT-2 `config.json` (transformers' defaults for absent fields).

        Raises:
          UserError: another model_type, or a field CausalLM cannot represent (named).
        """
        raw = formats.read_json(path)
        if raw.get("model_type") != MODEL_TYPE:
            raise UserError(f"{path}: model_type is {raw.get('model_type')!r}, not "
                            f"'{MODEL_TYPE}'; this is not a GPT-2 config")
        activation = raw.get("activation_function", "gelu_new")
        if activation not in _ACTIVATIONS:
            raise UserError(f"{path}: activation_function {activation!r} is not supported; "
                            f"bert-train converts {', '.join(_ACTIVATIONS)}")
        for field, value, meaning in _REQUIRED:
            if bool(raw.get(field, value)) != value:
                raise UserError(f"{path}: {field}={raw[field]} ({meaning}) is not supported; "
                                f"bert-train's CausalLM computes {field}={value}")
        bounds = {gpt2_key: formats.SIZE_BOUNDS[key] for gpt2_key, key in _SIZE_KEYS.items()}
        formats.check_bounds(path, {k: formats.integer(path, raw, k) for k in bounds
                                    if raw.get(k) is not None}, bounds)
        hidden = int(raw.get("n_embd", 768))
        config = cls(
            vocab_size=int(raw.get("vocab_size", 50257)), hidden_size=hidden,
            num_layers=int(raw.get("n_layer", 12)),
            num_attention_heads=int(raw.get("n_head", 12)),
            inner_dim=int(raw.get("n_inner") or 4 * hidden),
            max_sequence_length=int(raw.get("n_positions", 1024)),
            inner_activation=_ACTIVATIONS[activation],
            norm_epsilon=float(raw.get("layer_norm_epsilon", 1e-5)),
            output_dropout=float(raw.get("resid_pdrop", 0.1)),
            attention_dropout=float(raw.get("attn_pdrop", 0.1)),
            initializer_range=float(raw.get("initializer_range", 0.02)))
        if config.hidden_size % config.num_attention_heads:
            raise UserError(f"{path}: n_embd={config.hidden_size} is not divisible by "
                            f"n_head={config.num_attention_heads}")
        return config

    def model_arguments(self) -> dict:
        """The `CausalLM` constructor arguments (JSON-ready): pre-norm, tied output."""
        return dict(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            num_layers=self.num_layers, num_attention_heads=self.num_attention_heads,
            inner_dim=self.inner_dim, inner_activation=self.inner_activation,
            max_sequence_length=self.max_sequence_length, norm_first=True,
            norm_epsilon=self.norm_epsilon, output_dropout=self.output_dropout,
            attention_dropout=self.attention_dropout,
            initializer_range=self.initializer_range)


@dataclasses.dataclass
class GPT2Checkpoint:
    """A GPT-2 read from safetensors: its config and float32 arrays under GPT-2 names.

    Attributes:
      config: the architecture.
      weights: GPT-2 name without the `transformer.` prefix (`h.0.attn.c_attn.weight`) ->
        np.ndarray, every name of `expected_shapes(config)`, shape-checked.
      skipped: names in the file that are not weights (attention mask buffers, the tied
        `lm_head.weight`).
      config_file, weights_file: the source files, named in messages.
    """

    config: GPT2Config
    weights: dict[str, np.ndarray]
    skipped: list[str]
    config_file: str
    weights_file: str


def expected_shapes(config: GPT2Config) -> dict[str, tuple[int, ...]]:
    """GPT-2 tensor name (no prefix) -> shape, for every weight of a model with `config`."""
    v, p, h, i = (config.vocab_size, config.max_sequence_length, config.hidden_size,
                  config.inner_dim)
    shapes = {"wte.weight": (v, h), "wpe.weight": (p, h)}
    for n in range(config.num_layers):
        shapes.update({
            f"h.{n}.ln_1.weight": (h,), f"h.{n}.ln_1.bias": (h,),
            f"h.{n}.attn.c_attn.weight": (h, 3 * h), f"h.{n}.attn.c_attn.bias": (3 * h,),
            f"h.{n}.attn.c_proj.weight": (h, h), f"h.{n}.attn.c_proj.bias": (h,),
            f"h.{n}.ln_2.weight": (h,), f"h.{n}.ln_2.bias": (h,),
            f"h.{n}.mlp.c_fc.weight": (h, i), f"h.{n}.mlp.c_fc.bias": (i,),
            f"h.{n}.mlp.c_proj.weight": (i, h), f"h.{n}.mlp.c_proj.bias": (h,),
        })
    shapes.update({"ln_f.weight": (h,), "ln_f.bias": (h,)})
    return shapes


def checkpoint_directory(path: str) -> str:
    """The GPT-2 directory for `path`: the directory itself, or that of its model.safetensors."""
    if os.path.isfile(path) and os.path.basename(path) in (formats.HF_WEIGHTS, formats.HF_PICKLE):
        return os.path.dirname(path) or "."
    if not os.path.isdir(path):
        what = "is not a GPT-2 weights file" if os.path.exists(path) else "does not exist"
        raise UserError(f"{path} {what}; pass a GPT-2 directory (config.json + "
                        f"{formats.HF_WEIGHTS}) or its {formats.HF_WEIGHTS}")
    return path


def read_gpt2(path: str, *, allow_pickle: bool = False) -> GPT2Checkpoint:
    """Reads and checks a GPT-2 checkpoint: every weight present, named and shaped as
    config.json implies, nothing unknown.

    Args:
      path: a directory with config.json and model.safetensors (or a sharded index), or
        that model.safetensors file.
      allow_pickle: also read pytorch_model.bin (needs torch); refused otherwise.

    Returns:
      A `GPT2Checkpoint`.

    Raises:
      UserError: a config CausalLM cannot represent, a pickle without `allow_pickle`, or a
        missing, extra or misshapen tensor (named, one line).
    """
    directory = checkpoint_directory(path)
    config_file = os.path.join(directory, formats.HF_CONFIG)
    config = GPT2Config.from_json(config_file)
    source = hf.tensor_source(directory, allow_pickle)
    skipped = check_source(source, config, config_file)  # before any tensor is read
    file_names = {k.removeprefix(_PREFIX): k for k in source.shapes}
    weights_file, expected = source.weights_file, expected_shapes(config)
    wanted = [*expected, *([_TIED_HEAD, "wte.weight"] if _TIED_HEAD in file_names else [])]
    tensors = {k.removeprefix(_PREFIX): v
               for k, v in source.read(file_names[k] for k in wanted).items()}
    if _TIED_HEAD in tensors and not np.array_equal(tensors[_TIED_HEAD], tensors["wte.weight"]):
        raise UserError(f"{weights_file}: {_TIED_HEAD} differs from wte.weight; an untied "
                        "output projection cannot be converted (CausalLM ties it)")
    weights = {}
    for name, shape in expected.items():
        array = formats.float_weight(name, tensors[name], weights_file).astype(np.float32)
        if array.shape != shape:
            raise UserError(f"{config_file} does not fit {weights_file}: {name} has shape "
                            f"{array.shape} but the config implies {shape}")
        weights[name] = array
    return GPT2Checkpoint(config, weights, skipped, config_file, weights_file)


def check_source(source, config: GPT2Config, config_file: str) -> list[str]:
    """Checks the names and shapes a weights file declares (`hf.tensor_source`: its header)
    against the config's, before any tensor is read.

    Returns:
      The names that are not weights (attention mask buffers, the tied lm_head.weight).

    Raises:
      UserError: a layer count, an unknown, missing or misshapen tensor (named, one line).
    """
    shapes = {k.removeprefix(_PREFIX): v for k, v in source.shapes.items()}
    weights_file, expected = source.weights_file, expected_shapes(config)
    skipped = sorted(k for k in shapes if _BUFFER.match(k))
    if _TIED_HEAD in shapes:
        skipped.append(_TIED_HEAD)
        if "wte.weight" in shapes and shapes[_TIED_HEAD] != shapes["wte.weight"]:
            raise UserError(f"{weights_file}: {_TIED_HEAD} differs from wte.weight; an untied "
                            "output projection cannot be converted (CausalLM ties it)")
    held = {int(m.group(1)) for k in shapes if (m := re.match(r"^h\.(\d+)\.", k))}
    if held and max(held) + 1 != config.num_layers:
        raise UserError(f"{config_file} says n_layer={config.num_layers} but {weights_file} "
                        f"holds {max(held) + 1} layers; use the config of these weights")
    extra = sorted(set(shapes) - set(expected) - set(skipped))
    if extra:
        raise UserError(f"{weights_file}: unexpected tensor {extra[0]} ({len(extra)} unknown); "
                        "is this a GPT2LMHeadModel / GPT2Model checkpoint?")
    missing = [k for k in expected if k not in shapes]
    if missing:
        raise UserError(f"{weights_file} lacks {missing[0]} ({len(missing)} of {len(expected)} "
                        "tensors missing); is this a complete GPT-2 checkpoint?")
    for name, shape in expected.items():
        if tuple(shapes[name]) != shape:
            raise UserError(f"{config_file} does not fit {weights_file}: {name} has shape "
                            f"{tuple(shapes[name])} but the config implies {shape}")
    return skipped


def split_qkv(kernel: np.ndarray, bias: np.ndarray, num_heads: int) -> list[tuple]:
    """Splits GPT-2's fused `c_attn` into query, key and value in Keras' per-head layout.

    Args:
      kernel: `[hidden, 3 * hidden]`, the columns q | k | v, each heads side by side.
      bias: `[3 * hidden]`, in the same order.
      num_heads: the number of attention heads.

    Returns:
      `[(kernel [hidden, heads, head_dim], bias [heads, head_dim])]` for query, key, value.
    """
    hidden = kernel.shape[0]
    head_dim = hidden // num_heads
    kernels = np.split(kernel, 3, axis=1)  # 3 x (hidden, hidden)
    biases = np.split(bias, 3)  # 3 x (hidden,)
    return [(k.reshape(hidden, num_heads, head_dim), b.reshape(num_heads, head_dim))
            for k, b in zip(kernels, biases, strict=True)]


def _variables(model, config: GPT2Config) -> dict[str, tuple]:
    """GPT-2 name -> the CausalLM variables it fills (three for `c_attn`)."""
    def norm(layer):
        return {"weight": (layer.gamma,), "bias": (layer.beta,)}

    def dense(layer):
        return {"weight": (layer.kernel,), "bias": (layer.bias,)}

    groups = {"wte": {"weight": (model.word_embeddings.embeddings,)},
              "wpe": {"weight": (model.position_embedding.embeddings,)},
              "ln_f": norm(model.final_layer_norm)}
    for n in range(config.num_layers):
        layer = model.transformer_layers[n]
        attention = layer.self_attention
        projections = (attention.query_dense, attention.key_dense, attention.value_dense)
        groups.update({
            f"h.{n}.ln_1": norm(layer.self_attention_layer_norm),
            f"h.{n}.attn.c_attn": {"weight": tuple(p.kernel for p in projections),
                                   "bias": tuple(p.bias for p in projections)},
            f"h.{n}.attn.c_proj": dense(attention.output_dense),
            f"h.{n}.ln_2": norm(layer.output_layer_norm),
            f"h.{n}.mlp.c_fc": dense(layer.intermediate_dense),
            f"h.{n}.mlp.c_proj": dense(layer.output_dense),
        })
    return {f"{group}.{leaf}": variables for group, leaves in groups.items()
            for leaf, variables in leaves.items()}


# Sizes a model must share with the checkpoint. The heads are checked although no weight
# count depends on them: [H, heads, head_dim] reshapes silently to another head split.
_ARCHITECTURE = ("vocab_size", "hidden_size", "num_layers", "num_attention_heads", "inner_dim",
                 "max_sequence_length", "norm_epsilon")
# CausalLM arguments that change no weight, so `from_gpt2` may set them.
OVERRIDABLE = ("output_dropout", "attention_dropout", "dtype", "name")


def load_weights(model, ckpt: GPT2Checkpoint) -> dict[str, list[str]]:
    """Assigns a GPT-2 checkpoint's weights to a `CausalLM` of the same architecture.

    Args:
      model: a pre-norm `CausalLM` (built here if it is not yet).
      ckpt: from `read_gpt2`.

    Returns:
      {"loaded": variable paths assigned, "initialized": the others (none for a CausalLM)}.

    Raises:
      UserError: not a CausalLM, or one that differs in a size, in norm_first or in a
        variable's shape.
    """
    if not isinstance(model, CausalLM):
        raise UserError(f"{ckpt.config_file} is a GPT-2 (causal LM) checkpoint: it loads into a "
                        f"CausalLM (the causal_lm objective), not a {type(model).__name__}")
    if not model.weights:
        model({"input_word_ids": np.zeros((1, 1), np.int32)})
    for field in _ARCHITECTURE:
        if getattr(model, field) != getattr(ckpt.config, field):
            raise UserError(f"{ckpt.config_file} has {field}={getattr(ckpt.config, field)} but "
                            f"the model has {field}={getattr(model, field)}; build the model "
                            "from the checkpoint (bert_trainer.interop.gpt2.from_gpt2)")
    if not model.norm_first:
        raise UserError(f"{ckpt.config_file}: GPT-2 is pre-norm but the model has "
                        "norm_first=False; build it with norm_first=True")
    _check_activation(model, ckpt)
    loaded = []
    for name, variables in _variables(model, ckpt.config).items():
        array = ckpt.weights[name]
        if name.endswith("c_attn.weight"):
            arrays = [k for k, _ in split_qkv(array, ckpt.weights[name[:-6] + "bias"],
                                              ckpt.config.num_attention_heads)]
        elif name.endswith("c_attn.bias"):
            arrays = [b for _, b in split_qkv(ckpt.weights[name[:-4] + "weight"], array,
                                              ckpt.config.num_attention_heads)]
        else:
            arrays = [array]
        for variable, value in zip(variables, arrays, strict=True):
            if value.size != np.prod(variable.shape):
                raise UserError(f"{name} has shape {value.shape} but {variable.path} needs "
                                f"{tuple(variable.shape)}; the model is of another size")
            # Reshape only folds heads ([H, H] <-> [H, heads, head_dim]); never transposes.
            variable.assign(np.reshape(value, variable.shape).astype(variable.dtype))
            loaded.append(variable.path)
    done = set(loaded)
    paths = list(dict.fromkeys(v.path for v in model.weights))
    return {"loaded": [p for p in paths if p in done],
            "initialized": [p for p in paths if p not in done]}


def _check_activation(model, ckpt: GPT2Checkpoint) -> None:
    """Refuses a model whose feed-forward activation computes other values than GPT-2's."""
    probe = np.linspace(-3.0, 3.0, 13, dtype=np.float32)
    layer = model.transformer_layers[0]
    ours = np.asarray(keras.ops.convert_to_numpy(layer.inner_activation(probe)), np.float64)
    expected = ACTIVATION_VALUES[ckpt.config.inner_activation](probe.astype(np.float64))
    # Exact and tanh-approximate GELU differ by up to ~1e-3 on this probe.
    if np.max(np.abs(ours - expected)) > 1e-5:
        raise UserError(f"{ckpt.config_file}'s activation is {ckpt.config.inner_activation} but "
                        f"the model's inner_activation is {model.inner_activation!r}; build the "
                        f"model with inner_activation='{ckpt.config.inner_activation}'")


@dataclasses.dataclass
class PretrainedCausalLM:
    """What `from_gpt2` returns: the loaded model, its source and what was loaded."""

    model: keras.Model
    checkpoint: GPT2Checkpoint
    loaded: list[str]
    initialized: list[str]


def build_model(config: GPT2Config, **overrides) -> keras.Model:
    """A freshly initialized `CausalLM` of `config`'s architecture (no weights loaded)."""
    return CausalLM(**{**config.model_arguments(), **overrides})


def from_gpt2(path: str, *, allow_pickle: bool = False, **overrides) -> PretrainedCausalLM:
    """Builds a `CausalLM` with a GPT-2 checkpoint's architecture and loads its weights.

    Args:
      path: a GPT-2 directory (config.json + model.safetensors) or its model.safetensors.
      allow_pickle: accept pytorch_model.bin (needs torch).
      **overrides: CausalLM arguments that change no weight (e.g. `output_dropout=0.0`,
        `dtype`).

    Returns:
      A `PretrainedCausalLM`.
    """
    unknown = sorted(set(overrides) - set(OVERRIDABLE))
    if unknown:
        raise UserError(f"from_gpt2: {unknown} would change the architecture read from {path}; "
                        f"only {list(OVERRIDABLE)} may be overridden")
    ckpt = read_gpt2(path, allow_pickle=allow_pickle)
    model = build_model(ckpt.config, **overrides)
    report = load_weights(model, ckpt)
    c = ckpt.config
    logging.info("GPT-2 from %s: %d layers, hidden %d, %d heads, vocab %d, %d positions; "
                 "%d tensors into %d variables, skipped %s", ckpt.weights_file, c.num_layers,
                 c.hidden_size, c.num_attention_heads, c.vocab_size, c.max_sequence_length,
                 len(ckpt.weights), len(report["loaded"]), ", ".join(ckpt.skipped) or "nothing")
    return PretrainedCausalLM(model, ckpt, report["loaded"], report["initialized"])
