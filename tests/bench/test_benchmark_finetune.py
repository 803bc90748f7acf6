"""The benchmark's `finetune` and `base` sections: rows, ratios, targets, and a --smoke run.

The smoke run trains the real MiniLM through bert-train's finetune task and trainer for a few
steps on SST-2 and CoNLL-2003 (and, where $BERT_TRAIN_TORCH_PYTHON names an interpreter with
torch and transformers, the PyTorch loop too); its numbers mean nothing, its rows must be
complete and consistent.
"""

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
from bench import finetune_section, report, sections, torch_finetune  # noqa: E402

TORCH_PYTHON = os.environ.get(finetune_section.TORCH_PYTHON_ENV)
SST2 = finetune_section.FULL_CASES[0]


def _outcome(seconds, examples, tokens, slots, steps=2):
    runs = [{"seconds": s, "examples": e, "tokens": t, "token_slots": n, "loss": 0.5,
             "peak_rss_mb": 100.0 + i} for i, (s, e, t, n) in
            enumerate(zip(seconds, examples, tokens, slots, strict=True))]
    return {"build": {"build_s": 3.0, "info": {"params": 7}}, "warmup_s": 1.0, "runs": runs}


def test_result_entry_rates_padding_and_median():
    outcome = _outcome(seconds=[2.0, 4.0, 3.0], examples=[64, 64, 64],
                       tokens=[1000, 1200, 1400], slots=[2000, 2000, 2000])
    e = finetune_section.result_entry(SST2, "pytorch", outcome)
    assert e["status"] == "ok" and e["task"] == "sst2" and e["goal"] == 2.0
    assert e["examples_per_s"] == pytest.approx(64 / 3.0)  # the median round
    assert e["step_time_s"] == pytest.approx(3.0 / SST2.steps)
    assert e["round_examples_per_s"] == pytest.approx([32.0, 16.0, 64 / 3.0])
    assert e["examples_timed"] == 192 and e["peak_rss_mb"] == 102.0
    assert e["tokens_per_s"] == pytest.approx(3600 / 9.0)
    assert e["padding_fraction"] == pytest.approx(1 - 3600 / 6000)
    assert e["mean_padded_length"] == pytest.approx(6000 / 192)


@pytest.mark.parametrize("error,status", [
    ("NotAvailable: not measured: torch/transformers not importable (x)", "skipped"),
    (finetune_section.NO_TORCH, "skipped"),
    ("UserError: sst2/train.tsv:3: bad row", "failed")])
def test_result_entry_skips_only_what_was_not_measured_on_purpose(error, status):
    e = finetune_section.result_entry(SST2, "pytorch", {"error": error, "runs": []})
    assert e["status"] == status and e["note"] == error and "examples_per_s" not in e


def test_ratio_and_targets_need_both_rows():
    def row(task, impl, rate, status="ok"):
        case = next(c for c in finetune_section.FULL_CASES if c.task == task)
        return finetune_section._entry(case, impl, status=status, examples_per_s=rate,
                                       note="" if status == "ok" else "not measured: x")

    entries = [row("sst2", "bert_train", 90.0), row("sst2", "pytorch", 30.0),
               row("imdb", "bert_train", 5.0), row("imdb", "pytorch", None, "skipped")]
    assert finetune_section.ratio(entries, "sst2") == pytest.approx(3.0)
    assert finetune_section.ratio(entries, "imdb") is None
    rows = finetune_section.targets(entries, sections.target)
    assert [(t["value"], t["goal"], t["met"]) for t in rows] == [
        (pytest.approx(3.0), 2.0, True), (None, 1.3, None)]
    assert rows[0]["name"].startswith("fine-tuning SST-2 (b32 x s128)")
    assert rows[1]["detail"] == "not measured: x"


