"""Google BERT TF1 checkpoints: a Google-layout checkpoint written from the real MiniLM weights."""

import json
import re

import numpy as np
import pytest
import tensorflow as tf
from safetensors.numpy import load_file

from bert_trainer import features
from bert_trainer.commands.convert import convert
from bert_trainer.errors import UserError
from bert_trainer.interop import formats, from_pretrained, parity, read_checkpoint, tf1

GOLDEN = "fixtures/minilm/golden.npz"


def google_name(hf_name: str) -> tuple[str, bool]:
    """HF BertModel name → google-research/bert modeling.py name, and whether to transpose.

    Written from modeling.py's scopes independently of bert_trainer.interop.hf's table.
    """
    name = "bert/" + hf_name.replace(".", "/")
    name = re.sub(r"/layer/(\d+)/", r"/layer_\1/", name)
    if "LayerNorm" in name:
        return name.replace("/weight", "/gamma").replace("/bias", "/beta"), False
    if "embeddings/" in name and name.endswith("/weight"):  # bert/embeddings/word_embeddings
        return name[: -len("/weight")], False
    if name.endswith("/weight"):  # torch Linear [out, in] → tf.layers.dense kernel [in, out]
        return name[: -len("/weight")] + "/kernel", True
    return name, False


def write_google_checkpoint(minilm_dir, out, *, extra=None, config_update=None):
    """Writes bert_config.json, bert_model.ckpt.{index,data} and vocab.txt like Google's zips."""
    out.mkdir(parents=True)
    tensors = {}
    for hf_name, array in load_file(str(minilm_dir / "model.safetensors")).items():
        if hf_name == "embeddings.position_ids":
            continue
        name, transpose = google_name(hf_name)
        tensors[name] = array.T.copy() if transpose else array
    # What a checkpoint saved by run_pretraining.py also holds; the reader must skip it.
    tensors["global_step"] = np.array(1000000, np.int64)
    tensors["bert/embeddings/word_embeddings/adam_m"] = np.zeros((30522, 384), np.float32)
    tensors.update(extra or {})
    names = sorted(tensors)
    tf.raw_ops.SaveV2(prefix=str(out / "bert_model.ckpt"), tensor_names=names,
                      shape_and_slices=[""] * len(names),
                      tensors=[tf.constant(tensors[n]) for n in names])
    hf_config = json.loads((minilm_dir / "config.json").read_text())
    google_keys = ("attention_probs_dropout_prob", "hidden_act", "hidden_dropout_prob",
                   "hidden_size", "initializer_range", "intermediate_size",
                   "max_position_embeddings", "num_attention_heads", "num_hidden_layers",
                   "type_vocab_size", "vocab_size")
    config = {k: hf_config[k] for k in google_keys}
    config.update(config_update or {})
    (out / "bert_config.json").write_text(json.dumps(config))
    (out / "vocab.txt").write_bytes((minilm_dir / "vocab.txt").read_bytes())
    return out


@pytest.fixture
def google_dir(minilm_dir, tmp_path):
    return write_google_checkpoint(minilm_dir, tmp_path / "uncased_L-6_H-384_A-12")


def test_google_layout_reads_back_the_minilm_weights(google_dir, minilm_dir):
    assert formats.detect_format(str(google_dir)) == formats.TF1
    ckpt = read_checkpoint(str(google_dir))
    assert ckpt.weights_file == str(google_dir / "bert_model.ckpt.index")
    assert ckpt.lower_case is True and ckpt.vocab_file == str(google_dir / "vocab.txt")
    assert ckpt.config.num_layers == 6 and ckpt.config.norm_epsilon == 1e-12
    assert "global_step" not in ckpt.weights and not any("adam" in n for n in ckpt.weights)
    hf = read_checkpoint(str(minilm_dir))
    assert set(ckpt.weights) == set(hf.weights)
    for name, array in hf.weights.items():
        np.testing.assert_array_equal(ckpt.weights[name], array, err_msg=name)


def test_cased_directory_name_means_cased(minilm_dir, tmp_path):
    path = write_google_checkpoint(minilm_dir, tmp_path / "cased_L-6_H-384_A-12")
    assert tf1.read_tf1(str(path)).lower_case is False


