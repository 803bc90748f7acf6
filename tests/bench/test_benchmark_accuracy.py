"""scripts/bench/finetune_accuracy.py without training: statistics, report, arguments, refusals.

The training itself (bert-train's CLI and the PyTorch loop) is what the script's --smoke run
checks; it needs torch in another interpreter and minutes of CPU.
"""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))

from bench import finetune_accuracy as fa  # noqa: E402
from bench import report  # noqa: E402

SHARED_DEV = REPO.parent / "shared" / "data" / "sst2" / "dev.tsv"


def _settings(**overrides):
    args = fa.build_parser().parse_args(["--output=x.json", "--model=/m", *overrides.pop(
        "argv", [])])
    return fa.settings_from_args(args)


def test_summarize_gives_sample_std_min_max():
    stats = fa.summarize([0.80, 0.82, 0.84])
    assert stats["mean"] == pytest.approx(0.82)
    assert stats["std"] == pytest.approx(0.02)  # n - 1: population std would be 0.01633
    assert (stats["min"], stats["max"], stats["n"]) == (0.80, 0.84, 3)
    assert fa.summarize([0.5]) == {"mean": 0.5, "std": None, "min": 0.5, "max": 0.5, "n": 1}


@pytest.mark.parametrize("bert_train,pytorch,difference,noise,within", [
    ([0.83, 0.84, 0.85], [0.82, 0.83, 0.84], 0.01, 0.02, True),
    ([0.83, 0.84, 0.85], [0.80, 0.80, 0.80], 0.04, 0.02, False),  # zero spread on one side
    ([0.84, 0.84], [0.80, 0.86], 0.01, 2 * 0.0424264, True),  # the larger std counts
    ([0.84], [0.80, 0.86], 0.01, None, None)])  # one seed: no noise estimate
def test_compare_against_max_two_std(bert_train, pytorch, difference, noise, within):
    c = fa.compare(fa.summarize(bert_train), fa.summarize(pytorch))
    assert c["difference"] == pytest.approx(difference)
    assert c["within_noise"] is within
    if noise is None:
        assert c["noise"] is None
    else:
        assert c["noise"] == pytest.approx(noise, rel=1e-5)


def _results(bert_train, pytorch, settings=None, **bert_train_overrides):
    settings = settings or _settings()

    def side(values, wall_s, steps=None, dev=872):
        return {"per_seed": dict(zip(settings.seeds, values, strict=True)), "wall_s": wall_s,
                "steps": dict.fromkeys(settings.seeds, steps or settings.train_steps()),
                "eval_examples": dict.fromkeys(settings.seeds, dev)}

    sides = {"bert_train": side(bert_train, 301.25, **bert_train_overrides),
             "pytorch": side(pytorch, 120.0)}
    return fa.results_record(settings, sides, "/t/python")


def test_report_lines_show_means_seeds_wall_and_verdict():
    results = _results([0.80, 0.82, 0.84], [0.81, 0.81, 0.81])
    lines = fa.report_lines(results)
    assert lines[0].startswith("SST-2 dev accuracy, mean ± sample std (n - 1) over seeds 1,2,3")
    assert "4000 train / all dev sentences, seq 64, batch 32, 1 epoch(s) = 125 steps" in lines[0]
    assert lines[1] == ("  bert-train  accuracy 0.8200 ± 0.0200  (seed 1: 0.8000, 2: 0.8200, "
                        "3: 0.8400)  wall 301.2 s")
    assert lines[2].startswith("  pytorch     accuracy 0.8100 ± 0.0000  (seed 1: 0.8100")
    assert lines[3] == ("  difference (bert-train - pytorch) +0.0100; seed noise max(2 std) "
                        "0.0400: within seed noise")
    far = fa.report_lines(_results([0.90, 0.91, 0.92], [0.80, 0.81, 0.82]))[3]
    assert far.endswith("0.0200: NOT within seed noise") and "+0.1000" in far
    assert len(lines) == 4 and results["mismatches"] == []