def test_full_plan_sizes_and_schedule():
    plan = benchmark.make_plan(benchmark.parse_args([]))
    assert [(c.task, c.seq_length, c.batch_size, c.goal) for c in plan.finetune_cases] == [
        ("sst2", 128, 32, 2.0), ("conll2003", 128, 32, 2.0), ("imdb", 512, 16, 1.3)]
    # Each side reads one pool: every example of warm-up and timed rounds, once.
    assert SST2.pool(3, 5) == 32 * (3 + 5 * 4)
    assert (plan.base.size.name, plan.base.batch_size, plan.base.seq_length) == ("base", 8, 128)
    assert {v[0] for v in plan.base_variants} <= {"bert_train", "keras_hub"}
    assert not any(jit for _, jit, _ in plan.base_variants)
    again = benchmark.make_plan(benchmark.parse_args(["--rounds=2", "--steps=1", "--warmup=1"]))
    assert again.finetune_schedule == {"warmup": 1, "rounds": 2}
    assert {c.steps for c in again.finetune_cases} == {1}
    assert again.base_schedule == {"warmup": 1, "rounds": 2, "steps": 1}
    assert plan.finetune_gin_params == ()
    binding = "FinetuneConfig.shuffle_buffer = 100"
    assert benchmark.make_plan(benchmark.parse_args(
        [f"--finetune_gin_param={binding}"])).finetune_gin_params == (binding,)


def test_torch_python_comes_from_the_flag_or_the_environment(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv(finetune_section.TORCH_PYTHON_ENV, raising=False)
    assert benchmark.make_plan(benchmark.parse_args([])).torch_python is None
    monkeypatch.setenv(finetune_section.TORCH_PYTHON_ENV, sys.executable)
    assert benchmark.make_plan(benchmark.parse_args([])).torch_python == sys.executable
    missing = tmp_path / "no-python"
    with pytest.raises(SystemExit) as e:
        benchmark.parse_args([f"--torch_python={missing}"])
    assert e.value.code == 2
    assert f"--torch_python / $BERT_TRAIN_TORCH_PYTHON={missing} is not an executable" in (
        capsys.readouterr().err)


class _FakeEncoding(dict):
    def __init__(self, word_ids):
        super().__init__(input_ids=[0] * len(word_ids))
        self._word_ids = word_ids

    def word_ids(self):
        return self._word_ids


def test_torch_tagging_labels_sit_on_first_pieces_only():
    # "Peter Blackburn": [CLS] pe ##ter black ##burn [SEP] -> word ids None 0 0 1 1 None.
    def tokenizer(words, *, is_split_into_words, truncation, max_length):
        assert is_split_into_words and truncation and max_length == 8
        return _FakeEncoding([None, 0, 0, 1, 1, None])

    (features,) = torch_finetune.tokenize(tokenizer, [{"tokens": ["Peter", "Blackburn"],
                                                        "tags": [1, 2]}], "tagging", 8)
    assert features["labels"] == [-100, 1, -100, 2, -100, -100]


def test_torch_classification_passes_pairs_and_labels():
    seen = []

    def tokenizer(*texts, truncation, max_length):
        seen.append(texts)
        return {"input_ids": [1, 2, 3]}

    out = torch_finetune.tokenize(tokenizer, [{"text": "a", "label": 1},
                                              {"text": "b", "text_b": "c", "label": 0}],
                                  "classification", 16)
    assert seen == [("a",), ("b", "c")]
    assert [f["labels"] for f in out] == [1, 0]


def test_finetune_table_rows():
    ok = finetune_section._entry(SST2, "bert_train", status="ok", examples_per_s=90.0,
                                 step_time_s=0.356, tokens_per_s=2000.4, padding_fraction=0.25,
                                 mean_padded_length=40.0, peak_rss_mb=1500.2)
    skipped = finetune_section._entry(SST2, "pytorch", status="skipped",
                                      note=finetune_section.NO_TORCH)
    lines = report._finetune_lines([ok, skipped])
    assert "| SST-2 | 32 x 128 | bert-train | 90.0 | 0.356 | 2,000 | 25 % | 40.0 | 1,500 |  |" \
        in lines
    assert any(line.startswith("| SST-2 | 32 x 128 | PyTorch, dynamic padding | - |")
               and "skipped: not measured: no torch python" in line for line in lines)


def test_finetune_block_is_rewritten_apart_from_the_main_results(tmp_path):
    path = tmp_path / "README.md"
    path.write_text(f"# B\n{report.BEGIN}\nmain\n{report.END}\nprose\n"
                    f"{report.FINETUNE_BEGIN}\nnot measured yet\n{report.FINETUNE_END}\ntail\n")
    report.update_readme(str(path), "| ft |\n", report.FINETUNE_BEGIN, report.FINETUNE_END)
    assert path.read_text() == (f"# B\n{report.BEGIN}\nmain\n{report.END}\nprose\n"
                                f"{report.FINETUNE_BEGIN}\n| ft |\n{report.FINETUNE_END}\ntail\n")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_finetune")
    table = out / "README.md"
    table.write_text(f"# Benchmarks\n{report.BEGIN}\n{report.END}\n")
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "benchmark.py"), "--smoke",
         "--only=base,finetune", "--output", str(out / "results.json"), "--table", str(table),
         "--log", str(out / "workers.log")],
        capture_output=True, text=True, timeout=1200, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:] + (out / "workers.log").read_text()[-3000:]
    return json.loads((out / "results.json").read_text()), table.read_text()


