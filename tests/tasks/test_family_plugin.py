"""A task family from outside the package (tests/family_plugin) registers, fine-tunes, exports
and predicts through the CLI, and each way of naming a plugin finds it."""

import importlib
import json
import subprocess
import sys
from importlib import metadata

import numpy as np
import pytest
from robust_testing import REPO, subprocess_env

from bert_trainer.errors import UserError
from bert_trainer.tasks import plugins, registry

PLUGIN = "family_plugin.length_parity"
WORDS = ["alpha", "beta", "gamma", "delta", "the", "cat", "sat", "on", "mat", "dog"]


@pytest.fixture
def clean_registry(monkeypatch):
    """The registry as it is now, restored afterwards (a plugin must not leak into others)."""
    plugins.families()
    monkeypatch.setattr(plugins, "_families", dict(plugins._families))
    monkeypatch.setattr(plugins, "_plugins_loaded", False)
    monkeypatch.delitem(sys.modules, PLUGIN, raising=False)
    monkeypatch.delenv(plugins.ENV_VAR, raising=False)


def write_tsv(path, count: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(count):
        n = int(rng.integers(1, 9))
        lines.append(" ".join(rng.choice(WORDS, n)) + "\t" + ("odd" if n % 2 else "even"))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_register_family_explicitly(clean_registry, tmp_path):
    plugin = importlib.import_module(PLUGIN)  # importing registers it
    assert plugins.get_family("length_parity") is plugin.FAMILY
    assert plugins.register_family(plugin.FAMILY) is plugin.FAMILY  # again: same class, kept
    assert "length_parity" in registry.task_names()
    assert registry.family_of("length_parity") is plugin.FAMILY
    write_tsv(tmp_path / "train.tsv", 5, seed=0)
    td = registry.resolve_task_data("length_parity", train_file=str(tmp_path / "train.tsv"))
    rows = list(td.load("train", file=str(tmp_path / "train.tsv")).as_numpy_iterator())
    assert len(rows) == 5 and all(r["label"] == len(r["text"].split()) % 2 for r in rows)
    with pytest.raises(UserError, match=r"data/x.tsv:1: expected text<TAB>even\|odd"):
        bad = tmp_path / "data" / "x.tsv"
        bad.parent.mkdir()
        bad.write_text("no label\n", encoding="utf-8")
        td.load("train", file=str(bad))
    # The column flags are classification's: refused for this family, by its attributes.
    with pytest.raises(UserError, match="column flags .* apply to classification, regression "
                                        "and translate files, not to task 'length_parity'"):
        registry.resolve_task_data("length_parity", columns={"text_column": "x"})


def test_a_name_or_a_dataset_of_another_family_is_refused(clean_registry):
    plugin = importlib.import_module(PLUGIN)

    class Impostor(plugin.LengthParityFamily):
        name = "classification"

    with pytest.raises(UserError, match="task family 'classification' is already registered "
                                        "by bert_trainer.tasks.classification"):
        plugins.register_family(Impostor())

    class Squatter(plugin.LengthParityFamily):
        name = "squatter"
        local_tasks = ("sst2",)

    with pytest.raises(UserError, match="task family 'squatter' declares the task 'sst2' of "
                                        "family 'classification'"):
        plugins.register_family(Squatter())


def test_plugins_from_the_environment_variable(clean_registry, monkeypatch):
    with pytest.raises(UserError, match="unknown task family 'length_parity'; known: "
                                        "causal_lm, classification, masked_lm, regression, "
                                        "squad, tagging"):
        plugins.get_family("length_parity")
    monkeypatch.setattr(plugins, "_plugins_loaded", False)
    monkeypatch.setenv(plugins.ENV_VAR, f" {PLUGIN} ,")
    assert plugins.get_family("length_parity").name == "length_parity"


def test_plugins_from_entry_points(clean_registry, monkeypatch):
    entry = metadata.EntryPoint(name="parity", value=f"{PLUGIN}:FAMILY",
                                group=plugins.ENTRY_POINT_GROUP)
    monkeypatch.setattr(plugins.metadata, "entry_points",
                        lambda group: [entry] if group == plugins.ENTRY_POINT_GROUP else [])
    assert plugins.get_family("length_parity").name == "length_parity"


def test_a_missing_plugin_module_is_one_line(clean_registry):
    with pytest.raises(UserError, match="--family_module: cannot import the task family module "
                                        "'no_such_plugin'"):
        plugins.import_family_modules("no_such_plugin")
    info = {"name": "x", "family": "gone", "family_module": "no_such_plugin"}
    with pytest.raises(UserError, match="bert_train.json: the task family 'gone' is in the "
                                        "module 'no_such_plugin', which is imported only when "
                                        "you name it .*pass --family_module=no_such_plugin"):
        plugins.family_from_info(info, "bert_train.json")


def test_a_model_dir_does_not_choose_what_is_imported(clean_registry, tmp_path, monkeypatch):
    """A recorded family_module is never imported on a model directory's say."""
    (tmp_path / "planted_family.py").write_text(
        f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    info = {"name": "x", "family": "planted", "family_module": "planted_family"}
    with pytest.raises(UserError, match="pass --family_module=planted_family"):
        plugins.family_from_info(info, "run/bert_train.json")
    assert not (tmp_path / "ran").exists(), "the model dir's family_module was imported"


def test_a_family_module_given_as_a_path_or_failing_on_import_is_one_line(clean_registry,
                                                                         tmp_path, monkeypatch):
    with pytest.raises(UserError, match=r"--family_module: './my_family.py' is a file path, "
                                        r"not a module name; put its folder on PYTHONPATH and "
                                        r"pass --family_module=my_family"):
        plugins.import_family_modules("./my_family.py")
    (tmp_path / "broken_family.py").write_text(
        "x = 1\nraise RuntimeError('no GPU here\\nmore')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError) as raised:
        plugins.import_family_modules("broken_family")
    assert str(raised.value) == ("--family_module: importing the task family module "
                                 "'broken_family' failed: RuntimeError: no GPU here; fix the "
                                 "module")


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "bert_trainer.cli", *map(str, args)],
                          cwd=REPO, env=env or subprocess_env(TF_CPP_MIN_LOG_LEVEL="3"),
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_plugin_family_finetune_export_predict_through_the_cli(tiny_pretrained, tmp_path):
    write_tsv(tmp_path / "train.tsv", 48, seed=1)
    write_tsv(tmp_path / "dev.tsv", 20, seed=2)
    model_dir, export = tmp_path / "run", tmp_path / "export"
    proc = run_cli("finetune", "--task=length_parity", f"--family_module={PLUGIN}",
                   f"--train_file={tmp_path / 'train.tsv'}", f"--eval_file={tmp_path / 'dev.tsv'}",
                   "--batch_size=8", "--train_steps=4",
                   f"--init_checkpoint={tiny_pretrained['dir']}", f"--model_dir={model_dir}")
    assert proc.returncode == 0, proc.stderr
    results = json.loads((model_dir / "eval_results.json").read_text())
    assert results["family"] == "length_parity" and results["step"] == 4
    assert set(results["metrics"]) == {"loss", "odd_rate", "parity_accuracy", "num_examples"}
    assert results["metrics"]["num_examples"] == 20
    assert 0 <= results["metrics"]["parity_accuracy"] <= 1
    task = json.loads((model_dir / "bert_train.json").read_text())["task"]
    assert (task["family"], task["family_module"]) == ("length_parity", PLUGIN)
    assert task["best_metric"] == "parity_accuracy" and task["seq_length"] == 32
    operative = (model_dir / "operative_config.gin").read_text()
    assert "OptimizerConfig.learning_rate = 0.001" in operative  # the plugin's own recipe
    assert "TrainerConfig.best_metric = 'parity_accuracy'" in operative

    # export, predict and evaluate import the family only when it is named.
    named = f"--family_module={PLUGIN}"
    proc = run_cli("export", f"--model_dir={model_dir}", f"--output={export}", named)
    assert proc.returncode == 0, proc.stderr
    assert "exported length_parity model (seq_length 32)" in proc.stdout
    assert "serving_default(text) -> odd_probability, parity" in proc.stdout
    record = json.loads((export / "assets.extra" / "bert_train_family.json").read_text())
    # The family, its module, and the model it was written from (predict rebuilds it).
    assert {k: record[k] for k in ("family", "family_module")} == {
        "family": "length_parity", "family_module": PLUGIN}
    assert record["model"]["task"]["family"] == "length_parity"
    inputs = tmp_path / "in.txt"
    inputs.write_text("the cat sat\n\nalpha beta\n", encoding="utf-8")
    answers = {}
    for source in (f"--saved_model={export}", f"--model_dir={model_dir}"):
        out = tmp_path / ("saved.jsonl" if "saved" in source else "dir.jsonl")
        proc = run_cli("predict", source, f"--input={inputs}", f"--output={out}", named)
        assert proc.returncode == 0, proc.stderr
        answers[source] = [json.loads(line) for line in out.read_text().splitlines()]
    saved, direct = answers.values()
    assert [(a["line"], a["text"]) for a in saved] == [(1, "the cat sat"), (3, "alpha beta")]
    for got, want in zip(saved, direct, strict=True):
        assert set(got) == {"line", "text", "parity", "odd_probability"}
        assert got["parity"] == ("odd" if got["odd_probability"] > 0.5 else "even")
        assert got["odd_probability"] == pytest.approx(want["odd_probability"], abs=1e-5)

    proc = run_cli("evaluate", f"--model_dir={model_dir}", f"--eval_file={tmp_path / 'dev.tsv'}",
                   named)
    assert proc.returncode == 0, proc.stderr
    assert "parity_accuracy" in proc.stdout

    # Not named: the model_dir's recorded module is not imported; one line says so, exit 2.
    proc = run_cli("export", f"--model_dir={model_dir}", f"--output={tmp_path / 'e2'}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("bert-train export: error: ")
    assert "is imported only when you name it" in proc.stderr
    assert f"pass --family_module={PLUGIN}" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "e2").exists()