def test_unequal_steps_or_dev_examples_are_warned():
    results = _results([0.80, 0.82, 0.84], [0.81, 0.81, 0.81], steps=126, dev=871.0)
    assert results["mismatches"] == [
        "the sides evaluated different numbers of dev examples: [871, 872]",
        "bert_train trained [126] steps, not 125"]
    assert fa.report_lines(results)[-1] == ("  WARNING: bert_train trained [126] steps, not 125; "
                                            "the settings were not equal")


def test_results_record_is_json_and_keeps_every_seed(tmp_path):
    results = _results([0.80, 0.82, 0.84], [0.81, 0.80, 0.79])
    path = tmp_path / "out" / "r.json"
    report.write_json(str(path), results)
    back = json.loads(path.read_text())
    assert os.listdir(path.parent) == ["r.json"]  # nothing left aside
    assert back["pytorch"]["per_seed"] == {"1": 0.81, "2": 0.80, "3": 0.79}
    assert back["bert_train"]["summary"]["std"] == pytest.approx(0.02)
    assert back["comparison"]["difference"] == pytest.approx(0.02)
    assert back["train_steps"] == 125 and back["warmup_steps"] == 12
    assert back["settings"]["learning_rate"] == 5e-5 and back["settings"]["seeds"] == [1, 2, 3]


def test_defaults_smoke_and_explicit_flags():
    s = _settings()
    assert (s.train_examples, s.dev_examples, s.seeds) == (4000, None, (1, 2, 3))
    assert (s.seq_length, s.batch_size, s.num_epochs, s.learning_rate) == (64, 32, 1.0, 5e-5)
    assert (s.warmup_fraction, s.weight_decay, s.clip_norm, s.dropout) == (0.1, 0.01, 1.0, 0.1)
    smoke = _settings(argv=["--smoke"])
    assert (smoke.train_examples, smoke.dev_examples, smoke.seeds) == (64, 32, (1, 2))
    mixed = _settings(argv=["--smoke", "--seeds=5", "--train_examples=100"])
    assert (mixed.train_examples, mixed.dev_examples, mixed.seeds) == (100, 32, (5,))
    assert (mixed.train_steps(), mixed.warmup_steps()) == (4, 0)  # ceil(100 / 32), int(0.4)


@pytest.mark.parametrize("seeds", ["1,x", "1,1", "-1", ""])
def test_bad_seeds_are_usage_errors(seeds, capsys):
    with pytest.raises(SystemExit) as raised:
        fa.build_parser().parse_args(["--output=x", f"--seeds={seeds}"])
    assert raised.value.code == 2
    assert "--seeds" in capsys.readouterr().err


def test_bert_train_command_passes_every_setting():
    command = fa.bert_train_command(_settings(argv=["--smoke"]), "/runs/x", python="py")
    assert command[:5] == ["py", "-m", "bert_trainer.cli", "finetune", "--task=sst2"]
    for flag in ["--model_dir=/runs/x", "--init_checkpoint=/m", "--seq_length=64",
                 "--batch_size=32", "--learning_rate=5e-05", "--num_epochs=1.0",
                 "--max_train_examples=64", "--max_eval_examples=32", "--seeds=1,2",
                 "--long_texts=truncate",
                 "--gin_param=FinetuneConfig.warmup_fraction = 0.1",
                 "--gin_param=OptimizerConfig.weight_decay = 0.01",
                 "--gin_param=OptimizerConfig.clip_norm = 1.0",
                 "--gin_param=FinetuneConfig.dropout_rate = 0.1"]:
        assert flag in command
    assert not any(a.startswith("--max_eval_examples")
                   for a in fa.bert_train_command(_settings(), "/r"))


