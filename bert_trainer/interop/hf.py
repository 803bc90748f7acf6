"""Hugging Face BERT directories: read `config.json` + `model.safetensors`, and write them back.

HF tensor names map one to one onto the reference (Google) names of `formats.py`; a `Linear`
weight is [out, in] and becomes a reference `kernel` [in, out] by a transpose. Checkpoints of
`BertModel` have no prefix (`embeddings.word_embeddings.weight`), those of `BertFor*` models a
`bert.` prefix and the heads under `cls.`. The shapes in a safetensors header are checked
against config.json before any tensor is read (`tensor_files.py`), and only the tensors used
are read; a pickle `pytorch_model.bin` only with `allow_pickle=True` and torch installed.
"""

import json
import os
import shutil

import numpy as np
from safetensors.numpy import save_file

from bert_trainer.errors import UserError
from bert_trainer.interop import formats, tensor_files

_EMBEDDINGS = {
    "embeddings.word_embeddings.weight": "bert/embeddings/word_embeddings",
    "embeddings.position_embeddings.weight": "bert/embeddings/position_embeddings",
    "embeddings.token_type_embeddings.weight": "bert/embeddings/token_type_embeddings",
    "embeddings.LayerNorm.weight": "bert/embeddings/LayerNorm/gamma",
    "embeddings.LayerNorm.bias": "bert/embeddings/LayerNorm/beta",
}
_LAYER = {
    "attention.self.query.{}": "attention/self/query/{}",
    "attention.self.key.{}": "attention/self/key/{}",
    "attention.self.value.{}": "attention/self/value/{}",
    "attention.output.dense.{}": "attention/output/dense/{}",
    "attention.output.LayerNorm.{}": "attention/output/LayerNorm/{}",
    "intermediate.dense.{}": "intermediate/dense/{}",
    "output.dense.{}": "output/dense/{}",
    "output.LayerNorm.{}": "output/LayerNorm/{}",
}
_POOLER = {"pooler.dense.weight": "bert/pooler/dense/kernel",
           "pooler.dense.bias": "bert/pooler/dense/bias"}
# Head names carry no `bert.` prefix.
_HEADS = {
    "cls.predictions.transform.dense.weight": "cls/predictions/transform/dense/kernel",
    "cls.predictions.transform.dense.bias": "cls/predictions/transform/dense/bias",
    "cls.predictions.transform.LayerNorm.weight": "cls/predictions/transform/LayerNorm/gamma",
    "cls.predictions.transform.LayerNorm.bias": "cls/predictions/transform/LayerNorm/beta",
    "cls.predictions.bias": "cls/predictions/output_bias",
    "cls.seq_relationship.weight": "cls/seq_relationship/output_weights",
    "cls.seq_relationship.bias": "cls/seq_relationship/output_bias",
}
# Tied to the word embeddings / to cls.predictions.bias in HF; read only to check the tie.
_DECODER_WEIGHT, _DECODER_BIAS = "cls.predictions.decoder.weight", "cls.predictions.decoder.bias"


def hf_names(num_layers: int, prefix: str) -> dict[str, str]:
    """HF name → reference name for a BERT of `num_layers` whose encoder names start `prefix`."""
    names = {prefix + k: v for k, v in {**_EMBEDDINGS, **_POOLER}.items()}
    for i in range(num_layers):
        for hf, ref in _LAYER.items():
            for hf_leaf, ref_leaf in (("weight", "kernel"), ("bias", "bias")):
                ref_name = formats.layer_prefix(i) + ref.format(ref_leaf)
                if "LayerNorm" in hf:
                    ref_name = ref_name.replace("/kernel", "/gamma").replace("/bias", "/beta")
                names[f"{prefix}encoder.layer.{i}.{hf.format(hf_leaf)}"] = ref_name
    names.update(_HEADS)
    return names


def _transposed(ref_name: str) -> bool:
    # A Linear weight [out, in] ↔ a TF kernel [in, out]; Google's NSP output_weights is [2, H],
    # already torch's orientation, so it is not transposed.
    return ref_name.endswith("/kernel")


