"""Weights and configs are checked before they are read (`interop/tensor_files.py`): a
safetensors header against the file's size and against config.json before any tensor is read,
and config.json's sizes against sane bounds and against the weights' header before a model is
built. The probe's cases: a header claiming a [3,000,000, 384] tensor in a sparse file was
read (9.8 GB resident) and then refused for 100 missing tensors; a config.json of hidden
1,200,000 and 100,000 layers left `finetune --init_checkpoint` silent until killed.
"""

import json
import math
import resource
import shutil
import struct

import numpy as np
import pytest
from conftest import TESTS
from safetensors.numpy import load_file, save_file

from bert_trainer.errors import UserError
from bert_trainer.interop import formats, gpt2, hf, tensor_files
from bert_trainer.interop.resolve import resolve_checkpoint

CONFIG = formats.BertConfig(vocab_size=40, hidden_size=16, num_layers=1, num_attention_heads=2,
                            inner_dim=32, max_sequence_length=12)
GPT2_DATA = TESTS / "data" / "gpt2_tiny"
F32 = 4


def _hf_dir(path, config=CONFIG):
    """A tiny BertModel directory (config.json, model.safetensors, vocab.txt)."""
    rng = np.random.default_rng(3)
    weights = {n: rng.normal(scale=0.3, size=s).astype(np.float32)
               for g in (formats.ENCODER, formats.POOLER)
               for n, s in formats.reference_shapes(config, g).items()}
    vocab = path.parent / "vocab.txt"
    vocab.write_text("".join(f"t{i}\n" for i in range(config.vocab_size)), encoding="utf-8")
    hf.write_hf(str(path), formats.BertCheckpoint(config, weights, str(vocab), True, "m", "m"))
    return path


def _claiming(path, tensors: dict[str, tuple[int, ...]]) -> None:
    """A safetensors file whose header claims float32 `tensors` (name -> shape) with
    consistent offsets, their data a hole: a sparse file of the claimed size."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        nbytes = math.prod(shape) * F32
        header[name] = {"dtype": "F32", "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        f.truncate(8 + len(encoded) + offset)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_a_header_claiming_a_huge_tensor_is_refused_before_anything_is_read(tmp_path):
    config = formats.BertConfig(vocab_size=40, hidden_size=384, num_layers=1,
                                num_attention_heads=2, inner_dim=32, max_sequence_length=12)
    source = _hf_dir(tmp_path / "src", config)
    weights = source / formats.HF_WEIGHTS
    claimed = _header_shapes(weights)
    claimed["embeddings.word_embeddings.weight"] = (3_000_000, 384)  # 4.6 GB of holes
    _claiming(weights, claimed)
    before = _peak_rss_mb()
    expected = (f"^{source / formats.HF_CONFIG} does not fit {weights}: bert/embeddings/"
                r"word_embeddings has shape \(3000000, 384\) but the config \(vocab_size=40, "
                r"hidden_size=384\) implies \(40, 384\)$")
    with pytest.raises(UserError, match=expected):
        hf.read_hf(str(source))  # what convert reads
    with pytest.raises(UserError, match=expected):  # what --init_checkpoint resolves
        resolve_checkpoint(str(source), flag="--init_checkpoint")
    assert _peak_rss_mb() - before < 200  # was 9.8 GB: the claimed tensor read, twice


def _header_shapes(path) -> dict[str, tuple[int, ...]]:
    return {n: tuple(a.shape) for n, a in load_file(str(path)).items()}


def test_a_file_cut_short_is_named_with_the_tensor_past_its_end(tmp_path):
    source = _hf_dir(tmp_path / "src")
    weights = source / formats.HF_WEIGHTS
    data = weights.read_bytes()
    weights.write_bytes(data[:-100])
    with pytest.raises(UserError, match=rf"^{weights} could not be read as safetensors "
                                        r"\(tensor \S+ ends at byte \d+ of a data section of "
                                        r"\d+ bytes: the file is cut short\); re-download it"):
        tensor_files.read_header(str(weights))


@pytest.mark.parametrize("entry, reason", [
    ({"dtype": "F32", "shape": [40, 16], "data_offsets": [0, 100]},
     r"tensor w claims shape \[40, 16\] of F32 \(2560 bytes\) but spans 100 bytes"),
    ({"dtype": "F32", "shape": [-4, 16], "data_offsets": [0, 0]},
     r"tensor w has a malformed shape \[-4, 16\]"),
    ({"dtype": "Q4", "shape": [4], "data_offsets": [0, 4]}, r"tensor w has an unknown dtype 'Q4'"),
    ({"dtype": "F32", "shape": [4], "data_offsets": [16, 0]},
     r"tensor w has malformed data_offsets \[16, 0\]"),
])
def test_a_header_that_contradicts_itself_is_refused_in_one_line(tmp_path, entry, reason):
    path = tmp_path / "model.safetensors"
    encoded = json.dumps({"w": entry}).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + bytes(2560))
    with pytest.raises(UserError, match=rf"^{path} could not be read as safetensors \({reason}\)"):
        tensor_files.read_header(str(path))


def test_a_header_length_beyond_the_file_is_refused(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 1 << 60) + b"{}")
    with pytest.raises(UserError, match=r"its header claims 1152921504606846976 bytes, the file "
                                        r"holds 2 after the length"):
        tensor_files.read_header(str(path))


@pytest.mark.parametrize("field, value, bounds", [
    ("hidden_size", 1_200_000, r"\[1, 65536\]"), ("num_hidden_layers", 100_000, r"\[1, 1024\]"),
    ("intermediate_size", 10**8, r"\[1, 262144\]"), ("vocab_size", 10**9, r"\[1, 4194304\]"),
    ("num_hidden_layers", -1, r"\[1, 1024\]"), ("max_position_embeddings", 0, r"\[1, 1048576\]"),
])
def test_absurd_config_sizes_are_refused_naming_the_field(tmp_path, field, value, bounds):
    source = _hf_dir(tmp_path / "src")
    config_file = source / formats.HF_CONFIG
    config = json.loads(config_file.read_text())
    config[field] = value
    config_file.write_text(json.dumps(config))
    expected = rf"^{config_file}: {field}={value} is outside {bounds}; this is no model"
    with pytest.raises(UserError, match=expected):  # before a model is built from it
        resolve_checkpoint(str(source), flag="--init_checkpoint")


def test_a_size_that_is_no_whole_number_is_named(tmp_path):
    source = _hf_dir(tmp_path / "src")
    config_file = source / formats.HF_CONFIG
    config = json.loads(config_file.read_text())
    config["hidden_size"] = "16"
    config_file.write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"hidden_size='16' is not a whole number$"):
        resolve_checkpoint(str(source), flag="--init_checkpoint")


def test_a_config_that_does_not_fit_the_weights_is_refused_before_a_model_is_built(tmp_path):
    """Resolving (what `--init_checkpoint` does before building the encoder) reads the
    weights' header: a config of other sizes is refused there, naming the tensor."""
    source = _hf_dir(tmp_path / "src")
    config_file = source / formats.HF_CONFIG
    config = json.loads(config_file.read_text())
    config["intermediate_size"] = 64
    config_file.write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"config.json does not fit .*model.safetensors: bert/"
                                        r"encoder/layer_0/intermediate/dense/kernel has shape "
                                        r"\(16, 32\) but the config \(hidden_size=16, "
                                        r"intermediate_size=64\) implies \(16, 64\)$"):
        resolve_checkpoint(str(source), flag="--init_checkpoint")


