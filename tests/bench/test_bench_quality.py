"""The pretraining-quality benchmark (scripts/bench/quality*.py): flag checks, snapshot choice,
the keras-hub weight mapping, the report, and (slow) a smoke run of the whole harness."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from conftest import REPO
from numerics import assert_close

sys.path.insert(0, str(REPO / "scripts"))

from bench import (  # noqa: E402
    quality,
    quality_keras_hub,
    quality_report,
    quality_systems,
    quality_torch,
)

from bert_trainer import features as F  # noqa: E402
from bert_trainer.interop import resolve  # noqa: E402

SHARED = REPO.parent / "shared" / "data"


@pytest.mark.parametrize("flags, message", [
    (["--systems=none,gpt"], "--systems: 'gpt' is unknown"),
    (["--budgets=5,x"], "--budgets='5,x': give minutes"),
    (["--budgets=0"], "every budget must be > 0"),
    (["--seeds=0"], "--seeds=0 must be >= 1"),
    (["--sizes=mini,huge"], "--sizes: 'huge' is not in configs/encoders/"),
    (["--low_resource_examples=0"], "--low_resource_examples and --low_resource_steps"),
    (["--systems=pytorch", "--torch_python=/nonexistent/python"], "cannot import torch"),
])
def test_bad_flags_fail_in_one_line_before_writing(flags, message, tmp_path, capsys):
    output = tmp_path / "results.json"
    code = quality.main([*flags, f"--output={output}", f"--workdir={tmp_path / 'work'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("quality: error: ") and message in err
    assert len(err.splitlines()) == 1
    assert not output.exists() and not (tmp_path / "work").exists()


def test_system_names_follow_the_results_schema():
    assert quality.system_name("none") == "none"
    assert quality.system_name("pytorch") == "pytorch"
    assert quality.system_name("cram") == "bert-train cram"
    assert quality.system_name("cram-post_norm") == "bert-train cram-post_norm"


def test_a_budget_run_is_snapshot_at_its_final_checkpoint(tmp_path):
    """bert-train runs one --time_budget run per budget: its snapshot is the checkpoint of the
    steps the budget bought (bert_train.json), with the start-up before its loop."""
    launched = 1_000_000.0
    for step, second in ((10, 20), (37, 62)):
        index = tmp_path / f"ckpt-{step}.index"
        index.write_text("")
        os.utime(index, (launched + second, launched + second))
    (tmp_path / "bert_train.json").write_text(json.dumps(
        {"time_budget": {"seconds": 50.0, "elapsed_seconds": 50.4, "steps": 37}}))
    snap = quality_systems.budget_snapshot(str(tmp_path), launched, 50.0)
    assert (snap["seconds"], snap["step"], snap["dir"]) == (50.0, 37, str(tmp_path / "ckpt-37"))
    assert snap["elapsed"] == pytest.approx(62.0)
    assert snap["startup"] == pytest.approx(62.0 - 50.4)
    assert snap["loop_seconds"] == pytest.approx(50.4)


def test_sizes_are_read_from_the_encoder_gin_files():
    """--sizes names configs/encoders/*.gin; `custom` is the --hidden_size ... flags."""
    args = quality.parse_args(["--sizes=tiny,mini,small,custom", "--hidden_size=32",
                               "--num_layers=1", "--num_attention_heads=2", "--inner_dim=64"])
    sizes = quality.encoder_sizes(args)
    assert list(sizes) == ["tiny", "mini", "small", "custom"]
    assert sizes["tiny"] == dict(hidden_size=128, num_layers=2, num_attention_heads=2,
                                 inner_dim=512, max_sequence_length=512)
    assert sizes["small"]["hidden_size"] == 512 and sizes["small"]["num_attention_heads"] == 8
    assert sizes["custom"]["hidden_size"] == 32 and sizes["custom"]["inner_dim"] == 64


def test_the_low_resource_fine_tune_reads_the_first_sentences(tmp_path):
    args = quality.parse_args(["--low_resource_examples=3", "--low_resource_steps=7",
                               "--seeds=2"])
    (tmp_path / "data").mkdir()
    recipes = quality.finetune_recipes(args, str(tmp_path))
    assert list(recipes) == ["sst2_accuracy", "sst2_2k_accuracy"]
    full, low = recipes["sst2_accuracy"], recipes["sst2_2k_accuracy"]
    assert (full.steps, low.steps, low.seeds) == (400, 7, (1, 2))
    assert full.eval_file == low.eval_file
    lines = open(low.train_file, encoding="utf-8").read().splitlines()
    with open(full.train_file, encoding="utf-8") as f:
        assert lines == [next(f).rstrip("\n") for _ in range(4)]  # the header and 3 rows


@pytest.mark.parametrize("fraction, factor", [
    (0.0, 0.0), (0.05, 0.5), (0.1, 1.0), (0.55, 0.5), (1.0, 0.0), (1.2, 0.0)])
def test_the_workers_schedule_runs_on_the_fraction_of_the_budget(fraction, factor):
    """PyTorch's and keras-hub's rate is set each step from elapsed / budget: a 10 % warmup,
    then linear decay to 0 when the budget is spent (no calibration, no planned steps)."""
    assert quality_torch.rate_factor(fraction, 0.1) == pytest.approx(factor)
    assert quality_keras_hub.rate_factor(fraction, 0.1) == pytest.approx(factor)


def test_keras_hub_snapshot_converts_to_the_same_encoder(tmp_path):
    """The keras-hub weights, renamed and written by bert-train's Hugging Face writer, give
    the same outputs in bert-train's encoder: the scorer and fine-tuning read what keras-hub
    trained. Not to float32 rounding: keras-hub's BERT layers use GELU's tanh approximation,
    the Hugging Face / Google layout the exact erf form (they differ by < 0.02 anywhere)."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"{t}\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                             + [f"w{i}" for i in range(35)]))
    params = {"vocab_size": 40, "vocab_file": str(vocab),
              "sizes": dict(hidden_size=16, num_layers=2, num_attention_heads=2, inner_dim=32,
                            max_sequence_length=24)}
    keras.utils.set_random_seed(3)
    _, _, model = quality_keras_hub.build(params)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 40, size=(2, 12)).astype("int32")
    mask = np.ones_like(ids)
    mask[1, 8:] = 0
    positions = np.array([[1, 3], [2, 5]], "int32")
    hub = model({"token_ids": ids, "padding_mask": mask, "segment_ids": np.zeros_like(ids),
                 "mask_positions": positions})  # (batch, 2, vocab) logits
    backbone = model.backbone({"token_ids": ids, "padding_mask": mask,
                               "segment_ids": np.zeros_like(ids)})
    quality_keras_hub.write_hf({w.path: w.numpy() for w in model.weights}, params,
                               str(tmp_path / "hf"), np)
    checkpoint = resolve.resolve_checkpoint(str(tmp_path / "hf"))
    from bert_trainer.models import BertPretrainer  # noqa: PLC0415

    pretrainer = BertPretrainer(checkpoint.build_encoder(output_dropout=0.0,
                                                         attention_dropout=0.0),
                                num_next_sentence_labels=0)
    checkpoint.load(encoder=pretrainer.encoder, masked_lm=pretrainer.masked_lm)
    ours = pretrainer({F.INPUT_WORD_IDS: ids, F.INPUT_MASK: mask,
                       F.INPUT_TYPE_IDS: np.zeros_like(ids), F.MASKED_LM_POSITIONS: positions},
                      training=False)
    assert_close(ours[F.MLM_LOGITS], hub, rtol=0, atol=2e-3)
    assert np.array_equal(np.argmax(ours[F.MLM_LOGITS], -1), np.argmax(hub, -1))
    encoded = pretrainer.encoder({F.INPUT_WORD_IDS: ids, F.INPUT_MASK: mask,
                                  F.INPUT_TYPE_IDS: np.zeros_like(ids)}, training=False)
    assert_close(encoded[F.POOLED_OUTPUT], backbone["pooled_output"], rtol=0, atol=2e-3)
    # A swapped pair of weights would not pass: the layers' kernels are not interchangeable.
    assert np.abs(np.asarray(hub)).max() > 0.05


def record(runs):
    return {"settings": {"seeds": [1, 2, 3]}, "runs": runs, "title": "test"}


RUNS = [
    {"system": "none", "minutes": 0, "steps": 0, "mlm_accuracy": 0.001,
     "sst2_accuracy": {"mean": 0.575, "std": 0.01, "seeds": [0.57, 0.58, 0.575]}},
    {"system": "bert-train cram", "minutes": 5, "steps": 900, "mlm_accuracy": 0.2512,
     "sst2_accuracy": {"mean": 0.6123, "std": 0.0151, "seeds": [0.6, 0.61, 0.63]},
     "sst2_2k_accuracy": {"mean": 0.55, "std": 0.02, "seeds": [0.53, 0.55, 0.57]},
     "startup_seconds": 21.2},
    {"system": "bert-train cram", "minutes": 10, "steps": None, "mlm_accuracy": None,
     "sst2_accuracy": None},
]


def test_table_rows_and_the_readme_block_is_replaced_in_place(tmp_path):
    lines = quality_report.table_lines(record(RUNS))
    assert "mean ± std of 3 seeds" in lines[0] and "2,000 sentences" in lines[0]
    assert lines[3] == "| - | bert-train cram | 5 | 900 | 21 | 25.1 | 61.2 ± 1.5 | 55.0 ± 2.0 |"
    assert lines[4] == "| - | bert-train cram | 10 | 0 | - | - | - | - |"
    readme = tmp_path / "README.md"
    readme.write_text("# Benchmarks\n\nintro\n")
    quality_report.replace_table(str(readme), record(RUNS), "first")
    quality_report.replace_table(str(readme), record(RUNS[:2]), "second")
    text = readme.read_text()
    assert text.startswith("# Benchmarks\n\nintro\n")
    assert text.count(quality_report.TABLE_START) == 1
    assert "second" in text and "first" not in text and "| 10 |" not in text


def _run(system, minutes, mlm, sst2):
    return {"system": system, "minutes": minutes, "steps": 1, "mlm_accuracy": mlm,
            "sst2_accuracy": {"mean": sst2, "std": 0.0, "seeds": [sst2]}}


def test_targets_take_the_best_recipe_at_each_budget():
    runs = [_run("none", 0, 0.0, 0.70), _run("bert-train bert", 10, 0.14, 0.72),
            _run("bert-train cram", 10, 0.16, 0.74), _run("pytorch", 10, 0.05, 0.71),
            _run("keras-hub", 10, 0.08, 0.70), _run("bert-train cram", 20, 0.2, 0.76),
            _run("bert-train bert", 20, 0.18, 0.77), _run("pytorch", 20, 0.21, 0.76)]
    got = {t["name"]: (round(t["value"], 6), t["met"])
           for t in quality_report.targets(record(runs))}
    assert got == {
        "10 min: bert-train cram minus pytorch, SST-2 points": (3.0, True),
        "10 min: bert-train cram minus pytorch, masked-LM points": (11.0, True),
        "10 min: bert-train cram minus keras-hub, SST-2 points": (4.0, True),
        "20 min: bert-train bert minus pytorch, SST-2 points": (1.0, False),
        "20 min: bert-train bert minus pytorch, masked-LM points": (-3.0, False),
        "20 min: bert-train bert minus none, SST-2 points": (7.0, True)}
    behind = [_run("bert-train cram", 20, 0.3, 0.73), _run("pytorch", 20, 0.15, 0.75),
              _run("keras-hub", 20, 0.14, 0.74)]  # behind both: not "by more" than pytorch
    assert [t["met"] for t in quality_report.targets(record(behind))] == [False, True, False]
    lines = quality_report.target_lines(record(runs))
    assert lines[2] == "| 10 min: bert-train cram minus pytorch, SST-2 points | +3.0 | >= 2 | yes |"
    assert lines[5].endswith("| +1.0 | >= 2 | **no** |")


def test_the_table_and_targets_group_by_size():
    runs = [{**_run("none", 0, 0.0, 0.70), "size": "tiny"},
            {**_run("bert-train cram", 20, 0.2, 0.73), "size": "tiny"},
            {**_run("none", 0, 0.0, 0.71), "size": "mini",
             "sst2_2k_accuracy": {"mean": 0.60, "std": None, "seeds": [0.60]}},
            {**_run("bert-train cram", 20, 0.3, 0.69), "size": "mini",
             "sst2_2k_accuracy": {"mean": 0.66, "std": None, "seeds": [0.66]}},
            {**_run("bert-train cram", 10, 0.2, 0.70), "size": "tiny"}]
    rows = quality_report.table_lines(record(runs))[2:]
    assert [r.split(" | ")[0:3] for r in rows] == [
        ["| tiny", "none", "0"], ["| tiny", "bert-train cram", "20"],
        ["| tiny", "bert-train cram", "10"], ["| mini", "none", "0"],
        ["| mini", "bert-train cram", "20"]]
    got = {t["name"]: round(t["value"], 6) for t in quality_report.targets(record(runs))}
    assert got == {"tiny: 20 min: bert-train cram minus none, SST-2 points": 3.0,
                   "mini: 20 min: bert-train cram minus none, SST-2 points": -2.0,
                   "mini: 20 min: bert-train cram minus none, SST-2 2,000 sentences points": 6.0}


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "quality.png"
    quality_report.plot(record(RUNS), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob("*.tmp-*"))


@pytest.mark.slow
def test_smoke_run_writes_one_record_per_system_and_budget(tmp_path, monkeypatch):
    if not (SHARED / "imdb" / "train.tsv").exists():
        pytest.skip(f"{SHARED} is absent (it holds the real data; CI provides it)")
    # The script starts as a script (its sys.path set-up); the run itself is in-process: this
    # process has TensorFlow imported already. The systems still run their own commands.
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bench" / "quality.py"),
                           "--help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--smoke" in done.stdout, done.stderr[-2000:]
    output = tmp_path / "results.json"
    monkeypatch.chdir(REPO)
    assert quality.main(["--smoke", f"--workdir={tmp_path / 'work'}",
                         f"--output={output}"]) == 0
    results = json.loads(output.read_text())
    assert [(r["size"], r["system"], r["minutes"]) for r in results["runs"]] == [
        ("custom", "none", 0), ("custom", "bert-train cram", 0.2)]
    none, cram = results["runs"]
    # A --time_budget run: it trains its whole budget (launch to final checkpoint: start-up
    # too), not a planned step count, and its snapshot is the checkpoint at the end.
    assert cram["steps"] > 0 and cram["elapsed_minutes"] >= 0.2
    assert 0 <= none["mlm_accuracy"] < 0.05  # random weights
    assert cram["mlm_accuracy"] > none["mlm_accuracy"]
    assert 0 < cram["startup_seconds"] < cram["elapsed_minutes"] * 60
    for run in results["runs"]:
        for key in ("sst2_accuracy", "sst2_2k_accuracy"):
            sst2 = run[key]
            assert len(sst2["seeds"]) == 1 and sst2["std"] is None
            assert 0.3 < sst2["mean"] < 0.8 and sst2["mean"] == sst2["seeds"][0]
    assert results["settings"]["finetune"]["sst2_2k_accuracy"]["steps"] == 10
    assert (tmp_path / "results.png").read_bytes()[:4] == b"\x89PNG"
