"""Hugging Face GPT-2 safetensors into CausalLM: parity with transformers' GPT2LMHeadModel.

tests/data/gpt2_tiny holds a small random GPT2LMHeadModel (save_pretrained: "transformer."
names) and its float32 logits, final hidden states and greedy generation, computed by
transformers (scripts/make_gpt2_golden.py; torch is not a test dependency).
"""

import json
import os
import re
import shutil

import keras
import numpy as np
import pytest
from conftest import TESTS
from safetensors.numpy import load_file, save_file

from bert_trainer import models
from bert_trainer.errors import UserError
from bert_trainer.interop import formats, gpt2, gpt2_parity

DATA = str(TESTS / "data" / "gpt2_tiny")
# Logits are of order 1-10 here; float32 through two layers agrees to ~1e-5.
ATOL = 1e-4

needs_causal_lm = pytest.mark.skipif(not hasattr(models, "CausalLM"),
                                     reason="bert_trainer.models.CausalLM is not built yet")


@pytest.fixture(autouse=True)
def _clear_session():
    yield
    keras.backend.clear_session()


def _copy(tmp_path, tensors=None, config_changes=None):
    """A copy of the fixture directory with other tensors and/or config fields."""
    out = tmp_path / "gpt2"
    shutil.copytree(DATA, out)
    if tensors is not None:
        save_file(tensors, str(out / formats.HF_WEIGHTS), metadata={"format": "pt"})
    if config_changes:
        config = json.loads((out / formats.HF_CONFIG).read_text())
        config.update(config_changes)
        (out / formats.HF_CONFIG).write_text(json.dumps(config))
    return str(out)


def _tensors():
    return load_file(os.path.join(DATA, formats.HF_WEIGHTS))


# ------------------------------------------------------------------ reading


def test_config_read_from_config_json():
    config = gpt2.GPT2Config.from_json(os.path.join(DATA, formats.HF_CONFIG))
    assert (config.vocab_size, config.hidden_size, config.num_layers,
            config.num_attention_heads, config.inner_dim, config.max_sequence_length) == (
        99, 32, 2, 4, 128, 32)  # n_inner null: 4 * n_embd
    assert config.inner_activation == "gelu_approximate"
    assert config.norm_epsilon == 1e-5
    args = config.model_arguments()
    assert args["norm_first"] is True


def test_reader_matches_transformers_through_a_numpy_forward_pass(gpt2_golden):
    """The weights as read (names, q/k/v order, Conv1D orientation) give transformers' logits
    through the float64 numpy GPT-2 of `gpt2_parity` (no Keras, no weight mapping)."""
    ckpt = gpt2.read_gpt2(DATA)
    assert set(ckpt.weights) == set(gpt2.expected_shapes(ckpt.config))
    out = gpt2_parity.reference_forward(ckpt, gpt2_golden["input_ids"])
    np.testing.assert_allclose(out["hidden"], gpt2_golden["hidden"], atol=ATOL, rtol=0)
    np.testing.assert_allclose(out["logits"], gpt2_golden["logits"], atol=ATOL, rtol=0)
    assert np.abs(gpt2_golden["logits"]).max() > 1.0  # the tolerance is small against the scale


def test_the_safetensors_file_itself_is_read():
    a = gpt2.read_gpt2(DATA)
    b = gpt2.read_gpt2(os.path.join(DATA, formats.HF_WEIGHTS))
    assert all(np.array_equal(a.weights[k], b.weights[k]) for k in a.weights)


def test_names_without_the_transformer_prefix_read_identically(tmp_path):
    stripped = {k.removeprefix("transformer."): v for k, v in _tensors().items()}
    assert not any(k.startswith("transformer.") for k in stripped)
    a, b = gpt2.read_gpt2(DATA), gpt2.read_gpt2(_copy(tmp_path, stripped))
    assert a.weights.keys() == b.weights.keys()
    assert all(np.array_equal(a.weights[k], b.weights[k]) for k in a.weights)