def test_read_bert_train_results_reads_the_multi_seed_layout(tmp_path):
    # The layout of bert_trainer/tasks/multi_seed.py's write_results.
    record = {"task": "sst2", "seeds": [1, 2], "metrics": {"accuracy": {"mean": 0.8}},
              "runs": [{"seed": 1, "init_seed": 7, "data_seed": 8, "model_dir": "seed-1",
                        "step": 2, "metrics": {"accuracy": 0.75, "num_examples": 32}},
                       {"seed": 2, "init_seed": 9, "data_seed": 10, "model_dir": "seed-2",
                        "step": 2, "metrics": {"accuracy": 0.8125, "num_examples": 32}}]}
    (tmp_path / "eval_results.json").write_text(json.dumps(record))
    assert fa.read_bert_train_results(str(tmp_path)) == {
        "per_seed": {1: 0.75, 2: 0.8125}, "steps": {1: 2, 2: 2},
        "eval_examples": {1: 32, 2: 32}}


def test_read_tsv_first_rows_skip_blank_lines(tmp_path):
    path = tmp_path / "t.tsv"
    path.write_text("sentence\tlabel\na film \t1\n\nbad \" quote\t0\nthird\t1\n")
    assert fa.read_tsv(str(path), 2) == [{"text": "a film ", "label": 1},
                                         {"text": 'bad " quote', "label": 0}]
    assert len(fa.read_tsv(str(path), None)) == 3


@pytest.mark.skipif(not SHARED_DEV.is_file(), reason="no ../shared SST-2 data")
def test_read_tsv_reads_all_of_sst2_dev():
    examples = fa.read_tsv(str(SHARED_DEV), None)
    assert len(examples) == 872
    assert {e["label"] for e in examples} == {0, 1}


def test_torch_python_flag_then_env_then_default():
    env = {fa.TORCH_PYTHON_ENV: "/env/python"}
    assert fa.resolve_torch_python("/flag/python", env) == "/flag/python"
    assert fa.resolve_torch_python(None, env) == "/env/python"
    assert fa.resolve_torch_python(None, {}) == fa.DEFAULT_TORCH_PYTHON


def test_missing_torch_python_exits_2_before_anything(tmp_path):
    """Run as a user runs it: one line naming the flag and the variable, no output file."""
    output = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if k != fa.TORCH_PYTHON_ENV}
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench" / "finetune_accuracy.py"),
         f"--output={output}", f"--torch_python={tmp_path / 'nope' / 'python'}",
         "--model=/m"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"no PyTorch interpreter at {tmp_path / 'nope' / 'python'}" in done.stderr
    assert "--torch_python" in done.stderr and fa.TORCH_PYTHON_ENV in done.stderr
    assert not output.exists() and os.listdir(tmp_path) == []


def test_python_without_torch_is_refused(tmp_path, capsys):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\n" + "x\t0\n" * 40)
    code = fa.main([f"--output={tmp_path / 'r.json'}", f"--torch_python={fake}",
                    f"--model={model}", f"--train_file={train}", f"--dev_file={train}"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{fake} cannot import torch and transformers (ModuleNotFoundError: No module " \
           "named 'torch')" in err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("argv,message", [
    (["--train_file=/no/such.tsv"], "--train_file=/no/such.tsv does not exist"),
    (["--train_examples=10"], "--train_examples=10 is less than one batch of 32"),
    (["--dev_examples=0"], "--dev_examples=0 must be >= 1")])
def test_check_inputs_names_the_flag(tmp_path, argv, message):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\n")
    settings = fa.settings_from_args(fa.build_parser().parse_args(
        ["--output=x", f"--model={model}", f"--train_file={dev}", f"--dev_file={dev}", *argv]))
    assert message in fa.check_inputs(settings, str(python))
    assert "is not a Hugging Face directory" in fa.check_inputs(
        fa.settings_from_args(fa.build_parser().parse_args(
            ["--output=x", "--model=/no/model", f"--train_file={dev}", f"--dev_file={dev}"])),
        str(python))
