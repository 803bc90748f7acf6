"""Checkpoint formats: detection, the reference weight layout, and the checks every reader runs.

Every reader (Hugging Face, Google TF1) turns its files into a `BertCheckpoint`: a `BertConfig`
plus numpy arrays under the *reference names* of google-research/bert `modeling.py`
(`bert/encoder/layer_0/attention/self/query/kernel`, ...). That layout is the hub of every
conversion: kernels are stored [in, out] as in TF, the attention kernels are [hidden, hidden]
(heads folded), and `cls/seq_relationship/output_weights` keeps Google's [2, hidden].
"""

import dataclasses
import glob
import json
import os

import numpy as np

from bert_trainer.checkpoints.model_dir import MODEL_INFO_FILE
from bert_trainer.errors import UserError

BERT_TRAIN, HF, TF1 = "bert_train", "hf", "tf1"
# A Hugging Face GPT-2 directory: HF's files, with model_type "gpt2" (`interop.gpt2`).
GPT2 = "gpt2"
FORMATS = (BERT_TRAIN, HF, TF1, GPT2)

HF_CONFIG, HF_WEIGHTS, HF_INDEX = "config.json", "model.safetensors", "model.safetensors.index.json"
HF_PICKLE = "pytorch_model.bin"
TF1_CONFIG, TF1_PREFIX = "bert_config.json", "bert_model.ckpt"
VOCAB_FILE = "vocab.txt"

# Activations whose meaning is the same in Hugging Face, Google BERT and Keras: HF/Google
# "gelu" is the exact erf form, and so is keras.activations.gelu (approximate=False).
SUPPORTED_ACTIVATIONS = ("gelu", "relu", "tanh")

# Weight groups: the encoder is required; the others are carried when present, all or nothing.
ENCODER, POOLER, MASKED_LM, NEXT_SENTENCE = "encoder", "pooler", "masked_lm", "next_sentence"
GROUPS = (ENCODER, POOLER, MASKED_LM, NEXT_SENTENCE)

# Symbolic shapes: V vocab, P positions, T types, H hidden, I inner (intermediate).
_EMBEDDINGS = {
    "bert/embeddings/word_embeddings": ("V", "H"),
    "bert/embeddings/position_embeddings": ("P", "H"),
    "bert/embeddings/token_type_embeddings": ("T", "H"),
    "bert/embeddings/LayerNorm/gamma": ("H",),
    "bert/embeddings/LayerNorm/beta": ("H",),
}
_LAYER = {
    "attention/self/query/kernel": ("H", "H"),
    "attention/self/query/bias": ("H",),
    "attention/self/key/kernel": ("H", "H"),
    "attention/self/key/bias": ("H",),
    "attention/self/value/kernel": ("H", "H"),
    "attention/self/value/bias": ("H",),
    "attention/output/dense/kernel": ("H", "H"),
    "attention/output/dense/bias": ("H",),
    "attention/output/LayerNorm/gamma": ("H",),
    "attention/output/LayerNorm/beta": ("H",),
    "intermediate/dense/kernel": ("H", "I"),
    "intermediate/dense/bias": ("I",),
    "output/dense/kernel": ("I", "H"),
    "output/dense/bias": ("H",),
    "output/LayerNorm/gamma": ("H",),
    "output/LayerNorm/beta": ("H",),
}
_POOLER = {"bert/pooler/dense/kernel": ("H", "H"), "bert/pooler/dense/bias": ("H",)}
_MASKED_LM = {
    "cls/predictions/transform/dense/kernel": ("H", "H"),
    "cls/predictions/transform/dense/bias": ("H",),
    "cls/predictions/transform/LayerNorm/gamma": ("H",),
    "cls/predictions/transform/LayerNorm/beta": ("H",),
    "cls/predictions/output_bias": ("V",),
}
_NEXT_SENTENCE = {
    "cls/seq_relationship/output_weights": (2, "H"),
    "cls/seq_relationship/output_bias": (2,),
}
# Each symbol's config key (the same in HF config.json and Google bert_config.json) and the
# BertConfig field it becomes.
_SYMBOLS = {"V": ("vocab_size", "vocab_size"),
            "P": ("max_position_embeddings", "max_sequence_length"),
            "T": ("type_vocab_size", "type_vocab_size"),
            "H": ("hidden_size", "hidden_size"),
            "I": ("intermediate_size", "inner_dim")}


