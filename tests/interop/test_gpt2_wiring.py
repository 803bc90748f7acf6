"""A GPT-2 directory in the checkpoint machinery: detected, resolved, warm-started, converted."""

import json
import os
import shutil
import subprocess

import gin
import keras
import numpy as np
import pytest
from conftest import TESTS
from robust_testing import tree_digest

from bert_trainer.checkpoints import layout
from bert_trainer.checkpoints import model_dir as model_dir_lib
from bert_trainer.checkpoints.select import select_checkpoint
from bert_trainer.commands.convert import convert
from bert_trainer.encoders import BertEncoder
from bert_trainer.errors import EXIT_USER_ERROR, UserError
from bert_trainer.interop import formats, gpt2, resolve_checkpoint
from bert_trainer.models import CausalLM

DATA = str(TESTS / "data" / "gpt2_tiny")
ATOL = 1e-4


@pytest.fixture(autouse=True)
def _clear_session():
    yield
    keras.backend.clear_session()


def _logits(model, ids):
    return keras.ops.convert_to_numpy(model({"input_word_ids": ids}, training=False)["logits"])


def test_a_gpt2_directory_is_detected_and_resolved():
    assert formats.detect_format(DATA) == formats.GPT2
    checkpoint = resolve_checkpoint(DATA, flag="--init_checkpoint")
    assert checkpoint.format == formats.GPT2
    assert checkpoint.encoder_class == "CausalLM" and checkpoint.vocab_file is None
    assert checkpoint.encoder_config["num_layers"] == 2
    assert checkpoint.encoder_config["inner_activation"] == "gelu_approximate"


def test_a_gpt2_pickle_is_refused_by_detection(tmp_path):
    directory = tmp_path / "gpt2_pickle"
    directory.mkdir()
    shutil.copy(os.path.join(DATA, formats.HF_CONFIG), directory)
    (directory / formats.HF_PICKLE).write_bytes(b"\x80\x02")
    with pytest.raises(UserError) as info:
        resolve_checkpoint(str(directory))
    assert str(info.value) == formats.pickle_refusal(str(directory / formats.HF_PICKLE))


def test_warm_start_of_a_causal_lm_as_the_trainer_does(gpt2_golden):
    """`Task.initialize` restores the whole model: `restore_model`; encoder-style `load` too."""
    checkpoint = resolve_checkpoint(DATA, flag="--init_checkpoint")
    model = checkpoint.build_encoder(output_dropout=0.0)
    assert isinstance(model, CausalLM)
    checkpoint.restore_model(model)
    np.testing.assert_allclose(_logits(model, gpt2_golden["input_ids"]), gpt2_golden["logits"],
                               atol=ATOL, rtol=0)
    other = checkpoint.build_encoder()
    report = checkpoint.load(encoder=other)
    assert report["initialized"] == [] and len(report["loaded"]) == len(other.weights)


def test_a_gin_model_of_another_size_is_refused_by_name():
    checkpoint = resolve_checkpoint(DATA)
    model = CausalLM(**{**checkpoint.encoder_config, "num_layers": 3})
    with pytest.raises(UserError, match="has num_layers=2 but the model has num_layers=3"):
        checkpoint.restore_model(model)


def test_bert_uses_of_a_gpt2_checkpoint_are_refused():
    checkpoint = resolve_checkpoint(DATA)
    encoder = BertEncoder(vocab_size=99, hidden_size=32, num_layers=2, num_attention_heads=4,
                          inner_dim=128, max_sequence_length=32)
    with pytest.raises(UserError, match="loads into a CausalLM .* not a BertEncoder"):
        checkpoint.load(encoder=encoder)
    with pytest.raises(UserError, match="not masked-LM pretraining"):
        checkpoint.load(encoder=encoder, masked_lm=object())
    with pytest.raises(UserError, match="is a GPT-2 checkpoint, not a BERT one"):
        checkpoint.read_reference()


def test_convert_writes_a_causal_lm_model_dir(tmp_path, gpt2_golden):
    out = tmp_path / "converted"
    before = tree_digest(DATA)
    messages = []
    result = convert(DATA, str(out), log=messages.append)
    assert tree_digest(DATA) == before
    written = sorted(n for n in os.listdir(out) if not n.startswith("."))  # not the marker
    assert written == ["bert_train.json", "checkpoint", "ckpt-0.data-00000-of-00001",
                       "ckpt-0.index"]
    assert sorted(map(os.path.basename, result.files)) == written
    assert "GPT-2 with 2 layers, hidden 32, 4 heads, vocab 99" in messages[0]
    assert "byte-level BPE" in messages[-1]
    info = model_dir_lib.read_model_info(str(out))
    assert info.encoder_class == "CausalLM" and info.vocab_file is None
    assert info.task == {"name": "causal_lm", "family": "causal_lm", "block_size": 32,
                         "source": "gpt2"}
    # Rebuilt from bert_train.json and restored as any trained causal LM is.
    model = model_dir_lib.build_encoder(info)
    layout.restore_model(model, select_checkpoint(str(out)))
    np.testing.assert_allclose(_logits(model, gpt2_golden["input_ids"]), gpt2_golden["logits"],
                               atol=ATOL, rtol=0)
    # And it warm-starts a causal LM as a bert-train directory.
    warm = resolve_checkpoint(str(out), flag="--init_checkpoint")
    fresh = warm.build_encoder()
    warm.restore_model(fresh)
    np.testing.assert_allclose(_logits(fresh, gpt2_golden["input_ids"]), gpt2_golden["logits"],
                               atol=ATOL, rtol=0)
    with pytest.raises(UserError, match="byte-level BPE"):
        gpt2.check_text_support(info.task, str(out))


