"""Continued pretraining from published weights: `bert-train pretrain --init_checkpoint=<Hugging
Face BERT directory>` takes the encoder and the vocabulary from the directory, the masked-LM
and next-sentence heads when the file has them (a fresh head otherwise, said in one line),
and trains on from there."""

import json
import logging
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import SHARED

from bert_trainer import features as F
from bert_trainer.interop import formats, hf, parity, read_checkpoint
from bert_trainer.runs import pretraining

FRESH = "has no {} head ({} in Hugging Face files): it starts fresh"


def tiny_hf(path, vocab_file: str, vocab_size: int, *, heads: bool):
    """A random BERT written by bert-train's Hugging Face writer: BertForPreTraining's layout
    (bert. prefix, cls.predictions.*, cls.seq_relationship.*) or, without heads, BertModel's."""
    config = formats.BertConfig(vocab_size=vocab_size, hidden_size=16, num_layers=2,
                                num_attention_heads=2, inner_dim=32, max_sequence_length=64)
    groups = formats.GROUPS if heads else (formats.ENCODER, formats.POOLER)
    rng = np.random.default_rng(5)
    weights = {n: rng.normal(scale=0.3, size=s).astype(np.float32)
               for g in groups for n, s in formats.reference_shapes(config, g).items()}
    hf.write_hf(str(path), formats.BertCheckpoint(config, weights, vocab_file, True, "m", "m"))
    return path


def build_trainer(hf_dir, data, model_dir):
    """`bert-train pretrain --gin_file=configs/smoke.gin --init_checkpoint=hf_dir`, built in
    process (smoke.gin's encoder, 64 wide, is not the checkpoint's: the checkpoint decides)."""
    settings = pretraining.PretrainSettings(
        gin_files=("configs/smoke.gin",), init_checkpoint=str(hf_dir), train_data=data["train"],
        gin_params=("TrainerConfig.train_steps = 3", "TrainerConfig.steps_per_loop = 3"))
    pretraining.parse_config(settings)
    return pretraining.build_pretraining_run(settings, str(model_dir)).trainer


def reference_logits(hf_dir, inputs, positions):
    """The MLM and NSP logits in float64 numpy from the file's own tensors."""
    source = read_checkpoint(str(hf_dir))
    w = source.weights
    seq = parity.reference_forward(source, inputs)
    x = np.take_along_axis(seq[F.SEQUENCE_OUTPUT], positions[:, :, None], axis=1)
    p = "cls/predictions/"
    x = x @ w[p + "transform/dense/kernel"] + w[p + "transform/dense/bias"]
    x = 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))  # exact gelu
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-12)
    x = x * w[p + "transform/LayerNorm/gamma"] + w[p + "transform/LayerNorm/beta"]
    mlm = x @ w["bert/embeddings/word_embeddings"].T + w[p + "output_bias"]
    nsp = (seq[F.POOLED_OUTPUT] @ w["cls/seq_relationship/output_weights"].T
           + w["cls/seq_relationship/output_bias"])
    return seq, mlm, nsp


def model_outputs(trainer, config):
    inputs = parity.parity_inputs(config, batch_size=2, seq_length=12)
    positions = np.array([[1, 4], [0, 3]], np.int32)
    out = trainer.model({**inputs, F.MASKED_LM_POSITIONS: positions}, training=False)
    return inputs, positions, out


@pytest.mark.slow
def test_the_published_heads_are_loaded_and_trained_on(pretraining_data, tmp_path, caplog):
    hf_dir = tiny_hf(tmp_path / "hf", pretraining_data["vocab_file"],
                     pretraining_data["vocab_size"], heads=True)
    caplog.set_level(logging.INFO, logger="absl")
    trainer = build_trainer(hf_dir, pretraining_data, tmp_path / "run")
    assert trainer.model.encoder.hidden_size == 16  # the checkpoint's, not smoke.gin's 64
    assert trainer.task.config.vocab_file == str(hf_dir / "vocab.txt")
    inputs, positions, out = model_outputs(trainer, read_checkpoint(str(hf_dir)).config)
    _, mlm, nsp = reference_logits(hf_dir, inputs, positions)
    # float32 through two layers against float64 (test_interop_hf's heads test: same bound).
    np.testing.assert_allclose(out[F.MLM_LOGITS], mlm, atol=1e-4)
    np.testing.assert_allclose(out["next_sentence_logits"], nsp, atol=1e-5)
    lines = [r.getMessage() for r in caplog.records]
    assert f"The masked-LM head is {hf_dir}'s (continued pretraining)" in lines
    assert f"The next-sentence head is {hf_dir}'s (continued pretraining)" in lines
    assert not [line for line in lines if "starts fresh" in line]
    result = trainer.train_and_evaluate()
    assert result.step == 3 and (tmp_path / "run" / "ckpt-3.index").exists()
    assert np.isfinite(result.train["loss"])
    info = json.loads((tmp_path / "run" / "bert_train.json").read_text())
    assert info["encoder"]["config"]["hidden_size"] == 16
    assert ((tmp_path / "run" / "vocab.txt").read_text()
            == (hf_dir / "vocab.txt").read_text())


