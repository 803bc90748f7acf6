"""Multi-seed fine-tuning (`finetune --seeds` / `--num_seeds`): the statistics, the seed streams,
whose directory a multi-seed run may use, and the command end to end on the tiny model.

The end-to-end tests (marked slow) run the command through the CLI's runner in this process
(`finetune_testing.run_in_process`), except the rerun that must start from a fresh process to
show nothing leaked from one seed to the next: that one is a real `bert-train` subprocess. The
refusals run in this process too, as they stop before anything is built.
"""

import errno
import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
from finetune_testing import error_line, run_cli, run_in_process, shared_file
from robust_testing import tree_digest

from bert_trainer.checkpoints import model_dir as model_dir_lib
from bert_trainer.errors import UserError
from bert_trainer.tasks import multi_seed

# -- the statistics --------------------------------------------------------------------------


def test_aggregate_matches_numpy():
    rng = np.random.default_rng(0)
    seeds = [3, 1, 7, 2, 11]
    values = rng.uniform(0, 1, size=(len(seeds), 3))
    per_seed = {s: {"accuracy": v[0], "loss": v[1], "f1": v[2] * 100}
                for s, v in zip(seeds, values, strict=True)}
    per_seed[7]["only_here"] = 0.5  # a metric some seed lacks is left out
    summary = multi_seed.aggregate(per_seed)
    assert set(summary) == {"accuracy", "loss", "f1"}
    for name, column in (("accuracy", values[:, 0]), ("loss", values[:, 1]),
                         ("f1", values[:, 2] * 100)):
        stats = summary[name]
        assert stats["n"] == 5
        assert stats["mean"] == pytest.approx(np.mean(column), rel=1e-12)
        assert stats["std"] == pytest.approx(np.std(column, ddof=1), rel=1e-12)  # sample std
        assert stats["std"] != pytest.approx(np.std(column, ddof=0), rel=1e-6)
        assert stats["min"] == np.min(column) and stats["max"] == np.max(column)


def test_aggregate_of_one_seed_has_no_standard_deviation():
    summary = multi_seed.aggregate({4: {"accuracy": 0.75}})
    assert summary == {"accuracy": {"mean": 0.75, "std": None, "min": 0.75, "max": 0.75, "n": 1}}
    assert multi_seed.aggregate({}) == {}


def test_format_metric():
    line = multi_seed.format_metric
    assert line("accuracy", {"mean": 0.8353, "std": 0.0041, "n": 3}) == \
        "accuracy 0.835 ± 0.004 (3 seeds)"
    # A spread that three decimals would show as 0.000 gets the digits it needs.
    assert line("accuracy", {"mean": 0.83531, "std": 0.00042, "n": 2}) == \
        "accuracy 0.8353 ± 0.0004 (2 seeds)"
    assert line("f1", {"mean": 44.5, "std": 1.25, "n": 5}) == "f1 44.500 ± 1.250 (5 seeds)"
    assert line("loss", {"mean": 0.5, "std": 0.0, "n": 2}) == "loss 0.500 ± 0.000 (2 seeds)"
    assert line("loss", {"mean": 0.5, "std": None, "n": 1}) == "loss 0.500 (1 seed)"


def test_results_file_holds_each_seed_and_the_summary(tmp_path):
    records = {s: {"step": 5, "checkpoint": f"ckpt-{s}", "eval_file": "dev.tsv",
                   "metrics": {"accuracy": a, "num_examples": 50.0}}
               for s, a in ((2, 0.7), (1, 0.8), (3, 0.9))}
    path, summary = multi_seed.write_results(str(tmp_path), records, task="sst2",
                                             family="classification")
    assert os.listdir(tmp_path) == ["eval_results.json"]  # the temporary was renamed
    written = json.loads(open(path, encoding="utf-8").read())
    assert written["seeds"] == [1, 2, 3] and written["task"] == "sst2"
    assert written["std"].startswith("sample standard deviation")
    assert [r["seed"] for r in written["runs"]] == [1, 2, 3]
    assert written["runs"][0] == {"seed": 1, **multi_seed.derived_seeds(1), "model_dir": "seed-1",
                                  "step": 5, "checkpoint": "ckpt-1",
                                  "metrics": {"accuracy": 0.8, "num_examples": 50.0}}
    assert written["metrics"] == summary
    assert summary["accuracy"]["mean"] == pytest.approx(0.8)
    assert summary["accuracy"]["std"] == pytest.approx(np.std([0.7, 0.8, 0.9], ddof=1))
    assert summary["num_examples"]["std"] == 0.0