def test_attention_buffers_and_a_tied_lm_head_are_skipped(tmp_path):
    tensors = _tensors()
    for n in range(2):  # What checkpoints of old transformers versions carry.
        tensors[f"transformer.h.{n}.attn.bias"] = np.tril(np.ones((1, 1, 32, 32), np.float32))
        tensors[f"transformer.h.{n}.attn.masked_bias"] = np.array(-1e4, np.float32)
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"].copy()
    ckpt = gpt2.read_gpt2(_copy(tmp_path, tensors))
    assert ckpt.skipped == ["h.0.attn.bias", "h.0.attn.masked_bias", "h.1.attn.bias",
                            "h.1.attn.masked_bias", "lm_head.weight"]
    reference = gpt2.read_gpt2(DATA)
    assert all(np.array_equal(ckpt.weights[k], reference.weights[k]) for k in reference.weights)


def test_sharded_and_float16_files_are_read(tmp_path):
    """A sharded checkpoint (index + shards) and half-precision tensors, as the hub has them."""
    tensors = _tensors()
    directory = _copy(tmp_path)
    os.remove(os.path.join(directory, formats.HF_WEIGHTS))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:10],
              "model-00002-of-00002.safetensors": names[10:]}
    for shard, keys in shards.items():
        save_file({k: tensors[k].astype(np.float16) for k in keys},
                  os.path.join(directory, shard), metadata={"format": "pt"})
    with open(os.path.join(directory, formats.HF_INDEX), "w") as f:
        json.dump({"weight_map": {k: shard for shard, keys in shards.items() for k in keys}}, f)
    ckpt = gpt2.read_gpt2(directory)
    reference = gpt2.read_gpt2(DATA)
    for name, array in reference.weights.items():
        assert ckpt.weights[name].dtype == np.float32
        np.testing.assert_array_equal(ckpt.weights[name], array.astype(np.float16))