def read_hf(path: str, *, allow_pickle: bool = False) -> formats.BertCheckpoint:
    """Reads a Hugging Face BERT directory into the reference layout, validated.

    Args:
      path: directory with config.json and model.safetensors (or a sharded index), and
        optionally vocab.txt and tokenizer_config.json.
      allow_pickle: also read pytorch_model.bin (needs torch).

    Returns:
      A `BertCheckpoint`; UserError when config, weights and vocabulary do not fit.
    """
    config_file = os.path.join(path, formats.HF_CONFIG)
    config = formats.BertConfig.from_json(config_file)
    source = tensor_source(path, allow_pickle)
    names = _reference_names(source, config)
    check_weights(source, names, config, config_file, path)  # before any tensor is read
    read = source.read([*names, _DECODER_WEIGHT, _DECODER_BIAS])
    tensors = {_modern_name(k): v for k, v in read.items()}
    if _DECODER_BIAS in tensors:  # Tied to cls.predictions.bias; some files keep only this one.
        tensors.setdefault("cls.predictions.bias", tensors[_DECODER_BIAS])
    weights = {}
    for file_name, ref_name in names.items():
        hf_name = _modern_name(file_name)
        if hf_name in tensors:
            array = formats.float_weight(hf_name, tensors[hf_name], source.weights_file)
            weights[ref_name] = np.ascontiguousarray(array.T if _transposed(ref_name) else array)
    ckpt = formats.BertCheckpoint(
        config=config, weights=weights, vocab_file=formats.find_vocab(path, required=False),
        lower_case=lower_case(path), weights_file=source.weights_file, config_file=config_file)
    formats.validate(ckpt)
    _check_decoder_tie(tensors, weights, source.weights_file)
    return ckpt


def _reference_names(source: tensor_files.TensorSource,
                     config: formats.BertConfig) -> dict[str, str]:
    """Name in the file -> reference name, for every tensor of a BERT the file holds (every
    layer it holds, so that a layer-count mismatch is named); the MLM bias may come from the
    decoder's (tied to it in HF; some files keep only that one)."""
    modern = {_modern_name(k): k for k in source.shapes}
    if _DECODER_BIAS in modern:
        modern.setdefault("cls.predictions.bias", modern[_DECODER_BIAS])
    prefix = "bert." if "bert.embeddings.word_embeddings.weight" in modern else ""
    held = sum(1 for k in modern if k.endswith("attention.self.query.weight"))
    return {modern[hf]: ref for hf, ref in hf_names(max(held, config.num_layers), prefix).items()
            if hf in modern}


def check_weights(source: tensor_files.TensorSource, names: dict[str, str] | None,
                  config: formats.BertConfig, config_file: str, path: str) -> None:
    """Checks the shapes a file declares (its header) against config.json and the vocabulary,
    before any tensor is read; `names` from `_reference_names` (None: computed here).

    Raises:
      UserError: naming the config, the file, the tensor and both shapes (`formats.check_fit`).
    """
    names = _reference_names(source, config) if names is None else names
    shapes = {ref: source.shapes[name][::-1] if _transposed(ref) else source.shapes[name]
              for name, ref in names.items()}
    formats.check_fit(config, shapes, config_file=config_file, weights_file=source.weights_file,
                      vocab_file=formats.find_vocab(path, required=False))
    decoder = source.shapes.get(_DECODER_WEIGHT)
    if decoder is not None and decoder != shapes["bert/embeddings/word_embeddings"]:
        raise UserError(f"{source.weights_file}: {_DECODER_WEIGHT} has shape {decoder}, not the "
                        "word embeddings'; untied MLM output embeddings cannot be converted")


def _modern_name(name: str) -> str:
    # Checkpoints saved by old transformers versions name LayerNorm parameters gamma/beta.
    return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace(
        "LayerNorm.beta", "LayerNorm.bias")


def tensor_source(path: str, allow_pickle: bool) -> tensor_files.TensorSource:
    """The tensors of a Hugging Face directory (model.safetensors, a sharded index, or with
    `allow_pickle` pytorch_model.bin), their names and shapes known before any is read."""
    single = os.path.join(path, formats.HF_WEIGHTS)
    index = os.path.join(path, formats.HF_INDEX)
    if os.path.isfile(single):
        return tensor_files.safetensors_source([single], single)
    if os.path.isfile(index):
        weight_map = formats.read_json(index).get("weight_map", {})
        shards = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else []
        if not shards or not all(isinstance(s, str) and os.path.basename(s) == s
                                 for s in shards):
            raise UserError(f"{index} has no weight_map of file names beside it; re-save the "
                            "model with save_pretrained")
        return tensor_files.safetensors_source([os.path.join(path, s) for s in shards], index)
    pickle_file = os.path.join(path, formats.HF_PICKLE)
    if os.path.isfile(pickle_file):
        if not allow_pickle:
            raise UserError(formats.pickle_refusal(pickle_file))
        return tensor_files.loaded_source(_load_pickle(pickle_file), pickle_file)
    raise UserError(f"{single} does not exist; a Hugging Face BERT directory needs "
                    f"{formats.HF_CONFIG} and {formats.HF_WEIGHTS}")