# What a config may say, far beyond any released BERT or GPT-2 (the largest: 30 to 250
# thousand tokens, hidden 1,600, 48 layers, 25 heads, 6,400 inner units, 1,024 to 8,192
# positions) yet refusing sizes no machine could build: (config key, lowest, highest).
SIZE_BOUNDS = {"vocab_size": (1, 1 << 22), "hidden_size": (1, 1 << 16),
               "num_hidden_layers": (1, 1024), "num_attention_heads": (1, 1024),
               "intermediate_size": (1, 1 << 18), "max_position_embeddings": (1, 1 << 20),
               "type_vocab_size": (1, 1 << 10)}


def check_bounds(path: str, sizes: dict[str, int], bounds: dict | None = None) -> None:
    """Refuses a size outside SIZE_BOUNDS (or `bounds`: {config key: (lowest, highest)}),
    before anything is built from it.

    Args:
      path: the config file, named in the message.
      sizes: config key -> value as read.

    Raises:
      UserError: naming the first field out of bounds, its value and the bounds.
    """
    for key, (low, high) in (bounds or SIZE_BOUNDS).items():
        value = sizes.get(key)
        if value is not None and not low <= value <= high:
            raise UserError(f"{path}: {key}={value} is outside [{low}, {high}]; this is no "
                            "model bert-train can build: use the config.json of the weights")


