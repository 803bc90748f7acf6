"""Resumes through the commands: `pretrain` and `finetune` refuse a resume that changes what the
run was trained with (one line, nothing written), accept a longer run or another batch size,
and keep the run's operative_config.gin (`checkpoints/run_record.py`)."""

import pytest
from finetune_testing import error_line, run_in_process, shared_file
from robust_testing import tree_digest


@pytest.fixture(scope="module")
def pretrained_run(pretraining_data, tmp_path_factory):
    """`pretrain` of configs/smoke.gin (sequence 64) for 2 steps."""
    model_dir = tmp_path_factory.mktemp("resume") / "pretrain"
    args = ["--gin_file=configs/smoke.gin", f"--model_dir={model_dir}",
            f"--gin_param=build_encoder.vocab_size = {pretraining_data['vocab_size']}",
            f"--train_data={pretraining_data['train']}",
            f"--vocab_file={pretraining_data['vocab_file']}"]
    assert run_in_process("pretrain", *args, "--gin_param=TrainerConfig.train_steps = 2") == 0
    return {"dir": model_dir, "args": args}


@pytest.mark.slow  # a pretraining run
def test_a_pretraining_resume_with_another_seq_length_is_refused(pretrained_run, capsys):
    capsys.readouterr()
    model_dir = pretrained_run["dir"]
    before = tree_digest(model_dir)
    line = error_line(capsys, "pretrain", *pretrained_run["args"],
                      "--gin_param=TrainerConfig.train_steps = 4",
                      "--gin_param=PretrainingConfig.seq_length = 32")
    assert line == (f"bert-train pretrain: error: --model_dir={model_dir} was trained as task "
                    "'pretraining' with seq_length=64; this run asks for seq_length=32; use "
                    "another --model_dir (or the flags it was trained with)")
    line = error_line(capsys, "pretrain", *pretrained_run["args"],
                      "--gin_param=TrainerConfig.train_steps = 4",
                      "--gin_param=PretrainingConfig.masked_lm_prob = 0.3")
    assert "was trained with PretrainingConfig.masked_lm_prob=0.15; this run asks for " \
           "PretrainingConfig.masked_lm_prob=0.3" in line
    assert tree_digest(model_dir) == before  # bert_train.json and the operative config too


@pytest.mark.slow  # two fine-tuning runs
def test_a_finetune_resume_refuses_another_learning_rate_and_continues_another_batch(
        tiny_pretrained, tmp_path, capsys, caplog):
    model_dir = tmp_path / "run"
    args = ["--task=sst2", f"--train_file={shared_file('sst2/dev.tsv')}",
            f"--eval_file={shared_file('sst2/dev.tsv')}", "--max_eval_examples=8",
            "--seq_length=16", "--long_texts=truncate",
            f"--init_checkpoint={tiny_pretrained['dir']}", f"--model_dir={model_dir}"]
    assert run_in_process("finetune", *args, "--batch_size=8", "--train_steps=2") == 0
    capsys.readouterr()
    original = (model_dir / "operative_config.gin").read_text()
    before = tree_digest(model_dir)
    line = error_line(capsys, "finetune", *args, "--batch_size=8", "--train_steps=4",
                      "--learning_rate=0.5")
    assert "was trained with OptimizerConfig.learning_rate=" in line
    assert "this run asks for OptimizerConfig.learning_rate=0.5" in line
    assert tree_digest(model_dir) == before
    # A longer run (its warmup derived again) at batch 4: 2 x 8 = 16 examples done, so the
    # resumed input starts at example 17.
    assert run_in_process("finetune", *args, "--batch_size=4", "--train_steps=4") == 0
    assert "Batch size 4 (was 8): resuming at step 2 from example 17" in caplog.text
    assert (model_dir / "operative_config.gin").read_text() == original
    resumed = (model_dir / "operative_config-2.gin").read_text()
    assert "FinetuneConfig.train_batch_size = 4" in resumed
