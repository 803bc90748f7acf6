"""`bert-train pretrain` with the causal objective, end to end through the CLI: blocks from
create_pretraining_data --objective=causal_lm, a tiny CausalLM trained with evaluation, and a
run killed with SIGKILL that resumes to the same weights as a run never stopped.

The killed run is a real `python -m bert_trainer.cli` process; the other commands run through
tests/cli_host.py's `bert-train` (the CLI's entry point, its exit code and output, in one host
process that imports TensorFlow once)."""

import contextlib
import io
import json
import random
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from conftest import SHARED
from robust_testing import checkpoint_steps, subprocess_env, wait_for

TIMEOUT = 600  # seconds; a busy 2-core machine imports TensorFlow slowly
BLOCK = 32


@pytest.fixture(scope="module")
def causal_data(pretraining_data, tmp_path_factory):
    """Blocks of 32 tokens made through the CLI: train from the 1800s inaugural addresses (2
    shards), eval from 1901-1929, with the 800-word vocabulary of `pretraining_data`.

    The command runs through the CLI's entry point (`cli.main`) in this process, what it prints
    captured: two subprocesses would only import TensorFlow twice more."""
    from bert_trainer import cli  # noqa: PLC0415

    root = tmp_path_factory.mktemp("causal_data")
    corpus = SHARED / "data" / "corpus" / "inaugural"  # pretraining_data skips without it
    made = {}
    for name, files, shards in (("train", "18*.txt", 2), ("eval", "19[0-2]*.txt", 1)):
        pattern = str(root / name / "blocks-*.tfrecord")
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(["bert-train", "create_pretraining_data", "--objective=causal_lm",
                           f"--block_size={BLOCK}", f"--input={corpus / files}",
                           f"--vocab={pretraining_data['vocab_file']}", f"--output={pattern}",
                           f"--num_shards={shards}", "--seed=5"])
        proc = subprocess.CompletedProcess(name, rc, out.getvalue(), err.getvalue())
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = json.loads((root / name / "blocks-summary.json").read_text())
        assert f"wrote {summary['examples']:,} blocks of {BLOCK} tokens" in proc.stdout
        assert summary["tokens"] == summary["examples"] * BLOCK
        assert summary["tokens"] + summary["tokens_dropped"] == (
            summary["corpus_tokens"] + summary["documents"])
        made[name] = pattern
    return {**made, "vocab_file": pretraining_data["vocab_file"],
            "vocab_size": pretraining_data["vocab_size"]}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """The `bert-train` commands a test does not kill run in one host process (tests/cli_host.py:
    the CLI's entry point with its real exit code and output, TensorFlow imported once)."""
    from cli_host import CliHost  # noqa: PLC0415

    served = CliHost(str(tmp_path_factory.mktemp("host")))
    yield served
    served.close()


def pretrain_argv(data, model_dir, *extra) -> list[str]:
    return [sys.executable, "-m", "bert_trainer.cli", "pretrain",
            "--gin_file=configs/causal_lm/tiny.gin", f"--model_dir={model_dir}",
            f"--train_data={data['train']}", f"--vocab_file={data['vocab_file']}",
            f"--gin_param=build_causal_lm.vocab_size = {data['vocab_size']}",
            "--gin_param=build_causal_lm.hidden_size = 32",
            f"--gin_param=build_causal_lm.max_sequence_length = {BLOCK}",
            f"--gin_param=CausalLMConfig.block_size = {BLOCK}", *extra]


def run(host, argv, cwd=None):
    """`argv` (a `python -m bert_trainer.cli` command line) as `bert-train` in the host."""
    assert argv[:3] == [sys.executable, "-m", "bert_trainer.cli"]
    return host.run(["bert-train", *argv[3:]], cwd=cwd, timeout=TIMEOUT)