def test_split_qkv_on_a_constructed_case():
    hidden, heads = 4, 2
    # Column j of the fused kernel holds the value j in every row; the bias holds 100 + j.
    kernel = np.tile(np.arange(3 * hidden, dtype=np.float32), (hidden, 1))
    bias = 100 + np.arange(3 * hidden, dtype=np.float32)
    (qk, qb), (kk, kb), (vk, vb) = gpt2.split_qkv(kernel, bias, heads)
    assert qk.shape == (hidden, heads, hidden // heads) and qb.shape == (heads, hidden // heads)
    # query = columns 0..3, key 4..7, value 8..11; head h takes columns [2h, 2h + 2).
    np.testing.assert_array_equal(qk[0], [[0, 1], [2, 3]])
    np.testing.assert_array_equal(kk[3], [[4, 5], [6, 7]])
    np.testing.assert_array_equal(vk[1], [[8, 9], [10, 11]])
    np.testing.assert_array_equal(qb, [[100, 101], [102, 103]])
    np.testing.assert_array_equal(kb, [[104, 105], [106, 107]])
    np.testing.assert_array_equal(vb, [[108, 109], [110, 111]])


# ------------------------------------------------------------------ refusals


def _refusal(path) -> str:
    """The UserError message reading the GPT-2 weights at `path` gives."""
    with pytest.raises(UserError) as info:
        gpt2.read_gpt2(path)
    return str(info.value)


def test_a_missing_tensor_is_named(tmp_path):
    tensors = _tensors()
    del tensors["transformer.h.1.mlp.c_fc.bias"]
    message = _refusal(_copy(tmp_path, tensors))
    assert re.search(r"lacks h\.1\.mlp\.c_fc\.bias \(1 of 28", message), message
    assert "\n" not in message


def test_a_wrong_shape_is_named(tmp_path):
    tensors = _tensors()
    tensors["transformer.h.0.attn.c_attn.weight"] = np.zeros((32, 64), np.float32)
    message = _refusal(_copy(tmp_path, tensors))
    assert re.search(r"h\.0\.attn\.c_attn\.weight has shape \(32, 64\) but the config implies "
                     r"\(32, 96\)", message), message
    assert "\n" not in message


def test_an_unknown_tensor_is_named(tmp_path):
    tensors = _tensors()
    tensors["score.weight"] = np.zeros((2, 32), np.float32)
    message = _refusal(_copy(tmp_path, tensors))
    assert re.search(r"unexpected tensor score\.weight", message), message
    assert "\n" not in message


def test_a_layer_count_mismatch_names_n_layer(tmp_path):
    message = _refusal(_copy(tmp_path, config_changes={"n_layer": 1}))
    assert re.search(r"says n_layer=1 but .* holds 2 layers", message), message
    assert "\n" not in message


def test_an_untied_lm_head_is_refused(tmp_path):
    tensors = _tensors()
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"] + 1
    message = _refusal(_copy(tmp_path, tensors))
    assert re.search(r"lm_head\.weight differs from wte\.weight", message), message
    assert "\n" not in message


@pytest.mark.parametrize("field,value", [
    ("scale_attn_by_inverse_layer_idx", True), ("add_cross_attention", True),
    ("scale_attn_weights", False), ("tie_word_embeddings", False),
    ("activation_function", "swish"), ("model_type", "bert")])
def test_an_unsupported_config_field_is_refused(tmp_path, field, value):
    message = _refusal(_copy(tmp_path, config_changes={field: value}))
    assert field in message and "\n" not in message, message
    assert "config.json" in message


def test_reorder_and_upcast_attn_is_accepted(tmp_path):
    # Only a float32 upcast of the same scores: nothing CausalLM computes differently.
    ckpt = gpt2.read_gpt2(_copy(tmp_path, config_changes={"reorder_and_upcast_attn": True}))
    assert ckpt.config.num_layers == 2


def test_a_pickle_is_refused_as_for_bert(tmp_path):
    directory = tmp_path / "gpt2_pickle"
    directory.mkdir()
    shutil.copy(os.path.join(DATA, formats.HF_CONFIG), directory)
    pickle_file = directory / formats.HF_PICKLE
    pickle_file.write_bytes(b"\x80\x02not read")
    before = pickle_file.read_bytes()
    with pytest.raises(UserError) as info:
        gpt2.read_gpt2(str(directory))
    assert str(info.value) == formats.pickle_refusal(str(pickle_file))
    assert pickle_file.read_bytes() == before


def test_the_text_refusal_is_one_line():
    message = gpt2.text_refusal("models/gpt2")
    assert message.startswith("models/gpt2 is a GPT-2 model") and "\n" not in message
    assert "byte-level BPE" in message


# ------------------------------------------------------------------ into CausalLM


@needs_causal_lm
def test_causal_lm_logits_equal_transformers(gpt2_golden):
    loaded = gpt2.from_gpt2(DATA)
    model = loaded.model
    assert loaded.initialized == []
    assert len(loaded.loaded) == len(model.weights)
    logits = model({"input_word_ids": gpt2_golden["input_ids"]}, training=False)["logits"]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(logits), gpt2_golden["logits"],
                               atol=ATOL, rtol=0)


@needs_causal_lm
def test_stripped_names_load_the_same_model(tmp_path, gpt2_golden):
    stripped = {k.removeprefix("transformer."): v for k, v in _tensors().items()}
    a = gpt2.from_gpt2(DATA).model
    b = gpt2.from_gpt2(_copy(tmp_path, stripped)).model
    for va, vb in zip(a.weights, b.weights, strict=True):
        assert va.path == vb.path
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(va),
                                      keras.ops.convert_to_numpy(vb))


