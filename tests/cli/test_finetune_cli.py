"""`bert-train finetune` and `bert-train evaluate` as a user runs them: exit codes, one-line
errors, and the files a run leaves in its model directory.

The full run is a real subprocess. The error cases run the same command runner in this process
(`commands.run_command`, which the CLI calls): importing TensorFlow again in a subprocess per
error would cost most of this file's time on a busy machine.
"""

import json

import pytest
from finetune_testing import error_line, run_cli, run_in_process, shared_file, write_tiny_hf


@pytest.mark.slow
def test_finetune_then_evaluate(tiny_pretrained, tmp_path):
    model_dir = tmp_path / "sst2"
    eval_args = [f"--eval_file={shared_file('sst2/dev.tsv')}", "--max_eval_examples=50"]
    proc = run_cli("finetune", "--task=sst2", f"--train_file={shared_file('sst2/train.tsv')}",
                   *eval_args, "--max_train_examples=64", "--seq_length=32", "--batch_size=16",
                   "--train_steps=4", f"--init_checkpoint={tiny_pretrained['dir']}",
                   f"--model_dir={model_dir}")
    assert proc.returncode == 0, proc.stderr
    num_encoder = len(tiny_pretrained["encoder_weights"])
    assert (f"loaded {num_encoder} encoder variables; left initialized: "
            "classifier/logits/kernel, classifier/logits/bias") in proc.stdout
    trained = json.loads((model_dir / "eval_results.json").read_text())
    assert trained["task"] == "sst2" and trained["step"] == 4
    assert trained["checkpoint"].endswith("ckpt-4")
    # Long texts are windowed by default: accuracy is per text, window_accuracy per window.
    assert set(trained["metrics"]) == {"accuracy", "loss", "num_examples", "num_windows",
                                       "window_accuracy", "cut_texts"}
    assert trained["metrics"]["num_examples"] == 50
    assert trained["metrics"]["num_windows"] >= 50
    info = json.loads((model_dir / "bert_train.json").read_text())
    assert info["task"]["label_names"] == ["negative", "positive"]
    assert info["task"]["windows"] == {"long_texts": "windows", "doc_stride": None,
                                       "window_pooling": "mean"}
    assert info["task"]["seq_length"] == 32 and info["vocab_file"] == "vocab.txt"
    operative = (model_dir / "operative_config.gin").read_text()
    for binding in ("FinetuneConfig.seq_length = 32", "TrainerConfig.train_steps = 4",
                    "OptimizerConfig.learning_rate = 2e-05", "TrainerConfig.best_metric = "
                    "'accuracy'", "OptimizerConfig.warmup_steps = 0"):
        assert binding in operative, binding

    # The best checkpoint is the final one (one evaluation): the same 50 examples score the same.
    proc = run_cli("evaluate", f"--model_dir={model_dir}", *eval_args, "--checkpoint=best")
    assert proc.returncode == 0, proc.stderr
    assert "accuracy" in proc.stdout and "task sst2" in proc.stdout
    # evaluate's own file: the run's eval_results.json stays the run's record.
    evaluated = json.loads((model_dir / "eval_results-best-ckpt-4.json").read_text())
    assert evaluated["checkpoint"] == str(model_dir / "best" / "ckpt-4")
    assert json.loads((model_dir / "eval_results.json").read_text()) == trained
    # Another process: float32 rounding, not bits (rel 1e-5).
    assert evaluated["metrics"] == pytest.approx(trained["metrics"], rel=1e-5, abs=1e-6)


def test_unknown_task_lists_the_known_tasks(capsys, tmp_path):
    line = error_line(capsys, "finetune", "--task=sst-2", f"--model_dir={tmp_path}")
    assert line.startswith("bert-train finetune: error: unknown task 'sst-2'; choose one of: "
                           "classification, cola, conll2003, imdb, mnli, mrpc, qnli, qqp, "
                           "regression, rte, squad, squad_v2, sst2, stsb, tagging, "
                           "ted_hrlr_translate/pt_to_en, translate, wmt14_translate/de-en, wnli")


def test_missing_init_checkpoint_is_one_line(capsys, tmp_path):
    line = error_line(capsys, "finetune", "--task=sst2",
                      f"--train_file={shared_file('sst2/dev.tsv')}",
                      f"--init_checkpoint={tmp_path / 'nowhere'}",
                      f"--model_dir={tmp_path / 'run'}")
    assert line == (
        f"bert-train finetune: error: --init_checkpoint={tmp_path / 'nowhere'} does not exist; "
        "pass a bert-train model directory (or a Hugging Face / Google BERT directory)")
    assert not (tmp_path / "run").exists()


def test_bad_column_names_the_file_and_its_columns(capsys, tiny_pretrained, tmp_path):
    reviews = tmp_path / "reviews.tsv"
    reviews.write_text("review\tstars\ngreat fun\t5\ndull\t1\n", encoding="utf-8")
    line = error_line(capsys, "finetune", "--task=classification", f"--train_file={reviews}",
                      "--label_column=stars", f"--init_checkpoint={tiny_pretrained['dir']}",
                      f"--model_dir={tmp_path / 'run'}")
    assert line == (
        f"bert-train finetune: error: {reviews}:1: header has no column 'text' (it has "
        "['review', 'stars']); fix the column mapping")


def test_epochs_and_steps_are_mutually_exclusive(capsys, tmp_path):
    line = error_line(capsys, "finetune", "--task=sst2", "--num_epochs=2", "--train_steps=10",
                      f"--model_dir={tmp_path}")
    assert "num_epochs" in line and "train_steps" in line


def test_evaluate_needs_a_finetuned_model_dir(capsys, tmp_path):
    line = error_line(capsys, "evaluate", f"--model_dir={tmp_path / 'none'}")
    assert line == (f"bert-train evaluate: error: --model_dir={tmp_path / 'none'} does not "
                    "exist; pass the --model_dir of a finetune run")


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
def test_finetune_from_a_hugging_face_directory_then_resume(capsys, tiny_pretrained, tmp_path):
    """The command itself loads an HF directory (the trainer reads TF checkpoints only), on a
    fresh run only: the second run resumes from its own checkpoint and loads nothing."""
    hf_dir = write_tiny_hf(tiny_pretrained, tmp_path / "hf")
    args = ["--task=sst2", f"--train_file={shared_file('sst2/dev.tsv')}",
            f"--eval_file={shared_file('sst2/dev.tsv')}", "--max_train_examples=32",
            "--max_eval_examples=16", "--seq_length=16", "--batch_size=8",
            f"--init_checkpoint={hf_dir}", f"--model_dir={tmp_path / 'run'}"]
    assert run_in_process("finetune", *args, "--train_steps=2") == 0
    out = capsys.readouterr().out
    assert f"warm start from {hf_dir}: loaded {len(tiny_pretrained['encoder_weights'])}" in out
    assert "finetune: step 2 |" in out
    info = json.loads((tmp_path / "run" / "bert_train.json").read_text())
    assert info["encoder"]["config"]["hidden_size"] == 32  # Read from the HF config.json.

    assert run_in_process("finetune", *args, "--train_steps=3") == 0
    out = capsys.readouterr().out
    assert "warm start" not in out and "finetune: step 3 |" in out
    results = json.loads((tmp_path / "run" / "eval_results.json").read_text())
    assert results["step"] == 3 and results["metrics"]["num_examples"] == 16
