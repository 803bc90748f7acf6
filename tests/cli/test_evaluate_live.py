"""`evaluate` beside a fine-tune that is still training: it records the checkpoint whose weights
it restored (the run's latest moves meanwhile, and old checkpoints are deleted) and writes its
own results file, never the run's eval_results.json.

The running job is simulated at the moment that matters: between evaluate choosing the
checkpoint and restoring it, the run's next checkpoint appears (copied from a run trained
further) or the chosen one is deleted (the run rotating its `max_checkpoints`)."""

import json
import shutil

import pytest
from finetune_testing import error_line, run_in_process, shared_file

from bert_trainer.training import checkpoint_eval


@pytest.fixture(scope="module")
def runs(tiny_pretrained, tmp_path_factory):
    """A fine-tune at step 2 ("run") and the same run trained on to step 4 ("ahead")."""
    root = tmp_path_factory.mktemp("live")
    args = ["--task=sst2", f"--train_file={shared_file('sst2/dev.tsv')}",
            f"--eval_file={shared_file('sst2/dev.tsv')}", "--max_eval_examples=8",
            "--seq_length=16", "--long_texts=truncate", "--batch_size=8",
            f"--init_checkpoint={tiny_pretrained['dir']}"]
    assert run_in_process("finetune", *args, "--train_steps=2", f"--model_dir={root}/run") == 0
    shutil.copytree(root / "run", root / "ahead")
    assert run_in_process("finetune", *args, "--train_steps=4", f"--model_dir={root}/ahead") == 0
    return root


@pytest.fixture
def live(runs, tmp_path, monkeypatch):
    """A copy of the step-2 run, and `during(fn)`: fn runs as evaluate builds its Trainer."""
    run = tmp_path / "run"
    shutil.copytree(runs / "run", run)
    real = checkpoint_eval.Trainer

    def during(fn):
        def trainer(*args, **kwargs):
            fn()
            return real(*args, **kwargs)
        monkeypatch.setattr(checkpoint_eval, "Trainer", trainer)

    def next_checkpoint():  # what the run's save of step 4 publishes
        for path in (runs / "ahead").glob("ckpt-4.*"):
            shutil.copy(path, run / path.name)
        shutil.copy(runs / "ahead" / "checkpoint", run / "checkpoint")

    return {"dir": run, "during": during, "next_checkpoint": next_checkpoint}


def evaluate(capsys, run, *args) -> str:
    capsys.readouterr()
    assert run_in_process("evaluate", f"--model_dir={run}", "--max_eval_examples=8",
                          f"--eval_file={shared_file('sst2/dev.tsv')}", *args) == 0
    return capsys.readouterr().out


@pytest.mark.slow  # two fine-tuning runs, then evaluations
def test_evaluate_records_the_checkpoint_it_restored_and_keeps_the_runs_results(live, capsys):
    run = live["dir"]
    own = (run / "eval_results.json").read_bytes()
    live["during"](live["next_checkpoint"])  # the latest moves from ckpt-2 to ckpt-4
    out = evaluate(capsys, run)
    assert f"checkpoint {run}/ckpt-4 (step 4)" in out
    recorded = json.loads((run / "eval_results-ckpt-4.json").read_text())
    assert (recorded["checkpoint"], recorded["step"]) == (f"{run}/ckpt-4", 4)
    assert (run / "eval_results.json").read_bytes() == own  # the run's own record
    # A checkpoint named by its step is the one evaluated, whatever the latest.
    out = evaluate(capsys, run, "--checkpoint=2")
    assert f"checkpoint {run}/ckpt-2 (step 2)" in out
    assert json.loads((run / "eval_results-ckpt-2.json").read_text())["step"] == 2


@pytest.mark.slow
def test_a_checkpoint_deleted_before_evaluate_reads_it_is_named(live, capsys):
    run = live["dir"]

    def rotate():  # the run saved ckpt-4 and deleted ckpt-2 (max_checkpoints)
        live["next_checkpoint"]()
        for path in run.glob("ckpt-2.*"):
            path.unlink()

    live["during"](rotate)
    line = error_line(capsys, "evaluate", f"--model_dir={run}", "--checkpoint=2",
                      f"--eval_file={shared_file('sst2/dev.tsv')}")
    assert line == (f"bert-train evaluate: error: {run}/ckpt-2 was deleted before evaluate "
                    f"could read it (the run writing {run} keeps only its newest checkpoints); "
                    "evaluate --checkpoint=latest, or a checkpoint it keeps")
    assert not list(run.glob("eval_results-*"))