def layer_prefix(index: int) -> str:
    return f"bert/encoder/layer_{index}/"


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """The architecture of a converted BERT, in the RFC's argument names.

    `from_json` reads the config file shared by Hugging Face (`config.json`) and Google
    (`bert_config.json`); `encoder_kwargs()` gives the BertEncoder arguments.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    inner_dim: int
    max_sequence_length: int
    type_vocab_size: int = 2
    inner_activation: str = "gelu"
    output_dropout: float = 0.1
    attention_dropout: float = 0.1
    initializer_range: float = 0.02
    norm_epsilon: float = 1e-12

    @classmethod
    def from_json(cls, path: str) -> "BertConfig":
        """Reads an HF `config.json` or a Google `bert_config.json`; UserError on bad values."""
        raw = read_json(path)
        missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                               "num_attention_heads", "intermediate_size") if k not in raw]
        if missing:
            raise UserError(f"{path}: missing {', '.join(missing)}; is this a BERT config?")
        if raw.get("model_type", "bert") != "bert":
            raise UserError(f"{path}: model_type is '{raw['model_type']}'; only 'bert' converts")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise UserError(f"{path}: position_embedding_type "
                            f"'{raw['position_embedding_type']}' is not supported; use 'absolute'")
        activation = raw.get("hidden_act", "gelu")
        if activation not in SUPPORTED_ACTIVATIONS:
            raise UserError(f"{path}: hidden_act '{activation}' is not supported; bert-train "
                            f"converts {', '.join(SUPPORTED_ACTIVATIONS)} (gelu = exact erf form)")
        check_bounds(path, {key: integer(path, raw, key) for key in SIZE_BOUNDS
                            if key in raw})
        config = cls(
            vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=int(raw["num_attention_heads"]),
            inner_dim=int(raw["intermediate_size"]),
            max_sequence_length=int(raw.get("max_position_embeddings", 512)),
            type_vocab_size=int(raw.get("type_vocab_size", 2)), inner_activation=activation,
            output_dropout=float(raw.get("hidden_dropout_prob", 0.1)),
            attention_dropout=float(raw.get("attention_probs_dropout_prob", 0.1)),
            initializer_range=float(raw.get("initializer_range", 0.02)),
            norm_epsilon=float(raw.get("layer_norm_eps", 1e-12)))
        if config.hidden_size % config.num_attention_heads:
            raise UserError(f"{path}: hidden_size={config.hidden_size} is not divisible by "
                            f"num_attention_heads={config.num_attention_heads}")
        return config

    def to_json_dict(self) -> dict:
        """The keys HF `BertConfig` and Google `BertConfig.from_dict` both read."""
        return {
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_attention_heads,
            "intermediate_size": self.inner_dim, "hidden_act": self.inner_activation,
            "hidden_dropout_prob": self.output_dropout,
            "attention_probs_dropout_prob": self.attention_dropout,
            "max_position_embeddings": self.max_sequence_length,
            "type_vocab_size": self.type_vocab_size,
            "initializer_range": self.initializer_range, "layer_norm_eps": self.norm_epsilon,
        }

    def symbols(self) -> dict[str, int]:
        return {sym: getattr(self, field) for sym, (_, field) in _SYMBOLS.items()}


def reference_shapes(config: BertConfig, group: str) -> dict[str, tuple[int, ...]]:
    """Reference names → shapes for one weight group (see GROUPS) of a BERT with `config`."""
    return {name: tuple(config.symbols().get(d, d) for d in dims)
            for name, dims in _symbolic(config.num_layers, group).items()}


def _symbolic(num_layers: int, group: str) -> dict[str, tuple]:
    if group == ENCODER:
        names = dict(_EMBEDDINGS)
        for i in range(num_layers):
            names.update({layer_prefix(i) + k: v for k, v in _LAYER.items()})
        return names
    return {POOLER: _POOLER, MASKED_LM: _MASKED_LM, NEXT_SENTENCE: _NEXT_SENTENCE}[group]


@dataclasses.dataclass
class BertCheckpoint:
    """A BERT read from any format: config, reference-named float arrays and vocabulary.

    Attributes:
      config: the architecture.
      weights: reference name (see module docstring) → np.ndarray; the encoder group always,
        the pooler / masked_lm / next_sentence groups when the source had them.
      vocab_file: absolute path of the WordPiece vocabulary, or None.
      lower_case: whether the vocabulary expects lower-cased, accent-stripped text.
      weights_file, config_file: the source files, named in error messages.
    """

    config: BertConfig
    weights: dict[str, np.ndarray]
    vocab_file: str | None
    lower_case: bool
    weights_file: str
    config_file: str

    def has(self, group: str) -> bool:
        return all(n in self.weights for n in reference_shapes(self.config, group))


def float_weight(name: str, array, source: str) -> np.ndarray:
    """A weight as read, in its own float dtype, refused unless it is float and finite.

    A file of integer or boolean tensors cast to float converts to a model of zeros that even
    a parity check passes (both sides hold the same zeros); NaN/Inf weights give NaN outputs.

    Args:
      name: the tensor's name in the source file.
      array: its values.
      source: the file, named in the message.

    Raises:
      UserError: naming the tensor, its dtype or its count of non-finite values.
    """
    array = np.asarray(array)
    if not np.issubdtype(array.dtype, np.floating):
        raise UserError(f"{source}: {name} holds {array.dtype} values where float weights "
                        "belong; this is not a model's weights (save it with float32 or "
                        "float16 tensors)")
    finite = np.isfinite(array)
    if not finite.all():
        raise UserError(f"{source}: {name} holds {int(finite.size - finite.sum())} NaN/Inf "
                        "values; the checkpoint is corrupt or its training diverged (use an "
                        "earlier checkpoint)")
    return array


def integer(path: str, raw: dict, key: str) -> int:
    """`raw[key]`, a whole number (an integral float too); UserError naming the key if not."""
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not value.is_integer()):
        raise UserError(f"{path}: {key}={value!r} is not a whole number")
    return int(value)


def validate(ckpt: BertCheckpoint) -> None:
    """Checks that config, weights and vocabulary fit each other; UserError naming both sides."""
    check_fit(ckpt.config, {n: tuple(w.shape) for n, w in ckpt.weights.items()},
              config_file=ckpt.config_file, weights_file=ckpt.weights_file,
              vocab_file=ckpt.vocab_file)


def check_fit(config: BertConfig, shapes: dict[str, tuple[int, ...]], *, config_file: str,
              weights_file: str, vocab_file: str | None = None) -> None:
    """Checks that a config and the shapes of the weights (by reference name; from a file's
    header, before any tensor is read) fit each other, and the vocabulary the embeddings.

    Raises:
      UserError: naming the config, the weights file, the tensor and both shapes.
    """
    held = sum(1 for n in shapes if n.endswith("attention/self/query/kernel"))
    if held and held != config.num_layers:
        raise UserError(f"{config_file} says num_hidden_layers={config.num_layers} but "
                        f"{weights_file} holds {held} layers; use the config of these weights")
    for group in GROUPS:
        expected_shapes = reference_shapes(config, group)
        present = [n for n in expected_shapes if n in shapes]
        if group != ENCODER and not present:
            continue
        for name in present:  # a shape the config does not imply first: the likelier cause
            actual, expected = tuple(shapes[name]), expected_shapes[name]
            if actual != expected:
                raise UserError(
                    f"{config_file} does not fit {weights_file}: {name} has shape "
                    f"{actual} but the config ({_explain(name, config)}) implies {expected}")
        missing = [n for n in expected_shapes if n not in shapes]
        if missing:
            raise UserError(f"{weights_file}: the {group} lacks {missing[0]} (reference "
                            f"name; {len(missing)} of {len(expected_shapes)} tensors missing); "
                            "is this a complete BERT checkpoint?")
    if vocab_file:
        _check_vocab(vocab_file, shapes["bert/embeddings/word_embeddings"][0], weights_file)


def _explain(name: str, config: BertConfig) -> str:
    """'vocab_size=30522, hidden_size=384': the config entries that set `name`'s shape."""
    dims = _symbolic(config.num_layers, _group_of(name))[name]
    keys = dict.fromkeys(_SYMBOLS[d] for d in dims if isinstance(d, str))
    return ", ".join(f"{key}={getattr(config, field)}" for key, field in keys)