def test_a_full_disk_keeps_the_previous_results(tmp_path, monkeypatch):
    records = {1: {"step": 5, "metrics": {"accuracy": 0.5}},
               2: {"step": 5, "metrics": {"accuracy": 0.7}}}
    path, _ = multi_seed.write_results(str(tmp_path), records, task="sst2", family=None)
    before = open(path, encoding="utf-8").read()

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(UserError) as raised:
        multi_seed.write_results(str(tmp_path), {1: records[1]}, task="sst2", family=None)
    assert str(raised.value).startswith(
        f"writing the multi-seed evaluation results to {path} failed: no space left on the "
        "device")
    assert "\n" not in str(raised.value)
    assert os.listdir(tmp_path) == ["eval_results.json"]  # the temporary is gone
    assert open(path, encoding="utf-8").read() == before


# -- the seeds -------------------------------------------------------------------------------

def test_parse_seeds():
    assert multi_seed.parse_seeds(None, None) is None
    assert multi_seed.parse_seeds(["3", " 1", "0"], None) == [3, 1, 0]
    assert multi_seed.parse_seeds(None, 3) == [1, 2, 3]


@pytest.mark.parametrize("seeds, num_seeds, message", [
    (["1", "-2"], None, "--seeds=1,-2: '-2' is not a seed; give integers >= 0"),
    (["1", "x"], None, "--seeds=1,x: 'x' is not a seed"),
    (["1", "", "2"], None, "--seeds=1,,2: '' is not a seed"),
    (["1", "2", "1"], None, "--seeds=1,2,1 lists 1 twice; each seed runs once"),
    ([], None, "--seeds is empty"),
    (["1"], 2, "--seeds and --num_seeds are exclusive"),
    (None, 0, "--num_seeds=0 must be >= 1"),
    (None, -3, "--num_seeds=-3 must be >= 1"),
])
def test_bad_seeds_are_one_line(seeds, num_seeds, message):
    with pytest.raises(UserError) as raised:
        multi_seed.parse_seeds(seeds, num_seeds)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_each_seed_gives_two_distinct_streams():
    derived = {s: multi_seed.derived_seeds(s) for s in range(200)}
    streams = [v for d in derived.values() for v in (d["init_seed"], d["data_seed"])]
    assert len(set(streams)) == len(streams)  # no stream is shared, within or across seeds
    assert all(0 <= v < 2**32 for v in streams)
    assert derived[1] == multi_seed.derived_seeds(1)  # repeatable: a resumed seed gets them back
    assert derived[1]["init_seed"] == int(np.random.SeedSequence([1, 0]).generate_state(1)[0])
    assert multi_seed.gin_bindings(1) == [f"TrainerConfig.seed = {derived[1]['init_seed']}",
                                          f"FinetuneConfig.seed = {derived[1]['data_seed']}"]


def test_a_seed_is_finished_only_at_the_final_step(tmp_path):
    directory = tmp_path / "seed-2"
    directory.mkdir()
    assert multi_seed.finished_results(str(tmp_path), 2, 10) is None
    (directory / "eval_results.json").write_text("{not json")
    assert multi_seed.finished_results(str(tmp_path), 2, 10) is None
    record = {"step": 10, "metrics": {"accuracy": 0.5}}
    (directory / "eval_results.json").write_text(json.dumps(record))
    assert multi_seed.finished_results(str(tmp_path), 2, 10) == record
    assert multi_seed.finished_results(str(tmp_path), 2, 12) is None  # e.g. a longer rerun
    # `evaluate --eval_file=test.tsv` on the seed's directory: not the run's evaluation.
    record["eval_file"] = str(tmp_path / "dev.tsv")
    (directory / "eval_results.json").write_text(json.dumps(record))
    assert multi_seed.finished_results(str(tmp_path), 2, 10) is None
    assert multi_seed.finished_results(str(tmp_path), 2, 10, str(tmp_path / "test.tsv")) is None
    assert multi_seed.finished_results(str(tmp_path), 2, 10, str(tmp_path / "dev.tsv")) == record


# -- whose directory -------------------------------------------------------------------------

CONFIG = {"task": "sst2", "flag_bindings": ["OptimizerConfig.learning_rate = 0.001"]}