def test_a_gpt2_header_claiming_a_huge_tensor_is_refused_before_anything_is_read(tmp_path):
    source = tmp_path / "gpt2"
    shutil.copytree(GPT2_DATA, source)
    weights = source / formats.HF_WEIGHTS
    claimed = _header_shapes(weights)
    claimed["transformer.wte.weight"] = (3_000_000, claimed["transformer.wte.weight"][1])
    _claiming(weights, claimed)
    before = _peak_rss_mb()
    with pytest.raises(UserError, match=r"does not fit .*: wte\.weight has shape \(3000000, 32\) "
                                        r"but the config implies \(\d+, 32\)$"):
        gpt2.read_gpt2(str(source))
    with pytest.raises(UserError, match=r"wte\.weight has shape \(3000000, 32\)"):
        resolve_checkpoint(str(source), flag="--init_checkpoint")
    assert _peak_rss_mb() - before < 200


@pytest.mark.parametrize("field, value", [("n_layer", 100_000), ("n_embd", 1_200_000)])
def test_absurd_gpt2_sizes_are_refused_naming_the_field(tmp_path, field, value):
    source = tmp_path / "gpt2"
    shutil.copytree(GPT2_DATA, source)
    config_file = source / formats.HF_CONFIG
    config = json.loads(config_file.read_text())
    config[field] = value
    config_file.write_text(json.dumps(config))
    with pytest.raises(UserError, match=rf"^{config_file}: {field}={value} is outside \[1, "):
        gpt2.GPT2Config.from_json(str(config_file))


def test_a_tensor_the_reader_does_not_use_is_listed_but_left_out(tmp_path):
    """A tensor a BERT does not use (a buffer) is in the header's list, not in the weights."""
    source = _hf_dir(tmp_path / "src")
    weights = source / formats.HF_WEIGHTS
    tensors = load_file(str(weights))
    tensors["embeddings.position_ids"] = np.arange(12, dtype=np.float32)[None]
    save_file(tensors, str(weights), metadata={"format": "pt"})
    read = hf.tensor_source(str(source), False)
    assert "embeddings.position_ids" in read.shapes
    ckpt = hf.read_hf(str(source))
    assert ckpt.has(formats.ENCODER) and len(ckpt.weights) == len(tensors) - 1
