"""`bert-train pretrain --time_budget`: a real run stops on time and records what the budget
bought (bert_train.json, the summary line, the operative config); a bad value is refused in
one line before anything is written."""

import json
import os
import re
import subprocess
import sys

import pytest
from absl import flags

from bert_trainer import cli
from bert_trainer.errors import EXIT_USER_ERROR


@pytest.mark.slow
def test_a_budget_run_stops_on_time_and_records_what_it_bought(pretraining_data, tmp_path):
    model_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "bert_trainer.cli", "pretrain", "--gin_file=configs/smoke.gin",
            f"--model_dir={model_dir}", "--time_budget=10s",
            f"--gin_param=build_encoder.vocab_size = {pretraining_data['vocab_size']}",
            "--gin_param=TrainerConfig.train_steps = 2",  # shapes the schedule, stops nothing
            f"--train_data={pretraining_data['train']}",
            f"--vocab_file={pretraining_data['vocab_file']}"]
    proc = subprocess.run(argv, cwd=tmp_path, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((model_dir / "bert_train.json").read_text())["time_budget"]
    assert record["seconds"] == 10.0 and record["budget"] == "10s"
    # The first step traces the model (seconds on a busy machine): a budget is never shorter.
    assert 9.9 <= record["elapsed_seconds"] <= 40
    steps = record["steps"]
    assert steps > 2 and (model_dir / f"ckpt-{steps}.index").exists()  # saved at the end
    last = proc.stdout.strip().splitlines()[-1]
    assert re.match(rf"bert-train pretrain: step {steps} \| time budget 10s: {steps} steps in "
                    rf"{record['elapsed_seconds']:.0f} s \| train loss ", last), last
    assert re.search(r"step +\d+ \(\d+% of the time budget\) \| loss ", proc.stderr)
    assert "TrainerConfig.time_budget = 10.0" in (model_dir / "operative_config.gin").read_text()


@pytest.mark.parametrize("value", ["20 minutes", "0", "-1m", "1.5d"])
def test_a_bad_time_budget_is_refused_in_one_line(value, capfd, tmp_path):
    flags.FLAGS.unparse_flags()
    code = cli.main(["bert-train", "pretrain", "--gin_file=configs/smoke.gin",
                     f"--model_dir={tmp_path / 'run'}", f"--time_budget={value}"])
    err = capfd.readouterr().err.strip()
    assert code == EXIT_USER_ERROR
    assert err == (f"bert-train pretrain: error: --time_budget={value!r} is not a duration > 0; "
                   "give seconds or a number and a unit, e.g. 90s, 20m or 1.5h")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_causal_lm_trains_for_its_budget(pretraining_data, tmp_path, capfd):
    """The causal objective runs on the same trainer: its budget, schedule and record."""
    from conftest import SHARED  # noqa: PLC0415
    from summary_testing import read_scalars  # noqa: PLC0415

    corpus = SHARED / "data" / "corpus" / "inaugural" / "18*.txt"
    blocks = str(tmp_path / "blocks" / "train-*.tfrecord")
    flags.FLAGS.unparse_flags()
    assert cli.main(["bert-train", "create_pretraining_data", "--objective=causal_lm",
                     "--block_size=32", f"--input={corpus}", f"--output={blocks}",
                     f"--vocab={pretraining_data['vocab_file']}", "--seed=5"]) == 0
    model_dir = tmp_path / "gpt"
    flags.FLAGS.unparse_flags()
    code = cli.main(["bert-train", "pretrain", "--gin_file=configs/causal_lm/tiny.gin",
                     f"--model_dir={model_dir}", f"--train_data={blocks}", "--time_budget=8",
                     f"--vocab_file={pretraining_data['vocab_file']}",
                     f"--gin_param=build_causal_lm.vocab_size = {pretraining_data['vocab_size']}",
                     "--gin_param=build_causal_lm.hidden_size = 32",
                     "--gin_param=build_causal_lm.max_sequence_length = 32",
                     "--gin_param=CausalLMConfig.block_size = 32",
                     "--gin_param=TrainerConfig.summary_interval = 2"])
    out = capfd.readouterr().out
    assert code == 0, out[-2000:]
    record = json.loads((model_dir / "bert_train.json").read_text())["time_budget"]
    assert record["budget"] == "8s" and 7.9 <= record["elapsed_seconds"] <= 40
    assert f"time budget 8s: {record['steps']} steps in " in out
    # The rate decays to ~0 as the budget ends (its 10 % of warmup went to the first step's
    # tracing here): the last one is a step or two's share of the budget above 0.
    rates = read_scalars(model_dir / "train")["learning_rate"]
    last = rates[max(rates)]
    assert last == min(rates.values()) and last <= 8.0 * max(rates.values()) / record["steps"]
