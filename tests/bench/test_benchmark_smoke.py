"""The benchmark harness (scripts/benchmark.py): FLOPs/params formulas, data, and a --smoke run.

The smoke run trains nano-sized models for a few steps in worker processes; its numbers mean
nothing, but its JSON and table must be complete and self-consistent.
"""

import importlib.util
import json
import os
import statistics
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))

import benchmark  # noqa: E402
import compare_trees  # noqa: E402
from bench import floor, report, sections, tokenizer_bench  # noqa: E402
from bench import spec as spec_lib  # noqa: E402

from bert_trainer import features, ops  # noqa: E402
from bert_trainer.models import bert_pretrainer  # noqa: E402

MINI = spec_lib.StepSpec(spec_lib.SIZES["mini"])


def test_forward_flops_matches_a_matmul_by_matmul_count():
    # mini, batch 32 x seq 128, 20 predictions: every matmul of the forward pass, as (m, k, n).
    b, s, h, f, heads, p, v = 32, 128, 256, 1024, 4, 20, 30522
    per_layer = [(b * s, h, h)] * 4 + [(b * s, h, f), (b * s, f, h)]
    per_layer += [(b * heads * s, h // heads, s), (b * heads * s, s, h // heads)]  # QK^T, PV
    heads_mm = [(b, h, h), (b, h, 2), (b * p, h, h), (b * p, h, v)]
    expected = sum(2 * m * k * n for m, k, n in per_layer * 4 + heads_mm)
    assert spec_lib.forward_flops(MINI) == expected
    assert spec_lib.train_flops(MINI) == 3 * expected
    assert spec_lib.train_flops(MINI) == pytest.approx(114.02e9, rel=1e-3)


def test_mlm_flops_count_only_the_gathered_positions():
    more = spec_lib.StepSpec(MINI.size, max_predictions=40)
    delta = spec_lib.forward_flops(more) - spec_lib.forward_flops(MINI)
    assert delta == 2 * 32 * 20 * 256 * (256 + 30522)


def test_bert_trains_mlm_rows_are_the_weighted_predictions_rounded_up():
    batches = spec_lib.make_batches(MINI, spec_lib.NUM_DATA_BATCHES)
    weighted = [int(np.count_nonzero(b[features.MASKED_LM_WEIGHTS])) for b in batches]
    # 90 % of the sequences hold 19 predictions of 20, the short ones fewer.
    assert all(500 < w < 640 for w in weighted)
    rows = [-(-w // 16) * 16 for w in weighted]
    assert spec_lib.computed_mlm_rows(MINI) == pytest.approx(np.mean(rows))
    assert bert_pretrainer.computed_prediction_rows(641, 640) == 640
    assert bert_pretrainer.computed_prediction_rows(0, 640) == 0
    fewer = spec_lib.forward_flops(MINI) - spec_lib.forward_flops(MINI, mlm_rows=600)
    assert fewer == 2 * 40 * 256 * (256 + 30522)


def test_bert_trains_packed_tokens_are_the_real_tokens():
    batches = spec_lib.make_batches(MINI, spec_lib.NUM_DATA_BATCHES)
    real = [int(np.count_nonzero(b[features.INPUT_MASK])) for b in batches]
    # 10 % of the sequences are short: about 5 % of the slots are padding.
    assert all(0.85 * 4096 < r <= 4096 for r in real) and 0.9 < np.mean(real) / 4096 < 0.99
    assert spec_lib.computed_tokens(MINI) == pytest.approx(np.mean(real))
    h, f = MINI.size.hidden_size, MINI.size.inner_dim
    fewer = (spec_lib.forward_flops(MINI, last_layer_rows=21)
             - spec_lib.forward_flops(MINI, last_layer_rows=21, tokens=4000))
    # 96 tokens fewer in every layer's dense products (the last layer's K and V only).
    assert fewer == 96 * 2 * (3 * (4 * h * h + 2 * h * f) + 2 * h * h)


@pytest.mark.parametrize("size,seq", [("mini", 128), ("tiny", 256), ("small", 64)])
@pytest.mark.parametrize("last_layer_rows,mlm_rows,tokens",
                         [(None, None, None), (21, None, None), (21, 584, None), (21, 584, 3900)])
def test_floor_products_are_the_steps_flops_with_consistent_operands(size, seq, last_layer_rows,
                                                                      mlm_rows, tokens):
    step = spec_lib.StepSpec(spec_lib.SIZES[size], seq_length=seq)
    tokens = None if tokens is None else tokens * seq // 128
    listed = floor.products(step, last_layer_rows, mlm_rows, tokens)
    assert sum(p.flops for p in listed) == spec_lib.train_flops(step, last_layer_rows, mlm_rows,
                                                                tokens)
    vocabulary = next(p for p in listed if p.name == "MLM vocabulary")
    assert vocabulary.m == (step.batch_size * step.max_predictions if mlm_rows is None
                            else mlm_rows)
    for p in listed:
        a, b = p.operand_shapes()
        inner_a = a[-2] if p.transpose_a else a[-1]
        inner_b = b[-1] if p.transpose_b else b[-2]
        assert inner_a == inner_b == p.k, p
        assert len(a) == len(b) == (3 if p.batch > 1 else 2)
    # Forward, input gradient and weight gradient of every dense product.
    names = [p.name for p in listed]
    for name in ("layer 0 FFN in", "MLM vocabulary", "pooler"):
        assert {name, f"{name} dx"} <= set(names) and (
            f"{name} dW" in names or f"{name} dtable" in names)
    last = step.size.num_layers - 1
    assert (f"layer {last} KV" in names) == (last_layer_rows is not None)


def test_attach_floors_only_where_the_floor_does_the_steps_flops():
    def entry(implementation, jit=False, precision=None, flops=10, seconds=2.0):
        return {"implementation": implementation, "status": "ok", "jit_compile": jit,
                "mixed_precision": precision, "executed_flops_per_step": flops,
                "step_time_s": seconds}

    entries = [entry("bert_train"), entry("bert_train", precision="bfloat16", seconds=1.0),
               entry("bert_train", jit=True), entry("keras_hub"),
               entry("bert_train", precision="float16")]
    floors = [{"dtype": "float32", "status": "ok", "flops_per_step": 10, "step_time_s": 1.5},
              {"dtype": "bfloat16", "status": "ok", "flops_per_step": 10, "step_time_s": 0.5}]
    sections.attach_floors(entries, floors)
    assert [e.get("matmul_share") for e in entries] == [0.75, 0.5, None, None, None]
    other = [entry("bert_train", flops=11)]
    sections.attach_floors(other, floors)
    assert "matmul_share" not in other[0]


def test_num_params_matches_known_encoder_count_plus_heads():
    tiny = spec_lib.SIZES["tiny"]
    encoder = 4_385_920  # bert_trainer's tiny encoder (L2/H128, vocab 30522, 2 types).
    heads = (128 * 128 + 128) + 2 * 128 + 30522 + (128 * 2 + 2)  # MLM transform, LN, bias; NSP
    assert spec_lib.num_params(tiny) == encoder + heads


def test_make_batches_are_valid_pretraining_features():
    step = spec_lib.StepSpec(spec_lib.SIZES["mini"], batch_size=64, seq_length=32,
                             max_predictions=5)
    first, again = spec_lib.make_batches(step, 1, seed=3)[0], spec_lib.make_batches(step, 1, 3)[0]
    for name in features.ENCODER_INPUTS:
        assert first[name].shape == (64, 32) and first[name].dtype == np.int32
        np.testing.assert_array_equal(first[name], again[name])  # deterministic
    lengths = first[features.INPUT_MASK].sum(1)
    assert 0.8 < np.mean(lengths == 32) < 1.0  # ~90 % full length, some short
    positions, weights = first[features.MASKED_LM_POSITIONS], first[features.MASKED_LM_WEIGHTS]
    assert positions.shape == weights.shape == (64, 5)
    real = weights > 0
    assert np.all(positions[real] >= 1)  # never [CLS]
    assert np.all(positions[real] <= np.repeat(lengths[:, None] - 2, 5, 1)[real])  # nor [SEP]
    ids = np.take_along_axis(first[features.INPUT_WORD_IDS], positions, 1)
    np.testing.assert_array_equal(ids[real], first[features.MASKED_LM_IDS][real])
    assert np.all(first[features.INPUT_WORD_IDS][first[features.INPUT_MASK] == 0] == 0)


def test_update_readme_replaces_only_the_marked_block(tmp_path):
    path = tmp_path / "README.md"
    path.write_text(f"# Title\nprose\n{report.BEGIN}\nold\n{report.END}\nafter\n")
    report.update_readme(str(path), "| new |\n")
    assert path.read_text() == f"# Title\nprose\n{report.BEGIN}\n| new |\n{report.END}\nafter\n"
    fresh = tmp_path / "fresh.md"
    report.update_readme(str(fresh), "| t |\n")
    assert fresh.read_text() == f"{report.BEGIN}\n| t |\n{report.END}\n"


def test_record_peak_keeps_the_highest_median():
    peak = {}
    sections.record_peak(peak, "gflops_start", 100.0)
    sections.record_peak(peak, "gflops_during_compare", 120.0)
    sections.record_peak(peak, "gflops_end", 90.0)
    assert peak["gflops"] == 120.0 and peak["gflops_end"] == 90.0


def test_growth_skips_points_past_the_budget_and_reuses_the_compare_point():
    plan = benchmark.make_plan(benchmark.parse_args(["--budget_s=0"]))
    measured = {
        "group": "compare", "implementation": "bert_train", "jit_compile": False,
        "mixed_precision": None, "size": "mini", "seq_length": 128, "status": "ok",
        "step_time_s": 2.0, "sequences_per_s": 16.0, "build_s": 10.0, "warmup_s": 20.0,
        "flops_per_step": spec_lib.train_flops(plan.main)}
    entries = sections.growth(plan, [measured])  # Budget 0: nothing may start a worker.
    got = {(e["group"], e["size"], e["seq_length"]): e for e in entries}
    assert len(entries) == 6 and len(got) == 6
    for key in (("size_growth", "mini", 128), ("seq_growth", "mini", 128)):
        assert got[key]["status"] == "ok" and got[key]["relative_step_time"] == 1.0
    small = got[("size_growth", "small", 128)]
    assert small["status"] == "skipped" and "--budget_s=0" in small["note"]
    # Estimate: build + warm-up, then 3 steps at the FLOPs-scaled time, x1.5 safety.
    scale = small["flops_per_step"] / measured["flops_per_step"]
    assert f"~{30 + 1.5 * 3 * 2.0 * scale:.0f} s" in small["note"]


def test_collect_texts_mixes_sst2_and_corpus_evenly(shared_dir):
    texts = tokenizer_bench.collect_texts(shared_dir, 1000)
    assert len(texts) == 1000 and all(texts)
    assert texts[0] == "hide new secretions from the parental units"  # SST-2's first row
    assert texts == tokenizer_bench.collect_texts(shared_dir, 1000)
    # The second half is corpus prose: longer lines than SST-2's review fragments.
    assert np.mean([len(t) for t in texts[500:]]) > np.mean([len(t) for t in texts[:500]])


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    table = out / "README.md"
    table.write_text(f"# Benchmarks\nhand-written prose\n{report.BEGIN}\n{report.END}\n")
    proc = subprocess.run(
        # The base and finetune sections have their own smoke run
        # (tests/bench/test_benchmark_finetune.py).
        [sys.executable, str(REPO / "scripts" / "benchmark.py"), "--smoke",
         "--only=peak,compare,growth,pipeline,tokenizer",
         "--output", str(out / "results.json"), "--table", str(table),
         "--log", str(out / "workers.log")],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:] + (out / "workers.log").read_text()[-3000:]
    return json.loads((out / "results.json").read_text()), table.read_text()


@pytest.mark.slow
def test_smoke_results_have_every_section(smoke):
    results, _ = smoke
    for key in ("schema_version", "machine", "settings", "flops_formula", "matmul_peak",
                "training", "input_pipeline", "tokenizer", "targets", "peer_figures_seq_per_s"):
        assert key in results, key
    machine = results["machine"]
    assert machine["cpu_model"] and machine["usable_cores"] >= 1
    assert machine["versions"]["tensorflow"].startswith("2.")
    assert results["settings"]["smoke"] is True
    peak = results["matmul_peak"]
    assert peak["gflops"] == max(peak["gflops_start"], peak["gflops_during_compare"]) > 0
    assert [t["goal"] for t in results["targets"]] == [1.5, 1.5, 1.0, 65.0, 65.0, 5.0, 1.0]
    # The smoke plan trains float32 only: both speed rows are its bert-train fp32 row.
    assert results["targets"][1]["value"] == pytest.approx(results["targets"][0]["value"])
    assert results["targets"][1]["detail"] == "bert-train (fp32) vs keras-hub"
    # The smoke run has no bfloat16 variant: that MFU row is empty, not invented.
    assert results["targets"][4]["value"] is None and "gflops_bfloat16" not in peak


@pytest.mark.slow
def test_smoke_training_entries_are_consistent(smoke):
    results, _ = smoke
    train = results["training"]
    groups = {e["group"] for e in train}
    assert groups == {"compare", "size_growth", "seq_growth"}
    wired = importlib.util.find_spec("bert_trainer.tasks.masked_lm.task") is not None
    for e in train:
        if e["implementation"].startswith("bert_train") and not wired:
            assert e["status"] == "skipped" and e["note"].startswith("NotAvailable")
            continue
        assert e["status"] == "ok", e
        step = spec_lib.StepSpec(spec_lib.SIZES[e["size"]], e["batch_size"], e["seq_length"],
                                 e["max_predictions"], e["jit_compile"], e["mixed_precision"])
        assert e["flops_per_step"] == spec_lib.train_flops(step)
        assert e["params"] == e["params_expected"] == spec_lib.num_params(step.size)
        assert e["step_time_s"] == pytest.approx(statistics.median(e["step_times_s"]))
        assert e["sequences_per_s"] == pytest.approx(e["batch_size"] / e["step_time_s"])
        assert e["tokens_per_s"] == pytest.approx(e["sequences_per_s"] * e["seq_length"])
        # bert-train's pretrainer computes its last layer at [CLS] + the masked positions
        # only: the FLOPs it executes are the formula's less those rows; keras-hub's are all.
        # Without XLA its masked LM also computes only the weighted predictions, and its
        # layers only the real tokens.
        ours = e["implementation"].startswith("bert_train")
        rows = 1 + step.max_predictions if ours else None
        compacts = ours and not e["jit_compile"] and ops.dynamic_shapes_are_free()
        mlm_rows = spec_lib.computed_mlm_rows(step) if compacts else None
        tokens = spec_lib.computed_tokens(step) if compacts else None
        assert e["executed_flops_per_step"] == pytest.approx(
            spec_lib.train_flops(step, last_layer_rows=rows, mlm_rows=mlm_rows, tokens=tokens),
            abs=3)
        assert (e["executed_flops_per_step"] < e["flops_per_step"]) == (rows is not None)
        assert e["gflops"] == pytest.approx(
            e["executed_flops_per_step"] / e["step_time_s"] / 1e9)
        assert e["mfu"] == pytest.approx(e["gflops"] / results["matmul_peak"]["gflops"])
        assert e["peak_rss_mb"] >= e["rss_after_import_mb"] > 50
        assert np.isfinite(e["final_loss"]) and e["final_loss"] > 0
    compare = [e for e in train if e["group"] == "compare"]
    assert {(e["implementation"], e["jit_compile"]) for e in compare} == {
        ("bert_train", False), ("bert_train_tf_ops", False), ("keras_hub", False)}
    # The matmul floor ran in the same rounds and does exactly the FLOPs bert-train executes.
    (fp32,) = results["matmul_floor"]
    assert fp32["status"] == "ok" and fp32["dtype"] == "float32"
    assert len(fp32["step_times_s"]) == results["settings"]["rounds"]
    assert fp32["step_time_s"] == pytest.approx(statistics.median(fp32["step_times_s"]))
    ours = next(e for e in compare if e["implementation"] == "bert_train")
    if wired:
        assert sections.same_flops(fp32["flops_per_step"], ours["executed_flops_per_step"])
        assert ours["matmul_share"] == pytest.approx(fp32["step_time_s"] / ours["step_time_s"])
    assert sorted(e["seq_length"] for e in train if e["group"] == "seq_growth") == [16, 32]


@pytest.mark.slow
def test_smoke_pipeline_and_tokenizer(smoke, shared_dir):
    results, _ = smoke
    pipe, tok = results["input_pipeline"], results["tokenizer"]
    assert pipe["status"] == "ok", pipe
    assert pipe["examples_per_s"] > 0 and pipe["created"]["examples"] > 0
    assert pipe["ratio_to_step"] == pytest.approx(
        pipe["examples_per_s"] / pipe["step_sequences_per_s"])
    assert tok["status"] == "ok" and tok["texts"] == 2000
    # Same vocab, same normalization: the two tokenizers agree on real sentences and prose.
    assert tok["agreement"] >= 0.999
    rates = tok["implementations"]
    assert tok["ratio"] == pytest.approx(
        rates["bert_trainer"]["tokens_per_s"] / rates["tokenizers"]["tokens_per_s"])
    assert tok["ratio_single_thread"] == pytest.approx(
        rates["bert_trainer (1 thread)"]["tokens_per_s"]
        / rates["tokenizers (1 thread)"]["tokens_per_s"])
    # One thread or all: the same pieces; the two libraries within their disagreement.
    ours, theirs = rates["bert_trainer"]["tokens"], rates["tokenizers"]["tokens"]
    assert rates["bert_trainer (1 thread)"]["tokens"] == ours
    assert rates["tokenizers (1 thread)"]["tokens"] == theirs
    assert ours == pytest.approx(theirs, rel=1e-3)


@pytest.mark.slow
def test_smoke_table_has_a_row_per_measurement(smoke):
    results, text = smoke
    assert text.startswith("# Benchmarks\nhand-written prose\n")  # prose kept
    assert results["machine"]["cpu_model"] in text and "SMOKE RUN" in text
    compare_rows = [line for line in text.splitlines() if line.startswith(
        ("| bert-train |", "| bert-train, TF ops only |", "| keras-hub |"))]
    assert len(compare_rows) == 3
    # What the fused kernels buy, from the two bert-train rows of the same rounds.
    fused, tf_ops = (next(e for e in results["training"] if e["group"] == "compare"
                          and e["implementation"] == name) for name in
                     ("bert_train", "bert_train_tf_ops"))
    assert (f"**{fused['step_time_s']:.3f} s** with them and {tf_ops['step_time_s']:.3f} s on "
            f"TensorFlow's own ops (`BERT_TRAIN_FUSED_KERNELS=off`), same rounds: "
            f"**{tf_ops['step_time_s'] / fused['step_time_s']:.2f}x**") in text
    assert text.count("| nano, seq ") == 2 and "| nano L1/H32, seq 16 |" in text
    for target in results["targets"]:
        assert f"| {target['name']} |" in text
    floor_s = results["matmul_floor"][0]["step_time_s"]
    assert "Matmul floor: bert-train's step with only its matrix products left" in text
    assert f"float32 **{floor_s:.3f} s** per step" in text
    assert "| bert_trainer |" in text and "| tokenizers (1 thread) |" in text


@pytest.mark.slow  # two benchmark worker processes, one per checkout
def test_compare_trees_pairs_two_checkouts_round_by_round(tmp_path):
    """scripts/compare_trees.py: this checkout against itself, nano sizes (the harness only)."""
    output = tmp_path / "ab.json"
    code = compare_trees.main([f"--baseline={REPO}", "--size=nano", "--batch_size=4",
                               "--seq_length=16", "--max_predictions=3", "--rounds=3",
                               "--steps=1", "--warmup=1", f"--output={output}"])
    result = json.loads(output.read_text())
    assert code == 0, result
    assert len(result["round_ratios"]) == 3 and all(r > 0 for r in result["round_ratios"])
    assert result["ratio"] == pytest.approx(statistics.median(result["round_ratios"]))
    assert result["baseline_s"] > 0 and result["candidate_s"] > 0
    assert compare_trees.main([f"--baseline={tmp_path}"]) == 2  # not a checkout


def test_another_checkouts_worker_starts_in_that_checkout(tmp_path, monkeypatch):
    """`python -m` puts the working directory first on sys.path, before PYTHONPATH: a baseline
    worker started from this checkout would import this checkout's bert_trainer."""
    from bench import worker  # noqa: PLC0415

    class Started(Exception):
        pass

    seen = {}

    def popen(args, **kwargs):
        seen.update(kwargs, args=args)
        raise Started

    monkeypatch.setattr(worker.subprocess, "Popen", popen)
    with pytest.raises(Started):
        worker.Worker("bert_train", {}, str(tmp_path / "log"), checkout=str(tmp_path))
    assert seen["cwd"] == str(tmp_path)
    assert seen["env"]["PYTHONPATH"].split(os.pathsep)[:2] == [str(tmp_path / "scripts"),
                                                                str(tmp_path)]
    assert seen["args"][1:] == ["-m", "bench.worker"]