@pytest.mark.slow
def test_a_file_without_heads_gets_fresh_ones_said_in_one_line(pretraining_data, tmp_path,
                                                               caplog):
    hf_dir = tiny_hf(tmp_path / "hf", pretraining_data["vocab_file"],
                     pretraining_data["vocab_size"], heads=False)
    caplog.set_level(logging.INFO, logger="absl")
    trainer = build_trainer(hf_dir, pretraining_data, tmp_path / "run")
    config = read_checkpoint(str(hf_dir)).config
    inputs, positions, out = model_outputs(trainer, config)
    seq = parity.reference_forward(read_checkpoint(str(hf_dir)), inputs)
    encoded = trainer.model.encoder(inputs, training=False)
    np.testing.assert_allclose(encoded[F.SEQUENCE_OUTPUT], seq[F.SEQUENCE_OUTPUT], atol=1e-5)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"{hf_dir} {FRESH.format('masked-LM', 'cls.predictions.*')}" in warnings
    assert f"{hf_dir} {FRESH.format('next-sentence', 'cls.seq_relationship.*')}" in warnings
    assert trainer.train_and_evaluate().step == 3
    assert (tmp_path / "run" / "ckpt-3.index").exists()


@pytest.mark.slow
def test_minilm_continues_pretraining_through_the_command_line(minilm_dir, tmp_path):
    """The real all-MiniLM-L6-v2 (a BertModel file: no heads) continued for 2 steps."""
    from bert_trainer.data.corpus_options import CorpusOptions  # noqa: PLC0415
    from bert_trainer.tasks.masked_lm import corpus as cpd  # noqa: PLC0415

    text = SHARED / "data" / "corpus" / "inaugural" / "1789-Washington.txt"
    if not text.exists():
        pytest.skip(f"{text} is absent (it holds the real test data; CI provides it)")
    pattern = str(tmp_path / "data" / "train-*.tfrecord")
    cpd.create_pretraining_data(str(text), str(minilm_dir / "vocab.txt"), pattern,
                                cpd.PretrainingDataConfig(max_seq_length=64, seed=1),
                                CorpusOptions(num_shards=1), progress=None)
    model_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "bert_trainer.cli", "pretrain", "--gin_file=configs/smoke.gin",
            f"--init_checkpoint={minilm_dir}", f"--train_data={pattern}",
            f"--model_dir={model_dir}", "--gin_param=TrainerConfig.train_steps = 2",
            "--gin_param=PretrainingConfig.train_batch_size = 4"]
    proc = subprocess.run(argv, cwd=tmp_path, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{minilm_dir} {FRESH.format('masked-LM', 'cls.predictions.*')}" in proc.stderr
    assert proc.stdout.strip().splitlines()[-1].startswith("bert-train pretrain: step 2 | ")
    info = json.loads((model_dir / "bert_train.json").read_text())
    assert info["encoder"]["config"]["hidden_size"] == 384
    assert (model_dir / "vocab.txt").read_text() == (minilm_dir / "vocab.txt").read_text()
    assert (model_dir / "ckpt-2.index").exists()


def test_each_head_is_said_loaded_fresh_or_partly_fresh():
    from bert_trainer.encoders import BertEncoder  # noqa: PLC0415
    from bert_trainer.models import BertPretrainer  # noqa: PLC0415
    from bert_trainer.tasks.masked_lm.task import head_lines  # noqa: PLC0415

    model = BertPretrainer(BertEncoder(vocab_size=30, hidden_size=8, num_layers=1,
                                       num_attention_heads=2, inner_dim=16))
    heads = [("masked-LM", model.masked_lm, "cls.predictions.*"),
             ("next-sentence", model.next_sentence, "cls.seq_relationship.*")]
    own = [v.path for v in model.masked_lm.weights
           if id(v) not in {id(w) for w in model.encoder.weights}]
    assert len(own) == 5  # transform kernel and bias, its LayerNorm, the output bias
    # The decoder (the word embeddings) is the encoder's: loaded or not, not the head's.
    lines = head_lines("ckpt", heads, [*own[1:], model.next_sentence.weights[0].path,
                                       model.next_sentence.weights[1].path], model.encoder)
    assert lines == [f"ckpt has part of the masked-LM head; {own[0]} start fresh",
                     "The next-sentence head is ckpt's (continued pretraining)"]
    assert head_lines("ckpt", heads[:1], [], model.encoder) == [
        "ckpt " + FRESH.format("masked-LM", "cls.predictions.*")]