def _greedy_with_cache(model, prompt, new_tokens):
    """Greedy decoding with `decode_step` over the key/value cache, one token at a time."""
    batch, length = prompt.shape
    cache = model.init_cache(batch, length + new_tokens)
    tokens = list(prompt.T)  # per position: (batch,)
    for index in range(length + new_tokens - 1):
        logits, cache = model.decode_step(tokens[index], index, cache)
        if index >= length - 1:  # past the prompt: the step's argmax is the next token
            tokens.append(np.argmax(keras.ops.convert_to_numpy(logits), -1).astype(np.int32))
    return np.stack(tokens, axis=1)[:, length:]


@needs_causal_lm
def test_cached_greedy_decoding_equals_transformers(gpt2_golden):
    model = gpt2.from_gpt2(DATA).model
    prompt = gpt2_golden["greedy_prompt"]  # (2, 5)
    expected = gpt2_golden["greedy_ids"][:, prompt.shape[1]:]  # (2, 10): transformers' tokens
    np.testing.assert_array_equal(_greedy_with_cache(model, prompt, expected.shape[1]),
                                  expected)


@needs_causal_lm
@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_equals_transformers(gpt2_golden, use_cache):
    generation = pytest.importorskip("bert_trainer.models.generation.causal")
    model = gpt2.from_gpt2(DATA).model
    prompt = gpt2_golden["greedy_prompt"]
    expected = gpt2_golden["greedy_ids"][:, prompt.shape[1]:]
    # transformers ran min_new_tokens=10; an end id the golden tokens never hold stops nothing.
    end_id = next(i for i in range(1, 99) if i not in expected)
    out = generation.generate(model, prompt, np.full((2,), prompt.shape[1], np.int32),
                              max_new_tokens=expected.shape[1], end_id=end_id,
                              use_cache=use_cache)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(out["generated_ids"]), expected)


@needs_causal_lm
@pytest.mark.parametrize("field,value", [
    ("max_sequence_length", 64),
    ("num_attention_heads", 2),  # same kernel sizes, another head split: still refused
    ("norm_epsilon", 1e-12)])
def test_a_model_of_another_architecture_is_refused(field, value):
    ckpt = gpt2.read_gpt2(DATA)
    model = gpt2.build_model(gpt2.GPT2Config(**{**ckpt.config.__dict__, field: value}))
    expected = getattr(ckpt.config, field)
    with pytest.raises(UserError, match=f"has {field}={expected} but the model has "
                                        f"{field}={value}"):
        gpt2.load_weights(model, ckpt)


@needs_causal_lm
@pytest.mark.parametrize("activation,refused", [
    ("gelu", True), ("gelu_new", False), ("gelu_approximate", False)])
def test_the_activation_is_checked_by_value(activation, refused):
    ckpt = gpt2.read_gpt2(DATA)
    model = models.CausalLM(**{**ckpt.config.model_arguments(), "inner_activation": activation})
    if refused:
        with pytest.raises(UserError, match="activation is gelu_approximate but the model's "
                                            "inner_activation is 'gelu'"):
            gpt2.load_weights(model, ckpt)
    else:
        assert gpt2.load_weights(model, ckpt)["initialized"] == []


def test_from_gpt2_refuses_architecture_overrides():
    with pytest.raises(UserError, match=r"\['hidden_size'\] would change the architecture"):
        gpt2.from_gpt2(DATA, hidden_size=64)


@needs_causal_lm
def test_the_parity_report_passes_and_catches_a_swapped_projection():
    loaded = gpt2.from_gpt2(DATA)
    report = gpt2_parity.verify(loaded.checkpoint, loaded.model)
    assert report["passed"] and list(report["max_abs_diff"]) == [
        "layer_0", "layer_1", "hidden", "logits_relative"]
    assert max(report["max_abs_diff"].values()) < 1e-4
    attention = loaded.model.transformer_layers[1].self_attention
    attention.query_dense.kernel.assign(attention.key_dense.kernel.value)  # a mapping bug
    report = gpt2_parity.verify(loaded.checkpoint, loaded.model)
    assert not report["passed"]
    assert report["max_abs_diff"]["layer_0"] < 1e-4 < report["max_abs_diff"]["layer_1"]
