"""The causal-LM benchmark (scripts/bench/causal_lm.py): packing, loss, sizes, a --smoke run.

The smoke run trains and generates with tiny models for seconds in worker processes; its
numbers mean nothing, but every row of its JSON and README block must be there and sane.
"""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))

from bench import causal_lm_data as data_lib  # noqa: E402
from bench import causal_lm_models, causal_lm_report, causal_lm_train  # noqa: E402

DOCS = ["The cat sat on the mat.", "A dog ran.", "Who is there? It is I.", "Go home now.",
        "The sea is wide and deep.", "Birds sing in the morning."]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from bert_trainer.data.tokenizer import Tokenizer

    vocab = data_lib.learn(DOCS * 20, 120, str(tmp_path_factory.mktemp("vocab")))
    return Tokenizer(vocab, lower_case=True)


def test_pack_puts_one_sep_before_each_document_and_drops_the_tail(tokenizer):
    blocks = data_lib.pack(tokenizer, DOCS, block_size=5)
    stream = []
    for ids in tokenizer.tokenize(DOCS).to_list():
        stream += [tokenizer.sep_id, *ids]
    assert blocks.dtype == np.int32 and blocks.shape == (len(stream) // 5, 5)
    assert blocks.reshape(-1).tolist() == stream[:blocks.size]  # In order, nothing padded.
    assert blocks[0, 0] == tokenizer.sep_id
    assert int((blocks == tokenizer.sep_id).sum()) == stream[:blocks.size].count(tokenizer.sep_id)


def test_split_holds_out_every_nth_document():
    train, held = data_lib.split([f"d{i}" for i in range(10)], holdout_every=3)
    assert held == ["d2", "d5", "d8"]
    assert train == ["d0", "d1", "d3", "d4", "d6", "d7", "d9"]


def test_vocab_sample_spreads_over_the_corpus_within_its_size():
    documents = [f"{i:03d}" * 10 for i in range(100)]  # 30 characters each
    sample = data_lib.vocab_sample(documents, max_chars=600)
    assert sample == documents[::5] and sum(map(len, sample)) <= 600
    assert data_lib.vocab_sample(documents, max_chars=0) == documents
    assert data_lib.vocab_sample(documents, max_chars=10**6) == documents


def test_batches_cover_every_block_once_per_epoch():
    blocks = np.arange(24, dtype=np.int32).reshape(12, 2)
    stream = data_lib.batches_forever(blocks, batch_size=4, seed=0)
    epoch = np.concatenate([next(stream) for _ in range(3)])
    assert sorted(epoch[:, 0].tolist()) == list(range(0, 24, 2))
    with pytest.raises(ValueError, match="cannot fill a batch"):
        next(data_lib.batches_forever(blocks[:3], batch_size=4, seed=0))


def test_next_token_loss_scores_position_t_on_token_t_plus_1():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 4, 6)).astype(np.float32)
    ids = np.array([[3, 1, 4, 5], [2, 5, 0, 0]], np.int32)  # 0: [PAD], never a target.
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = [-log_p[b, t, ids[b, t + 1]] for b in range(2) for t in range(3)
                if ids[b, t + 1] != 0]
    got = causal_lm_train.mean_loss(tf.constant(ids), tf.constant(logits))
    assert float(got) == pytest.approx(np.mean(expected), rel=1e-5)
    assert len(expected) == 4


def test_lstm_lm_has_the_expected_parameters_and_shapes():
    vocab, emb, units = 50, 8, 16
    model = causal_lm_models.LstmLM(vocab, emb, units, num_layers=2, dropout=0.0)
    logits = causal_lm_models.logits_of(model, tf.ones([3, 7], tf.int32), training=False)
    assert logits.shape == (3, 7, vocab)
    lstm = 4 * ((emb + units) * units + units) + 4 * ((units + units) * units + units)
    assert causal_lm_models.num_params(model) == vocab * emb + lstm + units * emb + emb + vocab


def test_keras_hub_gpt2_ties_its_output_to_the_token_embedding():
    size = causal_lm_models.Size(1, 16, 2, 32)
    model = causal_lm_models.keras_hub_gpt2(40, size, max_length=8, dropout=0.0)
    ids = tf.constant([[4, 7, 9, 0]], tf.int32)
    logits = causal_lm_models.logits_of(model, ids, training=False)
    assert logits.shape == (1, 4, 40)
    hidden = model.backbone({"token_ids": ids, "padding_mask": tf.cast(ids != 0, tf.int32)})
    table = model.backbone.token_embedding.embeddings
    np.testing.assert_allclose(logits, tf.matmul(hidden, table, transpose_b=True), atol=1e-5)


def test_train_flops_counts_layers_attention_and_the_tied_projection():
    size = causal_lm_models.Size(4, 256, 4, 1024)
    flops = causal_lm_models.train_flops(size, 30522, batch_size=16, seq_length=256)
    tokens = 16 * 256
    layers = 4 * 2 * (4 * 256 * 256 + 2 * 256 * 1024) * tokens
    attention = 16 * 4 * 2 * 2 * 256 * 256 * 256
    assert flops == 3 * (layers + attention + 2 * 256 * 30522 * tokens)
    assert 270e9 < flops < 290e9  # About 282 GFLOP per mini step.