def _load_pickle(path: str) -> dict[str, np.ndarray]:
    try:
        import torch  # noqa: PLC0415 (optional dependency, only for --allow_pickle)
    except ImportError:
        raise UserError(f"{path}: --allow_pickle needs torch; pip install torch, or convert the "
                        "file to model.safetensors on a machine that has it") from None
    # weights_only=True refuses pickled code objects even though the user allowed pickles.
    state = torch.load(path, map_location="cpu", weights_only=True)
    return {k: v.float().numpy() for k, v in state.items() if v.is_floating_point()}


def lower_case(path: str) -> bool:
    """Whether the directory's tokenizer lower-cases (tokenizer_config.json's do_lower_case)."""
    tokenizer_config = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(tokenizer_config):
        return bool(formats.read_json(tokenizer_config).get("do_lower_case", True))
    return True  # BertTokenizer's default.


def _check_decoder_tie(tensors: dict, weights: dict, weights_file: str) -> None:
    """Refuses an MLM decoder weight that differs from the word embeddings.

    bert-train ties the MLM output projection to the embedding table, as BERT does, so an
    untied decoder cannot be represented.
    """
    decoder = tensors.get(_DECODER_WEIGHT)
    table = weights["bert/embeddings/word_embeddings"]
    if decoder is not None and not np.array_equal(np.asarray(decoder, np.float32), table):
        raise UserError(f"{weights_file}: {_DECODER_WEIGHT} differs from the word embeddings; "
                        "untied MLM output embeddings cannot be converted")


def write_hf(output_dir: str, ckpt: formats.BertCheckpoint) -> list[str]:
    """Writes config.json, model.safetensors, vocab.txt, tokenizer_config.json.

    Layout: `BertModel` names without prefix when `ckpt` holds no heads; otherwise `bert.`-
    prefixed names plus `cls.*`, loadable by `BertForPreTraining` / `BertForMaskedLM`.

    Returns:
      The written file paths.
    """
    os.makedirs(output_dir, exist_ok=True)
    heads = [g for g in (formats.MASKED_LM, formats.NEXT_SENTENCE) if ckpt.has(g)]
    prefix = "bert." if heads else ""
    tensors = {}
    for hf_name, ref_name in hf_names(ckpt.config.num_layers, prefix).items():
        if ref_name in ckpt.weights:
            array = np.asarray(ckpt.weights[ref_name], np.float32)
            tensors[hf_name] = np.ascontiguousarray(array.T if _transposed(ref_name) else array)
    weights_file = os.path.join(output_dir, formats.HF_WEIGHTS)
    # transformers refuses safetensors files whose metadata does not name the framework.
    save_file(tensors, weights_file, metadata={"format": "pt"})
    config = {"architectures": [_architecture(heads)], "model_type": "bert",
              **ckpt.config.to_json_dict(), "pad_token_id": 0,
              "position_embedding_type": "absolute", "torch_dtype": "float32"}
    written = [weights_file, _write_json(output_dir, formats.HF_CONFIG, config)]
    tokenizer = {"tokenizer_class": "BertTokenizer", "do_lower_case": ckpt.lower_case,
                 "model_max_length": ckpt.config.max_sequence_length}
    written.append(_write_json(output_dir, "tokenizer_config.json", tokenizer))
    if ckpt.vocab_file:
        vocab = os.path.join(output_dir, formats.VOCAB_FILE)
        if os.path.abspath(ckpt.vocab_file) != os.path.abspath(vocab):
            shutil.copyfile(ckpt.vocab_file, vocab)
        written.append(vocab)
    return written


def _architecture(heads: list[str]) -> str:
    if heads == [formats.MASKED_LM, formats.NEXT_SENTENCE]:
        return "BertForPreTraining"
    if heads == [formats.MASKED_LM]:
        return "BertForMaskedLM"
    if heads == [formats.NEXT_SENTENCE]:
        return "BertForNextSentencePrediction"
    return "BertModel"


def _write_json(output_dir: str, name: str, data: dict) -> str:
    path = os.path.join(output_dir, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    return path