def test_convert_to_hf_is_refused_before_writing(tmp_path):
    out = tmp_path / "converted"
    with pytest.raises(UserError, match="converts to bert_train only"):
        convert(DATA, str(out), to=formats.HF, log=lambda _: None)
    assert not out.exists()


def test_convert_verify_writes_a_parity_report(tmp_path):
    out = tmp_path / "converted"
    messages = []
    result = convert(DATA, str(out), verify=True, log=messages.append)
    assert result.report["passed"] and result.report["tolerance"] == 1e-4
    assert max(result.report["max_abs_diff"].values()) < 1e-4
    stored = json.loads((out / "parity_report.json").read_text())
    assert stored["max_abs_diff"] == result.report["max_abs_diff"]
    assert "PASS: worst" in messages[-1] and "logits_relative" in messages[-1]


@pytest.mark.slow
def test_convert_cli_on_gpt2_and_its_one_line_errors(tmp_path, capfd):
    def run(*args):
        return _cli(capfd, "convert", *args)

    out = tmp_path / "converted"
    proc = run(f"--input={DATA}", f"--output={out}")
    assert proc.returncode == 0, proc.stderr
    assert "GPT-2 with 2 layers" in proc.stdout and "byte-level BPE" in proc.stdout
    assert (out / "bert_train.json").is_file()
    bad = tmp_path / "bad"
    shutil.copytree(DATA, bad)
    (bad / "config.json").write_text((bad / "config.json").read_text().replace(
        '"scale_attn_by_inverse_layer_idx": false', '"scale_attn_by_inverse_layer_idx": true'))
    proc = run(f"--input={bad}", f"--output={tmp_path / 'out2'}")
    assert proc.returncode == EXIT_USER_ERROR
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("bert-train convert:")]
    assert len(lines) == 1 and "scale_attn_by_inverse_layer_idx=True" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out2").exists()


def _cli(capfd, *args) -> subprocess.CompletedProcess:
    """`bert-train ARGS` through the CLI's entry point (`cli.main`) in this process, from a
    clean gin state, what it printed captured (absl's log lines included): a subprocess per
    call would import TensorFlow again for the same checks."""
    from bert_trainer import cli  # noqa: PLC0415

    gin.clear_config()
    capfd.readouterr()
    rc = cli.main(["bert-train", *args])
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(args, rc, out, err)


@pytest.mark.slow
def test_causal_pretrain_warm_starts_from_gpt2(tmp_path, gpt2_golden, capfd, caplog):
    """`pretrain --init_checkpoint=GPT2_DIR`: the architecture and weights come from GPT-2."""
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran"]
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = specials + words + [f"x{i}" for i in range(99 - len(specials) - len(words))]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")  # GPT-2 tiny's 99 rows
    rng = np.random.default_rng(0)
    (tmp_path / "corpus.txt").write_text("".join(
        " ".join(rng.choice(words, 20)) + "\n\n" for _ in range(40)))
    proc = _cli(capfd, "create_pretraining_data", "--objective=causal_lm", "--block_size=32",
                f"--input={tmp_path / 'corpus.txt'}", f"--vocab={tmp_path / 'vocab.txt'}",
                f"--output={tmp_path / 'blocks-*.tfrecord'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"
    # A learning rate too small to move any weight: the checkpoint holds GPT-2's weights.
    proc = _cli(capfd, "pretrain", "--gin_file=configs/causal_lm/tiny.gin", f"--model_dir={run}",
                f"--train_data={tmp_path / 'blocks-*.tfrecord'}",
                f"--vocab_file={tmp_path / 'vocab.txt'}", f"--init_checkpoint={DATA}",
                "--gin_param=CausalLMConfig.block_size = 32",
                "--gin_param=CausalLMConfig.train_batch_size = 4",
                "--gin_param=TrainerConfig.train_steps = 1",
                "--gin_param=OptimizerConfig.learning_rate = 1e-20")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # absl's INFO lines (stderr in a subprocess) reach pytest's log capture in this process.
    assert "GPT-2 weights from" in caplog.text and "36 variables loaded" in caplog.text
    info = model_dir_lib.read_model_info(str(run))
    assert info.encoder_class == "CausalLM"
    assert info.encoder_config["num_layers"] == 2 and info.encoder_config["hidden_size"] == 32
    model = model_dir_lib.build_encoder(info)
    layout.restore_model(model, select_checkpoint(str(run)))
    np.testing.assert_allclose(_logits(model, gpt2_golden["input_ids"]), gpt2_golden["logits"],
                               atol=ATOL, rtol=0)
