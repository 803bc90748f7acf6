"""Weights are what they claim: integer/boolean or NaN/Inf tensors are refused by
convert, --init_checkpoint and from_pretrained, naming the tensor; `convert --verify` fails on
degenerate outputs instead of passing two models of zeros."""

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from bert_trainer.commands.convert import convert
from bert_trainer.encoders import BertEncoder
from bert_trainer.errors import UserError
from bert_trainer.interop import formats, hf, pretrained
from bert_trainer.interop.resolve import from_pretrained, load_pretrained_weights

CONFIG = formats.BertConfig(vocab_size=40, hidden_size=16, num_layers=1, num_attention_heads=2,
                            inner_dim=32, max_sequence_length=12)
QUERY = "encoder.layer.0.attention.self.query.weight"


def write_hf(path, *, fill=None, tamper=None):
    """A tiny BertModel directory; `fill` sets every weight, `tamper(tensors)` edits the file."""
    rng = np.random.default_rng(3)
    weights = {n: (np.full(s, fill, np.float32) if fill is not None
                   else rng.normal(scale=0.3, size=s).astype(np.float32))
               for g in (formats.ENCODER, formats.POOLER)
               for n, s in formats.reference_shapes(CONFIG, g).items()}
    vocab = path.parent / "vocab.txt"
    vocab.write_text("".join(f"t{i}\n" for i in range(40)), encoding="utf-8")
    hf.write_hf(str(path), formats.BertCheckpoint(CONFIG, weights, str(vocab), True, "m", "m"))
    if tamper is not None:
        tensors = load_file(str(path / formats.HF_WEIGHTS))
        tamper(tensors)
        save_file(tensors, str(path / formats.HF_WEIGHTS), metadata={"format": "pt"})
    return path


def as_int32(tensors):
    for name, array in tensors.items():
        tensors[name] = np.round(array).astype(np.int32)


def with_nan(tensors):
    tensors[QUERY][1, 2] = np.nan
    tensors[QUERY][0, 0] = np.inf


@pytest.mark.parametrize("tamper, expected", [
    (as_int32, "embeddings.word_embeddings.weight holds int32 values where float weights "
               "belong; this is not a model's weights"),
    (with_nan, f"{QUERY} holds 2 NaN/Inf values; the checkpoint is corrupt or its training "
               "diverged"),
])
def test_convert_init_checkpoint_and_from_pretrained_refuse_bad_weights(tmp_path, tamper,
                                                                        expected):
    source = write_hf(tmp_path / "src", tamper=tamper)
    weights_file = source / formats.HF_WEIGHTS
    with pytest.raises(UserError, match=f"^{weights_file}: .*{expected}"):
        convert(str(source), str(tmp_path / "out"), verify=True, log=lambda _: None)
    assert not (tmp_path / "out").exists()
    with pytest.raises(UserError, match=expected):
        from_pretrained(str(source))
    encoder = BertEncoder(**pretrained.encoder_arguments(CONFIG))
    with pytest.raises(UserError, match=expected):  # what --init_checkpoint calls
        load_pretrained_weights(str(source), encoder=encoder)


def test_verify_fails_on_degenerate_outputs(tmp_path):
    source = write_hf(tmp_path / "src", fill=0.0)  # float, finite, and says nothing
    result = convert(str(source), str(tmp_path / "out"), verify=True, log=lambda _: None)
    assert result.report["passed"] is False
    assert result.report["degenerate"] == "sequence_output is constant (0 everywhere)"
    good = convert(str(write_hf(tmp_path / "good")), str(tmp_path / "good_out"), verify=True,
                   log=lambda _: None)
    assert good.report["passed"] is True and good.report["degenerate"] is None


def test_float16_weights_are_kept_in_their_own_dtype(tmp_path):
    def as_float16(tensors):
        for name, array in tensors.items():
            tensors[name] = array.astype(np.float16)

    source = write_hf(tmp_path / "src", tamper=as_float16)
    ckpt = hf.read_hf(str(source))
    assert {a.dtype for a in ckpt.weights.values()} == {np.dtype(np.float16)}
    result = convert(str(source), str(tmp_path / "out"), verify=True, log=lambda _: None)
    assert result.report["passed"] is True


def test_a_bert_train_model_dir_with_nan_weights_is_refused(tmp_path):
    from bert_trainer.commands.convert import write_bert_train  # noqa: PLC0415

    rng = np.random.default_rng(4)
    weights = {n: rng.normal(scale=0.3, size=s).astype(np.float32)
               for g in (formats.ENCODER, formats.POOLER)
               for n, s in formats.reference_shapes(CONFIG, g).items()}
    weights["bert/encoder/layer_0/output/dense/kernel"][3, 1] = np.inf
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"t{i}\n" for i in range(40)), encoding="utf-8")
    write_bert_train(str(tmp_path / "run"), formats.BertCheckpoint(CONFIG, weights, str(vocab),
                                                                   True, "m", "m"))
    with pytest.raises(UserError, match=rf"^{tmp_path / 'run'}: .*holds 1 NaN/Inf values"):
        from_pretrained(str(tmp_path / "run"))
    encoder = BertEncoder(**pretrained.encoder_arguments(CONFIG))
    with pytest.raises(UserError, match="holds 1 NaN/Inf values; the checkpoint is corrupt"):
        load_pretrained_weights(str(tmp_path / "run"), encoder=encoder)