@pytest.mark.slow
def test_smoke_finetune_rows_time_the_real_trainer(smoke):
    results, _ = smoke
    settings = results["settings"]["finetune"]
    schedule = (settings["warmup"], settings["rounds"])
    rows = results["finetune"]
    assert [(e["task"], e["implementation"]) for e in rows] == [
        ("sst2", "bert_train"), ("sst2", "pytorch"),
        ("conll2003", "bert_train"), ("conll2003", "pytorch")]
    for e in rows:
        case = next(c for c in finetune_section.SMOKE_CASES if c.task == e["task"])
        if e["implementation"] == "pytorch" and not TORCH_PYTHON:
            assert e["status"] == "skipped" and e["note"] == finetune_section.NO_TORCH
            continue
        assert e["status"] == "ok", e
        # The train step's own counts: every timed step a full batch of the pool's examples.
        assert e["examples_timed"] == case.batch_size * case.steps * schedule[1]
        assert e["examples_per_s"] == pytest.approx(1 / statistics.median(
            1 / r for r in e["round_examples_per_s"]))
        assert 0 <= e["padding_fraction"] < 1
        assert 2 < e["mean_padded_length"] <= case.seq_length
        assert np.isfinite(e["final_loss"]) and e["final_loss"] > 0
        # bert-train counts the traces of its train step inside the timed rounds (a new
        # batch shape may retrace, within the pipeline's bounded set of shapes).
        assert (e["timed_traces"] >= 0) if e["implementation"] == "bert_train" else (
            "timed_traces" not in e)
        info = e["info"]
        pool = case.pool(*schedule)
        if e["implementation"] == "bert_train":
            # MiniLM (L6/H384) with a 2-class or 9-tag head.
            assert 22_000_000 < info["params"] < 23_000_000
            assert info["examples_written"] == pool
            assert info["learning_rate"] == (5e-5 if e["task"] == "conll2003" else 2e-5)
            assert info["finetune_config"]["seq_length"] == case.seq_length
        else:
            assert info["examples_read"] == pool


@pytest.mark.slow
def test_smoke_base_rows_and_targets(smoke):
    results, text = smoke
    base = [e for e in results["training"] if e["group"] == "base"]
    assert [e["implementation"] for e in base] == ["bert_train", "keras_hub"]
    for e in base:
        assert e["status"] == "ok" and e["params"] == e["params_expected"]
        assert e["batch_size"] == 2 and e["size"] == "nano"
    names = [t["name"] for t in results["targets"]]
    assert "nano pretraining b2 x s16: bert-train / keras-hub TF step (seq/s)" in names
    ratio = base[0]["sequences_per_s"] / base[1]["sequences_per_s"]
    by_name = {t["name"]: t for t in results["targets"]}
    assert by_name["nano pretraining b2 x s16 fp32: bert-train / keras-hub TF step (seq/s)"][
        "value"] == pytest.approx(ratio)
    sst2 = by_name["fine-tuning SST-2 (b4 x s32): bert-train / PyTorch dynamic padding "
                   "(examples/s)"]
    assert (sst2["value"] is None) == (not TORCH_PYTHON)
    assert "### Pretraining step: nano (L1/H32), batch 2 x seq 16" in text
    # Only the base/finetune block is written: the main results block stays as it was.
    assert f"{report.BEGIN}\n{report.END}" in text
    assert text.index(report.FINETUNE_BEGIN) < text.index("| SST-2 |") < text.index(
        report.FINETUNE_END)
    assert text.count("| SST-2 | 4 x 32 |") == 2 and text.count("| CoNLL-2003 | 4 x 32 |") == 2
    ours = [t for t in results["targets"] if t.get("section") in ("base", "finetune")]
    assert [t["section"] for t in ours] == ["base", "base", "finetune", "finetune"]
    for t in ours:  # This block's targets; the main block was not run, so not written.
        assert f"| {t['name']} |" in text
    assert "| bert-train / keras-hub TF step (seq/s) |" not in text