def test_targets_compare_the_right_rows():
    def ok(kind, **values):
        return {"implementation": kind, "status": "ok", **values}

    results = {
        "step": [ok("bert_train", steps_per_s=0.6), ok("keras_hub", steps_per_s=0.3)],
        "generate": [ok("cached", tokens_per_s=600.0), ok("uncached", tokens_per_s=100.0),
                     ok("keras_hub_generate", tokens_per_s=500.0)],
        "quality": [ok("bert_train", perplexity=80.0), ok("lstm", perplexity=120.0)]}
    step, vs_hub, cache, quality = causal_lm_report.targets(results)
    assert step["value"] == pytest.approx(2.0) and step["met"] is True
    assert vs_hub["value"] == pytest.approx(1.2) and vs_hub["met"] is False
    assert cache["value"] == pytest.approx(6.0) and cache["met"] is True
    assert quality["value"] == pytest.approx(1.5) and quality["met"] is True
    results["step"][0]["status"] = "skipped"
    assert causal_lm_report.targets(results)[0]["value"] is None


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_causal_lm")
    table = out / "README.md"
    r = causal_lm_report
    table.write_text(f"# Benchmarks\nprose\n{r.BEGIN}\nold\n{r.END}\nmore prose\n")
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench" / "causal_lm.py"), "--smoke",
         "--output", str(out / "results.json"), "--table", str(table),
         "--log", str(out / "workers.log")],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:] + (out / "workers.log").read_text()[-3000:]
    return json.loads((out / "results.json").read_text()), table.read_text()


def _rows(results, section):
    rows = {r["implementation"]: r for r in results[section]}
    for kind, row in rows.items():
        assert row["status"] == "ok", (section, kind, row.get("note"))
    return rows


@pytest.mark.slow
def test_smoke_run_measures_every_row(smoke):
    results, _ = smoke
    s = results["settings"]
    assert s["smoke"] is True and results["peak"]["gflops"] > 0
    step = _rows(results, "step")
    assert set(step) == {"bert_train", "keras_hub"}
    for row in step.values():
        assert row["step_time_s"] > 0 and len(row["step_times_s"]) == s["step_rounds"]
        assert row["steps_per_s"] == pytest.approx(1 / row["step_time_s"])
        assert 0 < row["mfu"] < 2 and math.isfinite(row["final_loss"])
        assert row["flops_per_step"] == causal_lm_models.train_flops(
            causal_lm_models.Size.parse(s["size"]), s["vocab_size"], s["batch_size"],
            s["seq_length"])
    assert step["bert_train"]["loop"] == "bert-train's Trainer.run_steps on its CausalLMTask"
    # The same architecture and size: the same parameters (tied table, no output bias).
    assert step["bert_train"]["params"] == step["keras_hub"]["params"]
    gen = _rows(results, "generate")
    assert set(gen) == {"cached", "uncached", "keras_hub_generate"}
    for row in gen.values():
        assert row["tokens_per_s"] > 0 and len(row["call_times_s"]) == s["gen_rounds"]
        assert row["tokens_per_s"] == pytest.approx(
            s["gen_batch_size"] * s["max_new_tokens"] / row["call_time_s"])
    quality = _rows(results, "quality")
    assert set(quality) == {"bert_train", "lstm"}
    data = results["data"]
    assert data["blocks"]["train"] >= s["quality_batch_size"] and data["blocks"]["heldout"] > 0
    for row in quality.values():
        assert row["steps"] >= 2 and row["train_seconds"] > 0
        # Every held-out position with a next token is scored: blocks x (block_size - 1).
        assert row["heldout_blocks"] == min(data["blocks"]["heldout"], s["max_eval_blocks"])
        assert row["scored_tokens"] == row["heldout_blocks"] * (s["block_size"] - 1)
        # Near-untrained models: no better than a few times chance, never worse than far off.
        assert 1.0 < row["perplexity"] < 50 * data["vocab_size"]
        assert row["perplexity"] == pytest.approx(math.exp(row["loss"]))
        assert 0.0 <= row["next_token_accuracy"] <= 1.0
    for name in ("step", "generate", "quality"):
        assert len(results["loads"][name]["load_average_start"]) == 3


@pytest.mark.slow
def test_smoke_table_replaces_only_its_block(smoke):
    results, text = smoke
    assert text.startswith("# Benchmarks\nprose\n") and text.endswith("more prose\n")
    assert "\nold\n" not in text and "Smoke run: the numbers mean nothing" in text
    for kind, label in causal_lm_report.LABELS.items():
        assert (label in text) is (kind != "cached_graph"), label  # That row: off in --smoke.
    assert [t["name"] for t in results["targets"]] == [
        "train step: bert-train / keras-hub steps/s",
        "generation: bert-train (cache) / keras-hub tokens/s",
        "generation: bert-train with / without the cache, tokens/s",
        "held-out perplexity: LSTM / bert-train (lower is better)"]
    assert all(t["value"] is not None for t in results["targets"])