@pytest.mark.slow
def test_tiny_causal_pretrain_with_eval(causal_data, host, tmp_path):
    model_dir = tmp_path / "run"
    proc = run(host, pretrain_argv(causal_data, model_dir, f"--eval_data={causal_data['eval']}",
                             "--gin_param=TrainerConfig.train_steps = 20",
                             "--gin_param=TrainerConfig.eval_interval = 10",
                             "--gin_param=TrainerConfig.eval_steps = 4"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"bert-train pretrain: step 20 \| train loss (\d+\.\d{4}) \| eval loss "
                         r"(\d+\.\d{4}), next_token_accuracy (0\.\d{4}), perplexity "
                         r"(\d+\.\d{4}) \| model_dir " + re.escape(str(model_dir)), last)
    assert match, last
    eval_loss, perplexity = float(match[2]), float(match[4])
    # A nearly untrained model: about as perplexed as the vocabulary is large. The eval loss is
    # a mean over blocks of equal token counts, so exp of it is the perplexity.
    assert 100 < perplexity < 3 * causal_data["vocab_size"]
    assert perplexity == pytest.approx(np.exp(eval_loss), rel=1e-3)
    info = json.loads((model_dir / "bert_train.json").read_text())
    assert info["encoder"]["class_name"] == "CausalLM"
    assert info["encoder"]["config"]["hidden_size"] == 32
    assert info["task"] == {"name": "causal_lm", "family": "causal_lm", "block_size": BLOCK}
    assert (model_dir / "vocab.txt").read_text() == open(causal_data["vocab_file"]).read()
    operative = (model_dir / "operative_config.gin").read_text()
    assert "pretraining_objective.name = 'causal_lm'" in operative
    assert "CausalLMConfig.block_size = 32" in operative and "PretrainingConfig" not in operative
    assert checkpoint_steps(model_dir) == [20]
    assert re.search(r"step 20/20 \| loss \d+\.\d+ \| .* steps/s", proc.stderr)
    tags = {v.tag for name in (model_dir / "train").iterdir()
            for e in tf.compat.v1.train.summary_iterator(str(name)) for v in e.summary.value}
    # Throughput: tokens counted from the blocks, model FLOPs from CausalLM.training_flops.
    assert {"loss", "perplexity", "next_token_accuracy", "tokens_per_second",
            "model_gflops_per_second"} <= tags, tags

    # A warm start from the run: its bert_train.json gives the model and the vocabulary.
    warm = tmp_path / "warm"
    argv = [a for a in pretrain_argv(causal_data, warm, f"--init_checkpoint={model_dir}",
                                     "--gin_param=TrainerConfig.train_steps = 1",
                                     "--gin_param=build_causal_lm.hidden_size = 64")
            if not a.startswith("--vocab_file")]
    proc = run(host, argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(rf"Initialized all \d+ model variables from {re.escape(str(model_dir))}\n",
                     proc.stderr), proc.stderr[-3000:]
    warm_info = json.loads((warm / "bert_train.json").read_text())
    assert warm_info["encoder"] == info["encoder"]  # hidden_size 32: the binding is ignored
    assert (warm / "vocab.txt").read_text() == (model_dir / "vocab.txt").read_text()


def model_variables(model_dir) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
            if k.startswith("model/")}


@pytest.mark.slow
def test_sigkill_then_resume_gives_the_same_weights(causal_data, host, tmp_path):
    # Dropout is on (tiny.gin's 0.1): the resumed run must draw the same masks and batches.
    steps = ["--gin_param=TrainerConfig.train_steps = 60",
             "--gin_param=TrainerConfig.steps_per_loop = 2",
             "--gin_param=TrainerConfig.checkpoint_interval = 4",
             "--gin_param=TrainerConfig.summary_interval = 4"]
    killed, straight = tmp_path / "killed", tmp_path / "straight"
    log = open(tmp_path / "log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(pretrain_argv(causal_data, killed, *steps), stdout=log,
                            stderr=subprocess.STDOUT, env=subprocess_env())
    try:
        wait_for(lambda: checkpoint_steps(killed), TIMEOUT, "the first checkpoint")
        time.sleep(random.uniform(0.0, 0.5))
        proc.kill()  # SIGKILL: nothing runs after it
        assert proc.wait(TIMEOUT) == -signal.SIGKILL
    finally:
        proc.kill()
        log.close()
    assert checkpoint_steps(killed)[-1] < 60, (tmp_path / "log").read_text()[-3000:]
    resumed = run(host, pretrain_argv(causal_data, killed, *steps))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # The latest complete checkpoint (one the kill cut short is passed over).
    match = re.search(rf"Resuming at step (\d+) from {re.escape(str(killed))}/ckpt-(\d+)",
                      resumed.stderr)
    assert match and match[1] == match[2], resumed.stderr[-3000:]
    killed_after = int(match[1])
    assert 4 <= killed_after < 60
    full = run(host, pretrain_argv(causal_data, straight, *steps))
    assert full.returncode == 0, full.stderr[-3000:]
    ours, theirs = model_variables(killed), model_variables(straight)
    assert sorted(ours) == sorted(theirs) and len(ours) > 10
    difference = max(float(np.max(np.abs(ours[k] - theirs[k]))) for k in ours)
    print(f"SIGKILL after checkpoint {killed_after}: max |dw| after resume = {difference:.3g}")
    # Float32 round-off of multi-threaded kernels across processes stays ~1e-6; one Adam step
    # at the peak rate of 1e-3 moves a weight ~1e-3, so another batch or dropout mask after
    # the resume would show as >= 1e-4.
    assert difference <= 1e-5