def test_a_multi_seed_directory_belongs_to_one_run(tmp_path):
    parent = str(tmp_path / "runs")
    assert multi_seed.check_multi_seed_dir(parent, CONFIG) is None  # new: fine
    os.makedirs(parent)
    multi_seed.write_manifest(parent, CONFIG, [1, 2], None)
    manifest = multi_seed.check_multi_seed_dir(parent, CONFIG)
    assert sorted(manifest["seeds"]) == ["1", "2"]
    assert manifest["seeds"]["2"] == multi_seed.derived_seeds(2)
    multi_seed.write_manifest(parent, CONFIG, [3], manifest)  # more seeds: the union is kept
    assert sorted(multi_seed.read_manifest(parent)["seeds"]) == ["1", "2", "3"]
    other = {**CONFIG, "flag_bindings": ["OptimizerConfig.learning_rate = 0.01"]}
    with pytest.raises(UserError, match=re.escape(
            f"--model_dir={parent} is a multi-seed run with flag_bindings=['OptimizerConfig."
            "learning_rate = 0.001']; this run asks for flag_bindings=['OptimizerConfig."
            "learning_rate = 0.01']; the seeds of one run share one configuration")):
        multi_seed.check_multi_seed_dir(parent, other)
    # A single-seed run may not use the parent, nor one of its seeds' directories.
    with pytest.raises(UserError, match=re.escape(
            f"--model_dir={parent} holds a multi-seed run; resume it with --seeds=1,2,3")):
        multi_seed.check_single_run_dir(parent)
    with pytest.raises(UserError, match=re.escape(
            f"--model_dir={parent}/seed-2 is seed 2 of the multi-seed run in {parent}; resume "
            f"it with --seeds=2 --model_dir={parent}")):
        multi_seed.check_single_run_dir(os.path.join(parent, "seed-2"))
    multi_seed.check_single_run_dir(str(tmp_path / "elsewhere"))  # no error


def test_a_single_run_directory_is_no_multi_seed_parent(tmp_path):
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-4"\n')
    with pytest.raises(UserError, match=re.escape(
            f"--model_dir={tmp_path} holds a single-seed finetune run (bert_train.json, "
            "checkpoints); a multi-seed run needs its own --model_dir")):
        multi_seed.check_multi_seed_dir(str(tmp_path), CONFIG)


def test_readers_of_one_model_name_a_seed_directory(tmp_path):
    multi_seed.write_manifest(str(tmp_path), CONFIG, [4, 2], None)
    expected = (f"--model_dir={tmp_path} holds a multi-seed run (seeds 2, 4); pass one seed's "
                f"model directory, e.g. --model_dir={tmp_path}/seed-2 (all seeds' metrics: "
                f"{tmp_path}/eval_results.json)")
    # evaluate, export and predict all read the model through read_model_info.
    with pytest.raises(UserError) as raised:
        model_dir_lib.read_model_info(str(tmp_path))
    assert str(raised.value) == expected


# -- the command -----------------------------------------------------------------------------

def _finetune_args(pretrained: dict, model_dir, *extra) -> list[str]:
    return ["finetune", "--task=sst2", f"--train_file={shared_file('sst2/train.tsv')}",
            f"--eval_file={shared_file('sst2/dev.tsv')}", "--max_train_examples=64",
            "--max_eval_examples=40", "--seq_length=32", "--batch_size=16", "--train_steps=3",
            "--learning_rate=1e-3", f"--init_checkpoint={pretrained['dir']}",
            f"--model_dir={model_dir}", *extra]


def finetune_here(capsys, *args) -> subprocess.CompletedProcess:
    """`bert-train finetune ARGS` through the CLI's runner in this process: a subprocess would
    import TensorFlow and trace the model again for the same checks."""
    capsys.readouterr()
    rc = run_in_process(*args)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, rc, out, err)


SUMMARY_LINE = re.compile(r"^  (\w+) (-?\d+\.\d+) ± (\d+\.\d+) \(2 seeds\)$", re.M)


