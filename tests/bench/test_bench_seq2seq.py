"""The seq2seq benchmark (scripts/bench/seq2seq.py): data, loss, parameter counts, a --smoke run.

The smoke run trains tiny models for seconds in worker processes; its numbers mean nothing,
but its JSON and README block must be complete and consistent.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))

from bench import seq2seq_data as data_lib  # noqa: E402
from bench import seq2seq_models, seq2seq_report, seq2seq_train  # noqa: E402

from bert_trainer import features  # noqa: E402

PAIRS = [("Go.", "Ve."), ("I am hungry.", "Tengo hambre."), ("Who?", "¿Quién?"),
         ("The cat is black.", "El gato es negro."), ("Run!", "¡Corre!"), ("Hi.", "Hola.")]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    return data_lib.learn_joint_vocab(PAIRS * 20, 200, str(tmp_path_factory.mktemp("vocab")))


def test_encode_follows_the_token_convention(vocab):
    from bert_trainer.data.tokenizer import Tokenizer

    tokenizer = Tokenizer(vocab, lower_case=False)
    encoded = data_lib.encode(tokenizer, PAIRS, max_length=6)
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    for src, dec, tgt, (source, target) in zip(encoded.sources, encoded.decoder_inputs,
                                               encoded.targets, PAIRS, strict=True):
        pieces = tokenizer.tokenize([source]).to_list()[0]
        assert src.tolist() == [cls, *pieces[:4], sep]  # Cut to max_length with the markers.
        assert tgt.tolist() == [*tokenizer.tokenize([target]).to_list()[0][:5], sep]
        assert dec[0] == cls and dec[1:].tolist() == tgt[:-1].tolist()
        assert len(dec) <= 6
    assert "¿" in tokenizer.vocab and "Ve" in tokenizer.vocab  # Cased, accents kept.
    batch = data_lib.batch(encoded, [0, 3])
    assert batch[features.INPUT_WORD_IDS].shape[1] % data_lib.BUCKET_MULTIPLE == 0
    np.testing.assert_array_equal(batch[features.INPUT_MASK],
                                  batch[features.INPUT_WORD_IDS] != 0)
    assert batch[features.TARGET_IDS].shape == batch[features.DECODER_INPUT_IDS].shape


def test_save_load_round_trip_and_bucketed_batches_are_full(vocab, tmp_path):
    from bert_trainer.data.tokenizer import Tokenizer

    encoded = data_lib.encode(Tokenizer(vocab, lower_case=False), PAIRS * 40, max_length=16)
    data_lib.save(str(tmp_path / "e.npz"), encoded)
    loaded = data_lib.load(str(tmp_path / "e.npz"))
    assert [s.tolist() for s in loaded.targets] == [s.tolist() for s in encoded.targets]
    assert loaded.references == encoded.references
    order = data_lib.bucketed_order(loaded, 8, seed=1)
    assert len(order) == 240 // 8 and all(len(b) == 8 for b in order)
    assert sorted(i for b in order for i in b) == list(range(240))
    # Sorted by length within a window: most batches hold one target length.
    uniform = sum(len({len(loaded.targets[i]) for i in b}) == 1 for b in order)
    assert uniform >= len(order) - 5


def test_smoothed_cross_entropy_matches_a_direct_computation():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 5)).astype(np.float32)
    targets = np.array([[1, 4, 0], [2, 0, 0]], np.int32)
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected, count = 0.0, 0
    for b, t in zip(*np.nonzero(targets), strict=True):
        q = np.full(5, 0.1 / 5)
        q[targets[b, t]] += 0.9
        expected -= (q * log_p[b, t]).sum()
        count += 1
    got = seq2seq_train.smoothed_cross_entropy(tf.constant(targets), tf.constant(logits), 0.1)
    assert float(got) == pytest.approx(expected / count, rel=1e-5)


@pytest.mark.parametrize("attention,extra", [(False, 0), (True, 64 + (128 * 64 + 64))])
def test_gru_baselines_have_the_course_sizes(attention, extra):
    vocab = 100
    model = seq2seq_models.gru_translator(vocab, 16, attention=attention)
    ids = np.array([[2, 7, 3, 0]], np.int32)
    logits = seq2seq_models.logits_of(model, {
        features.INPUT_WORD_IDS: ids, features.INPUT_MASK: (ids > 0).astype(np.int32),
        features.DECODER_INPUT_IDS: ids[:, :3], features.TARGET_IDS: ids[:, 1:]},
        training=False)
    assert logits.shape == (1, 3, vocab)
    gru = 3 * (64 * 64 + 64 * 64 + 2 * 64)  # Keras GRU, reset_after: two bias vectors.
    assert model.count_params() == 2 * vocab * 64 + 2 * gru + 65 * vocab + extra


def test_targets_compare_the_right_rows():
    results = {
        "step": [{"implementation": "bert_train", "status": "ok", "step_time_s": 0.2},
                 {"implementation": "keras_hub", "status": "ok", "step_time_s": 0.5}],
        "budget": [{"implementation": k, "status": "ok", "decoded": {"greedy": {"bleu": b}}}
                   for k, b in (("gru", 8.0), ("bahdanau", 12.5), ("bert_train", 25.0))]}
    step, bleu = seq2seq_report.targets(results)
    assert step["value"] == pytest.approx(2.5) and step["met"] is True
    assert bleu["value"] == pytest.approx(12.5) and bleu["met"] is True
    results["budget"][2]["status"] = "skipped"
    assert seq2seq_report.targets(results)[1]["value"] is None


def test_budget_size_and_recipe_apply_to_bert_train_only(tmp_path, capsys):
    shared = tmp_path / "shared"
    (shared / "data" / "spa_eng").mkdir(parents=True)
    (shared / "data" / "spa_eng" / "train.tsv").write_text("Go.\tVe.\n")
    from bench import seq2seq

    args = seq2seq.parse_args([f"--shared_dir={shared}", "--budget_kinds=gru,bert_train",
                               "--budget_size=2/64/2/128", "--budget_learning_rate=2e-3",
                               "--budget_warmup_steps=50", "--budget_dropout=0.2"])
    assert args.budget_kinds == ("gru", "bert_train")
    prepared = {"joint": {"train": "t.npz", "dev": "d.npz", "vocab_file": "v.txt",
                          "lower_case": False, "vocab_size": 100}}
    ours = seq2seq._budget_params(args, prepared, "bert_train")
    assert (ours["size"], ours["learning_rate"], ours["warmup_steps"], ours["dropout"]) == (
        "2/64/2/128", 2e-3, 50, 0.2)
    gru = seq2seq._budget_params(args, prepared, "gru")
    assert gru["size"] == args.size == "4/256/4/1024" and "learning_rate" not in gru
    # The step section keeps the size it shares with keras-hub.
    assert seq2seq._params(args, prepared, "bert_train")["size"] == "4/256/4/1024"
    for bad, message in (("--budget_kinds=gru,lstm", "--budget_kinds=gru,lstm: choose from"),
                         ("--budget_size=3/192", "--budget_size=3/192: give L/H/A/F")):
        with pytest.raises(SystemExit):
            seq2seq.parse_args([f"--shared_dir={shared}", bad])
        assert message in capsys.readouterr().err


def test_bert2bert_models_share_one_recipe(tmp_path):
    (tmp_path / "data" / "spa_eng").mkdir(parents=True)
    (tmp_path / "data" / "spa_eng" / "train.tsv").write_text("Go.\tVe.\n")
    from bench import seq2seq

    args = seq2seq.parse_args([f"--shared_dir={tmp_path}", "--b2b_learning_rate=5e-4",
                               "--b2b_warmup_steps=40"])
    prepared = {"minilm": {"train": "t.npz", "dev": "d.npz", "vocab_file": "vocab.txt",
                           "lower_case": True, "vocab_size": 30522}}
    params = [seq2seq._b2b_params(args, prepared, k) for k in ("bert2bert", "bert2bert_scratch")]
    for p in params:
        assert (p["learning_rate"], p["warmup_steps"], p["vocab_size"], p["lower_case"]) == (
            5e-4, 40, 30522, True)
    assert [p["kind"] for p in params] == ["bert2bert", "bert2bert_scratch"]


def test_recipe_peak_learning_rate():
    def peak(kind, learning_rate=None):
        optimizer = seq2seq_train.recipe(kind, 10, learning_rate)["optimizer"]
        optimizer.iterations.assign(9)  # Step 10 of 10: the end of the warm-up, the peak.
        return float(optimizer.learning_rate)

    assert peak("bert_train") == pytest.approx(7e-4)
    assert peak("bert2bert") == pytest.approx(7e-4)
    assert peak("bert2bert", 3e-4) == pytest.approx(3e-4)
    assert peak("bert_train", 1e-3) == pytest.approx(1e-3)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_seq2seq")
    table = out / "README.md"
    from bench import seq2seq_report as r

    table.write_text(f"# Benchmarks\nprose\n{r.BEGIN}\nold\n{r.END}\nmore prose\n")
    from bench import seq2seq, worker

    # In-process: this process has TensorFlow imported already; every model still trains in
    # its own worker. The fork server --smoke starts is closed here, and later workers of
    # this process start fresh again.
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        code = seq2seq.main(["--smoke", "--output", str(out / "results.json"),
                             "--table", str(table), "--log", str(out / "workers.log")])
    finally:
        os.chdir(cwd)
        server = worker._fork_server_state["server"]
        if server is not None:
            server.close()
        worker._fork_server_state["server"] = None
        worker.preload_workers(False)
    assert code == 0, (out / "workers.log").read_text()[-3000:]
    return json.loads((out / "results.json").read_text()), table.read_text()


@pytest.mark.slow
def test_smoke_run_measures_every_row(smoke):
    results, text = smoke
    assert results["settings"]["smoke"] is True and results["vocab_size"] > 100
    step = {r["implementation"]: r for r in results["step"]}
    assert step["keras_hub"]["status"] == "ok" and step["keras_hub"]["step_time_s"] > 0
    assert len(step["keras_hub"]["step_times_s"]) == results["settings"]["step_rounds"]
    assert step["bert_train"]["status"] == "ok", step["bert_train"].get("note")
    budget = {r["implementation"]: r for r in results["budget"]}
    for kind in ("gru", "bahdanau"):
        row = budget[kind]
        assert row["status"] == "ok" and row["steps"] >= 2 and row["train_seconds"] > 0
        assert 0.0 <= row["decoded"]["greedy"]["bleu"] <= 100.0
        gru = 3 * (64 * 64 + 64 * 64 + 2 * 64)
        extra = 64 + 128 * 64 + 64 if kind == "bahdanau" else 0
        assert row["params"] == 193 * results["vocab_size"] + 2 * gru + extra
    assert budget["bert_train"]["status"] == "ok", budget["bert_train"].get("note")
    assert set(budget["bert_train"]["decoded"]) == {"greedy", "beam2"}
    b2b = {r["implementation"]: r for r in results["bert2bert"]}
    assert set(b2b) == {"bert2bert", "bert2bert_scratch"}
    assert b2b["bert2bert_scratch"]["status"] == "ok", b2b["bert2bert_scratch"].get("note")
    assert b2b["bert2bert"]["status"] == "ok", b2b["bert2bert"].get("note")
    for row in b2b.values():  # Both train exactly the same steps.
        assert row["steps"] == results["settings"]["b2b_steps"]
    assert b2b["bert2bert"]["loaded_variables"] > 0
    assert b2b["bert2bert_scratch"]["loaded_variables"] == 0


@pytest.mark.slow
def test_smoke_table_replaces_only_its_block(smoke):
    results, text = smoke
    assert text.startswith("# Benchmarks\nprose\n") and text.endswith("more prose\n")
    assert "\nold\n" not in text and "Smoke run: the numbers mean nothing" in text
    for label in ("GRU encoder-decoder (course)", "GRU + Bahdanau attention (course)",
                  "keras-hub TransformerEncoder/Decoder", "BERT2BERT warm started from MiniLM"):
        assert label in text, label
    assert [t["name"] for t in results["targets"]] == [
        "training step: keras-hub time / bert-train time",
        "dev BLEU: bert-train minus the better GRU model"]


@pytest.mark.slow  # six decoding loops traced and timed at tiny sizes: ~10 s on 2 cores
def test_decode_benchmark_smoke_run_writes_every_variant(tmp_path, capsys, monkeypatch):
    script = REPO / "scripts" / "bench" / "seq2seq_decode.py"
    # The script starts as a script (its sys.path set-up); the run itself is in-process: this
    # process has TensorFlow imported already.
    run = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0 and "--smoke" in run.stdout, run.stderr[-2000:]
    from bench import seq2seq_decode

    output = tmp_path / "decode.json"
    # --threads=0 (TF's choice) is the count this process started with, which TensorFlow,
    # started already, refuses to be told again.
    threads = []
    monkeypatch.setattr(tf.config.threading, "set_intra_op_parallelism_threads", threads.append)
    assert seq2seq_decode.main(["--smoke", f"--output={output}"]) == 0 and threads == [0]
    stdout = capsys.readouterr().out
    results = json.loads(output.read_text())
    names = {f"{kind}_{mode}" for kind in ("greedy", "beam4")
             for mode in ("cached", "uncached", "cached_xla")}
    assert set(results["variants"]) == names
    for entry in results["variants"].values():
        assert len(entry["seconds"]) == 2 and entry["tokens_per_s"] > 0
        tokens = results["settings"]["batch_size"] * results["settings"]["max_decode_length"]
        assert entry["tokens_per_s"] == pytest.approx(tokens / entry["median_s"])
    speedup = results["cache_speedup"]
    assert set(speedup) == {"greedy", "beam4", "greedy_xla", "beam4_xla"}
    ratio = (results["variants"]["beam4_cached_xla"]["tokens_per_s"]
             / results["variants"]["beam4_uncached"]["tokens_per_s"])
    assert speedup["beam4_xla"] == pytest.approx(ratio)
    # The target is on translate's default loop, the compiled one.
    assert results["target"] == {"beam4_cache_speedup_min": 5.0, "ratio": "beam4_xla",
                                 "met": speedup["beam4_xla"] >= 5}
    assert "target beam4_xla >= 5.0x" in stdout and not list(tmp_path.glob("*.partial"))