def _group_of(name: str) -> str:
    for group in (POOLER, MASKED_LM, NEXT_SENTENCE):
        if name in _symbolic(0, group):
            return group
    return ENCODER


def _check_vocab(vocab_file: str, rows: int, weights_file: str) -> None:
    with open(vocab_file, encoding="utf-8") as f:
        tokens = sum(1 for _ in f)
    if tokens != rows:
        raise UserError(f"{vocab_file} has {tokens} tokens but the embedding table in "
                        f"{weights_file} has {rows} rows; use the vocab.txt of these weights")


def read_json(path: str) -> dict:
    """Reads a JSON object file; UserError naming the file when absent or malformed."""
    if not os.path.isfile(path):
        raise UserError(f"{path} does not exist")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); fix or replace the file") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} must hold a JSON object, found {type(data).__name__}")
    return data


def detect_format(path: str, *, allow_pickle: bool = False) -> str:
    """Which checkpoint format the directory `path` holds: BERT_TRAIN, HF, TF1 or GPT2.

    Raises:
      UserError: `path` is missing, is no known layout, or holds only a pickle
        `pytorch_model.bin` while `allow_pickle` is False.
    """
    if not os.path.exists(path):
        raise UserError(f"{path} does not exist; pass a checkpoint directory")
    if not os.path.isdir(path):
        raise UserError(f"{path} is a file; pass the directory that holds it")
    files = set(os.listdir(path))
    if MODEL_INFO_FILE in files:
        return BERT_TRAIN
    if HF_CONFIG in files and (HF_WEIGHTS in files or HF_INDEX in files):
        return _hf_kind(path)
    if HF_CONFIG in files and HF_PICKLE in files:
        if not allow_pickle:
            raise UserError(pickle_refusal(os.path.join(path, HF_PICKLE)))
        return _hf_kind(path)
    if TF1_CONFIG in files and any(f.endswith(".index") for f in files):
        return TF1
    found = ", ".join(sorted(files)[:8]) or "nothing"
    raise UserError(f"{path} is not a BERT checkpoint directory: expected {MODEL_INFO_FILE} "
                    f"(bert-train), {HF_CONFIG} + {HF_WEIGHTS} (Hugging Face) or {TF1_CONFIG} + "
                    f"{TF1_PREFIX}.index (Google TF1); found {found}")


def _hf_kind(path: str) -> str:
    """HF, or GPT2 when the directory's config.json says model_type "gpt2"."""
    model_type = read_json(os.path.join(path, HF_CONFIG)).get("model_type")
    return GPT2 if model_type == GPT2 else HF


def pickle_refusal(path: str) -> str:
    return (f"{path} is a pickle (loading it can run arbitrary code), so it is not read by "
            "default; convert it once with torch (safetensors.torch.save_file(torch.load(f, "
            "weights_only=True), 'model.safetensors')) or pass --allow_pickle with torch installed")


def tf1_prefix(path: str) -> str:
    """The checkpoint prefix inside a Google TF1 directory (bert_model.ckpt preferred)."""
    preferred = os.path.join(path, TF1_PREFIX)
    if os.path.isfile(preferred + ".index"):
        return preferred
    prefixes = sorted(p[: -len(".index")] for p in glob.glob(os.path.join(path, "*.index")))
    if len(prefixes) != 1:
        raise UserError(f"{path}: expected one {TF1_PREFIX}.index, found "
                        f"{len(prefixes)} checkpoints; keep one or pass its directory alone")
    return prefixes[0]


def find_vocab(path: str, *, required: bool) -> str | None:
    vocab = os.path.join(path, VOCAB_FILE)
    if os.path.isfile(vocab):
        return os.path.abspath(vocab)
    if required:
        raise UserError(f"{vocab} does not exist; Google BERT checkpoints ship their vocab.txt "
                        "beside bert_model.ckpt: copy it there")
    return None
