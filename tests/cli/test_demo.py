"""`make demo`'s driver, end to end in its quick form (a corpus slice, 20 steps), and a rerun.

Each stage is a real `bert-train` command in a process of its own, so this is one of the
slowest test files of the suite on purpose: it is the one that proves the product's commands
work together. The first run goes through the demo's own runner (scripts/demo_runner.py, which
also times each command); the rerun runs each command through tests/cli_host.py's `bert-train`
(DEMO_BERT_TRAIN): a real process with the command's exit code and output, served by a host
that imported TensorFlow once instead of once per stage group.
"""

import json
import math
import os
import subprocess
import sys

import pytest
from conftest import REPO

# The demo script end to end, in subprocesses.
pytestmark = pytest.mark.slow

DEMO = os.path.join(REPO, "scripts", "demo.py")
COMMANDS = ("vocab", "create_pretraining_data", "pretrain --gin_file=configs/demo.gin",
            "finetune --task=classification", "evaluate", "export", "predict")


def _demo(*args, cwd, host=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if host is not None:
        env = dict(host.env(env), DEMO_BERT_TRAIN=os.path.join(host.bin_dir, "bert-train"))
    return subprocess.run([sys.executable, DEMO, *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=900)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("demo")
    run = _demo("--quick", "--workdir=runs/demo", cwd=cwd)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return cwd, run


def _summary(cwd):
    with open(cwd / "runs" / "demo" / "summary.json", encoding="utf-8") as f:
        return json.load(f)


def test_every_command_is_printed_before_it_runs(quick_run):
    _, run = quick_run
    for command in COMMANDS:
        assert f"$ bert-train {command}" in run.stdout, command
    assert "tensorboard --logdir runs/demo" in run.stdout
    assert "majority baseline" in run.stdout


def test_summary_reports_steps_losses_and_the_dev_metric(quick_run):
    cwd, _ = quick_run
    summary = _summary(cwd)
    assert summary["pretrain"]["steps"] == 20 and summary["finetune"]["steps"] == 20
    assert summary["finetune_scratch"]["steps"] == 20  # the same steps from random weights
    for run, tag in (("pretrain", "mlm_loss"), ("finetune", "loss"),
                     ("finetune_scratch", "loss")):
        losses = summary[run]["train"][tag]
        assert math.isfinite(losses["first"]) and math.isfinite(losses["last"]), (run, tag)
        assert losses["first_step"] < losses["last_step"] == 20
    dev = summary["dev"]
    assert isinstance(dev["accuracy"], float) and 0.0 <= dev["accuracy"] <= 1.0
    assert isinstance(dev["from_scratch_accuracy"], float)
    assert 0.0 <= dev["from_scratch_accuracy"] <= 1.0 and dev["from_scratch_step"] == 20
    assert dev["num_examples"] == 64  # QUICK.max_eval_examples
    assert 0.2 < dev["majority_baseline"] < 0.6
    assert dev["majority_label"] in summary["task"]["labels"]
    assert [s["stage"] for s in summary["stages"]] == [
        "corpus", "task", "vocab", "data_train", "data_eval", "pretrain", "finetune",
        "finetune_scratch", "evaluate", "export", "predict"]
    # demo_runner times each command inside its batch process: CPU seconds are its own.
    seconds = {s["stage"]: s for s in summary["stages"]}
    assert seconds["pretrain"]["cpu_seconds"] > 0 and seconds["pretrain"]["seconds"] > 0
    assert all(s["status"] == "ran" for s in summary["stages"])


def test_the_from_scratch_fine_tune_builds_the_pretrained_encoder(quick_run):
    """Only the weights differ: the same architecture (dropout aside: both fine-tunes set it)
    and the same fine-tuning recipe (step count, rate, batch, sequence length)."""
    cwd, run = quick_run
    workdir = cwd / "runs" / "demo"

    def info(name):
        with open(workdir / name / "bert_train.json", encoding="utf-8") as f:
            return json.load(f)

    def architecture(name):
        config = dict(info(name)["encoder"]["config"])
        for key in ("output_dropout", "attention_dropout", "name", "dtype"):
            config.pop(key)
        return config

    assert architecture("finetune_scratch") == architecture("pretrain")
    assert info("finetune_scratch")["encoder"]["config"]["output_dropout"] == 0.1
    assert info("finetune")["encoder"]["config"]["output_dropout"] == 0.1
    pretrained, scratch = (
        {k: v for k, v in info(n).get("run_settings", {}).items() if "init_checkpoint" not in k}
        for n in ("finetune", "finetune_scratch"))
    assert pretrained == scratch
    assert "from random weights" in run.stdout


def test_plot_and_predictions_are_written(quick_run):
    cwd, _ = quick_run
    workdir = cwd / "runs" / "demo"
    with open(workdir / "loss_curves.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    labels = set(_summary(cwd)["task"]["labels"])
    with open(workdir / "predictions.jsonl", encoding="utf-8") as f:
        answers = [json.loads(line) for line in f]
    assert len(answers) == 6
    for answer in answers:
        assert answer["label"] in labels
        assert sum(answer["probabilities"]) == pytest.approx(1.0, abs=1e-4)
    assert os.path.isfile(workdir / "export" / "saved_model.pb")


def test_a_rerun_reuses_the_data_and_resumes_training(quick_run, tmp_path):
    from cli_host import CliHost  # noqa: PLC0415

    cwd, _ = quick_run
    host = CliHost(str(tmp_path))
    try:
        run = _demo("--quick", "--workdir=runs/demo", cwd=cwd, host=host)
    finally:
        host.close()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for stage in ("corpus", "task", "vocab", "data_train", "data_eval"):
        assert f"== {stage}: reusing" in run.stdout
    assert "Resuming at step 20" in run.stdout
    assert _summary(cwd)["pretrain"]["steps"] == 20


def test_a_workdir_of_other_settings_is_refused_before_any_stage(quick_run):
    cwd, _ = quick_run
    run = _demo("--workdir=runs/demo", cwd=cwd)  # the full settings
    assert run.returncode == 1
    assert "was made with other demo settings" in run.stderr and "--clean" in run.stderr
    assert "== corpus" not in run.stdout
