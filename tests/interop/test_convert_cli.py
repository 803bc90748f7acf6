"""`bert-train convert` as a user runs it: its exit code, messages and files.

The MiniLM conversion is a real `bert-train` subprocess; the other CLI calls go through the same
entry point (`cli.main`) in this process, as a subprocess per call would import TensorFlow again
for the same checks.
"""

import contextlib
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO
from robust_testing import tree_digest
from safetensors.numpy import load_file

from bert_trainer.commands.convert import convert
from bert_trainer.errors import EXIT_USER_ERROR, UserError
from bert_trainer.interop import formats, hf


def run_convert(*args):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-m", "bert_trainer.cli", "convert", *map(str, args)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def convert_here(*args) -> subprocess.CompletedProcess:
    """`bert-train convert ARGS` through `cli.main` in this process, stdout/stderr captured."""
    from bert_trainer import cli  # noqa: PLC0415

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["bert-train", "convert", *map(str, args)])
    return subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())


def error_line(proc):
    """The one line the CLI prints for a user error (TF may log before it)."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("bert-train convert:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture
def tiny_hf(tmp_path):
    config = formats.BertConfig(vocab_size=30, hidden_size=16, num_layers=2,
                                num_attention_heads=2, inner_dim=32, max_sequence_length=16)
    rng = np.random.default_rng(0)
    weights = {n: rng.normal(scale=0.2, size=s).astype(np.float32)
               for g in (formats.ENCODER, formats.POOLER)
               for n, s in formats.reference_shapes(config, g).items()}
    vocab = tmp_path / "vocab_src.txt"
    vocab.write_text("".join(f"w{i}\n" for i in range(30)), encoding="utf-8")
    hf.write_hf(str(tmp_path / "tiny"),
                formats.BertCheckpoint(config, weights, str(vocab), True, "m", "m"))
    return tmp_path / "tiny"


@pytest.mark.slow
def test_minilm_to_hf_with_verify(minilm_dir, tmp_path):
    out = tmp_path / "hf"
    proc = run_convert(f"--input={minilm_dir}", f"--output={out}", "--to=hf", "--verify")
    assert proc.returncode == 0, proc.stderr
    assert "heads carried: none" in proc.stdout
    assert "PASS: worst" in proc.stdout and "layer_5" in proc.stdout
    report = json.loads((out / "parity_report.json").read_text())
    assert report["passed"] and report["tolerance"] == 1e-4
    assert list(report["max_abs_diff"]) == ["embedding_output", *[f"layer_{i}" for i in range(6)],
                                            "sequence_output", "pooled_output"]
    assert max(report["max_abs_diff"].values()) < 1e-4
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"):
        assert (out / name).is_file(), name
    source = load_file(str(minilm_dir / "model.safetensors"))
    for name, array in load_file(str(out / "model.safetensors")).items():
        np.testing.assert_array_equal(array, source[name], err_msg=name)


@pytest.mark.slow
def test_to_bert_train_refuses_a_used_output(tiny_hf, tmp_path):
    bt = tmp_path / "bt"
    proc = convert_here(f"--input={tiny_hf}", f"--output={bt}")
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(bt)) == [".bert-train-output.json", "bert_train.json", "checkpoint",
                                      "ckpt-0.data-00000-of-00001", "ckpt-0.index", "vocab.txt"]
    again = convert_here(f"--input={tiny_hf}", f"--output={bt}")
    assert again.returncode == EXIT_USER_ERROR
    assert error_line(again) == (f"bert-train convert: error: --output={bt} exists and is not "
                                 "empty; choose a new directory or pass --overwrite")


def test_overwrite_replaces_only_its_own_output_and_back_to_hf(tiny_hf, tmp_path):
    bt = tmp_path / "bt"
    convert(str(tiny_hf), str(bt), log=lambda _: None)
    (bt / "notes.txt").write_text("mine")
    before = tree_digest(bt)
    with pytest.raises(UserError, match=rf"^--output={bt} holds notes.txt besides what "
                       "bert-train convert wrote there; move them or choose another --output$"):
        convert(str(tiny_hf), str(bt), overwrite=True, log=lambda _: None)
    assert tree_digest(bt) == before
    (bt / "notes.txt").unlink()
    (bt / "ckpt-0.index").write_text("stale")
    convert(str(tiny_hf), str(bt), overwrite=True, log=lambda _: None)
    assert (bt / "ckpt-0.index").read_bytes() != b"stale"
    convert(str(bt), str(tmp_path / "back"), to=formats.HF, log=lambda _: None)
    first = load_file(str(tiny_hf / "model.safetensors"))
    second = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert sorted(first) == sorted(second)
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)


@pytest.mark.slow
def test_user_errors_are_one_line(tiny_hf, tmp_path):
    (tiny_hf / "vocab.txt").write_text("".join(f"w{i}\n" for i in range(31)), encoding="utf-8")
    proc = convert_here(f"--input={tiny_hf}", f"--output={tmp_path / 'a'}")
    assert proc.returncode == EXIT_USER_ERROR
    assert error_line(proc) == (f"bert-train convert: error: {tiny_hf}/vocab.txt has 31 tokens "
                                f"but the embedding table in {tiny_hf}/model.safetensors has 30 "
                                "rows; use the vocab.txt of these weights")
    assert not (tmp_path / "a").exists()  # nothing is written for a bad input

    (tiny_hf / "model.safetensors").rename(tiny_hf / "pytorch_model.bin")
    proc = convert_here(f"--input={tiny_hf}", f"--output={tmp_path / 'b'}")
    assert proc.returncode == EXIT_USER_ERROR
    assert error_line(proc).startswith(f"bert-train convert: error: {tiny_hf}/pytorch_model.bin "
                                       "is a pickle (loading it can run arbitrary code)")