@pytest.mark.slow
def test_two_seeds_in_one_process_then_resume(tiny_pretrained, tmp_path, capsys):
    parent = tmp_path / "runs"
    proc = finetune_here(capsys, *_finetune_args(tiny_pretrained, parent, "--seeds=1,2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((parent / "eval_results.json").read_text())
    assert results["seeds"] == [1, 2] and results["task"] == "sst2"
    seeds = {}
    for seed in (1, 2):
        directory = parent / f"seed-{seed}"
        seeds[seed] = json.loads((directory / "eval_results.json").read_text())
        assert seeds[seed]["step"] == 3 and seeds[seed]["checkpoint"].endswith("ckpt-3")
        assert (directory / "bert_train.json").is_file()
        assert not (directory / ".bert_train.lock").exists()
        operative = (directory / "operative_config.gin").read_text()
        for binding in multi_seed.gin_bindings(seed):
            assert binding in operative, binding
    assert [r["metrics"] for r in results["runs"]] == [seeds[1]["metrics"], seeds[2]["metrics"]]
    # The seeds differ (head initialization, dropout, data order), so do their results.
    assert seeds[1]["metrics"]["loss"] != pytest.approx(seeds[2]["metrics"]["loss"], rel=1e-4)
    for name, stats in results["metrics"].items():
        values = [seeds[1]["metrics"][name], seeds[2]["metrics"][name]]
        assert stats["mean"] == pytest.approx(np.mean(values), rel=1e-9)
        assert stats["std"] == pytest.approx(np.std(values, ddof=1), rel=1e-9, abs=1e-12)
        assert (stats["min"], stats["max"]) == (min(values), max(values))
    printed = {m[0]: (float(m[1]), float(m[2])) for m in SUMMARY_LINE.findall(proc.stdout)}
    # Counts (num_examples, num_windows) are not printed; long texts are windowed, so the
    # windows' own accuracy is.
    assert set(printed) == {"accuracy", "loss", "window_accuracy"}, proc.stdout
    assert printed["loss"][0] == pytest.approx(results["metrics"]["loss"]["mean"], abs=1e-3)
    assert not (parent / "bert_train.json").exists()

    # Evaluate/export/predict read one model: the parent is refused, naming a seed directory.
    line = error_line(capsys, "evaluate", f"--model_dir={parent}",
                      f"--eval_file={shared_file('sst2/dev.tsv')}")
    assert f"pass one seed's model directory, e.g. --model_dir={parent}/seed-1" in line
    # A single-seed run in the parent, or one with other flags, is refused; nothing changes.
    before = tree_digest(str(parent))
    line = error_line(capsys, *_finetune_args(tiny_pretrained, parent))
    assert line.endswith(f"--model_dir={parent} holds a multi-seed run; resume it with "
                         "--seeds=1,2, or choose another --model_dir")
    line = error_line(capsys, *_finetune_args(tiny_pretrained, parent, "--seeds=1,2",
                                              "--learning_rate=1e-2"))
    assert "is a multi-seed run with flag_bindings=" in line and "learning_rate = 0.01" in line
    assert tree_digest(str(parent)) == before

    # A rerun skips the finished seed 1 and runs seed 2 again, alone in its process: it ends
    # where it ended after seed 1 in one process (nothing leaked from one seed to the next).
    seed1 = tree_digest(str(parent / "seed-1"))
    shutil.rmtree(parent / "seed-2")
    proc = run_cli(*_finetune_args(tiny_pretrained, parent, "--seeds=1,2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "seed 1: finished at step 3, skipped" in proc.stdout
    assert "seed 2: step 3" in proc.stdout and "seed 1: step" not in proc.stdout
    assert tree_digest(str(parent / "seed-1")) == seed1
    again = json.loads((parent / "seed-2" / "eval_results.json").read_text())
    assert again["metrics"] == pytest.approx(seeds[2]["metrics"], rel=1e-5, abs=1e-6)
    summary = json.loads((parent / "eval_results.json").read_text())["metrics"]
    assert summary.keys() == results["metrics"].keys()
    for name, stats in summary.items():
        assert stats == pytest.approx(results["metrics"][name], rel=1e-5, abs=1e-6), name


@pytest.mark.slow
def test_a_half_done_seed_resumes_from_its_checkpoint(tiny_pretrained, tmp_path, capsys):
    parent = tmp_path / "runs"
    proc = finetune_here(capsys, *_finetune_args(tiny_pretrained, parent, "--num_seeds=1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "accuracy" in proc.stdout and "(1 seed)" in proc.stdout
    first = json.loads((parent / "seed-1" / "eval_results.json").read_text())
    # Trained to the end but not evaluated (killed just before): the rerun restores ckpt-3,
    # trains no step and evaluates.
    (parent / "seed-1" / "eval_results.json").unlink()
    proc = finetune_here(capsys, *_finetune_args(tiny_pretrained, parent, "--num_seeds=1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "seed 1: step 3" in proc.stdout and "warm start" not in proc.stdout
    again = json.loads((parent / "seed-1" / "eval_results.json").read_text())
    assert again["checkpoint"] == first["checkpoint"]
    assert again["metrics"] == pytest.approx(first["metrics"], rel=1e-5, abs=1e-6)