def test_heads_are_read_when_present(minilm_dir, tmp_path):
    rng = np.random.default_rng(0)
    heads = {"cls/predictions/transform/dense/kernel": (384, 384),
             "cls/predictions/transform/dense/bias": (384,),
             "cls/predictions/transform/LayerNorm/gamma": (384,),
             "cls/predictions/transform/LayerNorm/beta": (384,),
             "cls/predictions/output_bias": (30522,),
             "cls/seq_relationship/output_weights": (2, 384),
             "cls/seq_relationship/output_bias": (2,)}
    extra = {n: rng.normal(size=s).astype(np.float32) for n, s in heads.items()}
    ckpt = tf1.read_tf1(str(write_google_checkpoint(minilm_dir, tmp_path / "g", extra=extra)))
    assert ckpt.has(formats.MASKED_LM) and ckpt.has(formats.NEXT_SENTENCE)
    np.testing.assert_array_equal(ckpt.weights["cls/seq_relationship/output_weights"],
                                  extra["cls/seq_relationship/output_weights"])


def test_partial_head_is_an_error(minilm_dir, tmp_path):
    extra = {"cls/predictions/output_bias": np.zeros(30522, np.float32)}
    path = write_google_checkpoint(minilm_dir, tmp_path / "g", extra=extra)
    with pytest.raises(UserError, match=r"bert_model.ckpt.index: the masked_lm lacks "
                                        r"cls/predictions/transform/dense/kernel"):
        tf1.read_tf1(str(path))


def test_config_vocab_size_that_does_not_fit(minilm_dir, tmp_path):
    path = write_google_checkpoint(minilm_dir, tmp_path / "g", config_update={"vocab_size": 30000})
    with pytest.raises(UserError) as e:
        tf1.read_tf1(str(path))
    assert str(e.value) == (
        f"{path}/bert_config.json does not fit {path}/bert_model.ckpt.index: "
        "bert/embeddings/word_embeddings has shape (30522, 384) but the config "
        "(vocab_size=30000, hidden_size=384) implies (30000, 384)")


def test_missing_vocab_and_missing_checkpoint(google_dir):
    (google_dir / "vocab.txt").unlink()
    with pytest.raises(UserError, match=f"{google_dir}/vocab.txt does not exist; Google BERT"):
        tf1.read_tf1(str(google_dir))
    for f in google_dir.glob("bert_model.ckpt.*"):
        f.unlink()
    with pytest.raises(UserError, match="not a BERT checkpoint directory.*found bert_config.json"):
        read_checkpoint(str(google_dir))


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
def test_converted_google_checkpoint_matches_hf_golden(google_dir, minilm_dir, shared_dir,
                                                       tmp_path):
    result = convert(str(google_dir), str(tmp_path / "bt"), verify=True, log=lambda _: None)
    assert result.report["passed"] and result.report["max_abs_diff"]["sequence_output"] < 1e-5
    assert json.loads((tmp_path / "bt" / "parity_report.json").read_text()) == result.report
    loaded = from_pretrained(str(tmp_path / "bt"))
    golden = np.load(shared_dir / GOLDEN)
    inputs = {k: golden[k] for k in features.ENCODER_INPUTS}
    ours = parity.keras_forward(loaded.encoder, inputs)
    exact = parity.reference_forward(read_checkpoint(str(google_dir)), inputs)
    valid = golden[features.INPUT_MASK].astype(bool)
    for name in (features.SEQUENCE_OUTPUT, features.POOLED_OUTPUT):
        assert np.abs(ours[name] - golden[name]).max() <= 1e-4, name
    hidden = [ours["embedding_output"], *ours[features.ENCODER_OUTPUTS]]
    exact_hidden = [exact["embedding_output"], *exact[features.ENCODER_OUTPUTS]]
    for i, (h, g, x) in enumerate(zip(hidden, golden["hidden_states"], exact_hidden,
                                      strict=True)):
        assert np.abs(h - g)[valid].max() <= 1e-4, f"hidden_states[{i}] on real tokens"
        assert np.abs(h - x).max() <= 1e-4, f"hidden_states[{i}] vs float64"
    # The same encoder weights as loading the Hugging Face files directly.
    direct = from_pretrained(str(minilm_dir)).encoder
    for a, b in zip(loaded.encoder.weights, direct.weights, strict=True):
        np.testing.assert_array_equal(a, b, err_msg=a.path)
