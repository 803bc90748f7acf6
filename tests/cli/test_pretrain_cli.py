"""`bert-train pretrain`: a real tiny run from configs/smoke.gin, the operative config, and the
one-line errors of the shared command helpers (gin file:line, model_dir checks).

One end-to-end run goes through a subprocess (the real command line); the error cases call
`cli.main` in-process, which takes the same path without paying TensorFlow's start-up again.
"""

import os
import re
import subprocess
import sys

import gin
import pytest
from absl import flags

from bert_trainer import cli, configurables
from bert_trainer.commands import common
from bert_trainer.errors import EXIT_USER_ERROR, UserError
from bert_trainer.runs import gin_config
from bert_trainer.training import strategies

STEPS = 20


@pytest.fixture(scope="module")
def tiny_run(pretraining_data, tmp_path_factory):
    """`bert-train pretrain --gin_file=configs/smoke.gin` for 20 steps, run from another cwd."""
    model_dir = tmp_path_factory.mktemp("cli") / "run"
    argv = [sys.executable, "-m", "bert_trainer.cli", "pretrain",
            "--gin_file=configs/smoke.gin", f"--model_dir={model_dir}",
            f"--gin_param=build_encoder.vocab_size = {pretraining_data['vocab_size']}",
            f"--gin_param=TrainerConfig.train_steps = {STEPS}",
            f"--train_data={pretraining_data['train']}", f"--eval_data={pretraining_data['eval']}",
            f"--vocab_file={pretraining_data['vocab_file']}"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(argv, cwd=model_dir.parent, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"dir": model_dir, "stdout": proc.stdout, "stderr": proc.stderr}


@pytest.mark.slow
def test_tiny_run_prints_progress_and_a_one_line_summary(tiny_run):
    last = tiny_run["stdout"].strip().splitlines()[-1]
    assert re.fullmatch(rf"bert-train pretrain: step {STEPS} \| train loss \d+\.\d{{4}} \| eval "
                        r".*mlm_accuracy 0\.\d{4}.*nsp_accuracy [01]\.\d{4}.* \| model_dir "
                        + re.escape(str(tiny_run["dir"])), last), last
    assert re.search(rf"step {STEPS}/{STEPS} \| loss \d+\.\d+ \| .* steps/s", tiny_run["stderr"])
    assert "Path not found" not in tiny_run["stderr"]  # gin's include search is kept quiet
    assert sorted(p.name for p in tiny_run["dir"].glob("ckpt-*.index")) == [f"ckpt-{STEPS}.index"]


@pytest.mark.slow
def test_operative_config_reparses_to_the_same_run(tiny_run, pretraining_data):
    path = tiny_run["dir"] / "operative_config.gin"
    gin.parse_config_file(str(path))  # stands alone: no include, every value spelled out
    trainer_config = configurables.TrainerConfig()
    task_config = configurables.PretrainingConfig()
    assert trainer_config.train_steps == STEPS and trainer_config.eval_steps == 10
    assert task_config.train_data == pretraining_data["train"]
    assert task_config.eval_data == pretraining_data["eval"]
    assert task_config.seq_length == 64 and task_config.train_batch_size == 16
    assert configurables.OptimizerConfig().learning_rate == pytest.approx(1e-3)
    encoder = configurables.build_encoder()
    assert (encoder.hidden_size, encoder.num_layers) == (64, 2)
    assert encoder.vocab_size == pretraining_data["vocab_size"]


@pytest.mark.slow
def test_init_checkpoint_fixes_the_encoder_and_the_vocab(tiny_run, pretraining_data, tmp_path):
    from bert_trainer.runs import pretraining  # noqa: PLC0415

    gin_config.parse_gin(["configs/smoke.gin"], [
        "build_encoder.hidden_size = 999",  # ignored: the checkpoint decides
        f"build_encoder.vocab_size = {pretraining_data['vocab_size']}",
        f"TrainerConfig.init_checkpoint = '{tiny_run['dir'] / f'ckpt-{STEPS}'}'",
        f"PretrainingConfig.train_data = '{pretraining_data['train']}'"])
    # No flags are parsed: the library's run builder, with the settings' default strategy.
    trainer = pretraining.build_pretraining_run(pretraining.PretrainSettings(),
                                                str(tmp_path / "warm")).trainer
    task = trainer.task
    assert task.encoder_fn().hidden_size == 64
    assert task.checkpoint.format == "bert_train"
    assert task.config.vocab_file == str(tiny_run["dir"] / "vocab.txt")
    assert (trainer.config.eval_steps, trainer.config.eval_interval) == (0, None)  # no eval data
    # Derived values are passed as arguments and recorded, not bound into gin.
    assert trainer.derived_bindings == (
        f"PretrainingConfig.vocab_file = {str(tiny_run['dir'] / 'vocab.txt')!r}",
        "TrainerConfig.eval_steps = 0", "TrainerConfig.eval_interval = None")
    assert not gin_config.gin_is_bound("PretrainingConfig.vocab_file")
    assert gin.query_parameter("TrainerConfig.eval_steps") == 10  # smoke.gin's, as parsed


# ------------------------------------------------------------------------------- errors


def run_pretrain(capfd, *args):
    """Runs `bert-train pretrain ARGS` in-process; returns (exit code, stdout, stderr)."""
    flags.FLAGS.unparse_flags()  # no value leaks from an earlier in-process command
    code = cli.main(["bert-train", "pretrain", *args])
    out, err = capfd.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *fragments):
    assert code == EXIT_USER_ERROR
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bert-train pretrain: error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.slow
def test_a_model_dir_of_another_architecture_is_refused_untouched(tiny_run, pretraining_data,
                                                                  capfd):
    before = {p.name: p.stat().st_mtime_ns for p in tiny_run["dir"].iterdir()}
    code, _, err = run_pretrain(
        capfd, "--gin_file=configs/smoke.gin", f"--model_dir={tiny_run['dir']}",
        f"--gin_param=build_encoder.vocab_size = {pretraining_data['vocab_size']}",
        "--gin_param=build_encoder.hidden_size = 32", "--gin_param=build_encoder.inner_dim = 64",
        f"--train_data={pretraining_data['train']}",
        f"--vocab_file={pretraining_data['vocab_file']}")
    assert_one_line_error(code, err, "holds a checkpoint of another architecture")
    assert {p.name: p.stat().st_mtime_ns for p in tiny_run["dir"].iterdir()} == before


def test_unknown_flag(capfd):
    code, _, err = run_pretrain(capfd, "--no_such_flag=1")
    assert_one_line_error(code, err, "no_such_flag")


def test_missing_model_dir_and_a_model_dir_that_is_a_file(capfd, tmp_path):
    code, _, err = run_pretrain(capfd, "--gin_file=configs/smoke.gin")
    assert_one_line_error(code, err, "--model_dir is required")
    a_file = tmp_path / "not_a_dir"
    a_file.write_text("x")
    code, _, err = run_pretrain(capfd, "--gin_file=configs/smoke.gin", f"--model_dir={a_file}")
    assert_one_line_error(code, err, f"--model_dir={a_file}: {a_file} is a file")
    code, _, err = run_pretrain(capfd, "--gin_file=configs/smoke.gin",
                                f"--model_dir={a_file}/below")
    assert_one_line_error(code, err, "is a file; give a directory")


def test_missing_gin_file_lists_the_shipped_configs(capfd, tmp_path):
    code, _, err = run_pretrain(capfd, "--gin_file=nope.gin", f"--model_dir={tmp_path}")
    assert_one_line_error(code, err, "--gin_file=nope.gin does not exist", "configs/smoke.gin")


def test_gin_typo_names_the_file_and_line(capfd, tmp_path):
    config = tmp_path / "typo.gin"
    config.write_text("# my run\ninclude 'configs/smoke.gin'\n\n"
                      "PretrainingConfig.seq_lenght = 32\n")
    code, _, err = run_pretrain(capfd, f"--gin_file={config}", f"--model_dir={tmp_path / 'run'}")
    assert_one_line_error(code, err, f"{config}:4: ", "'seq_lenght'")
    assert not (tmp_path / "run").exists()  # nothing built before the config was valid


@pytest.mark.parametrize("text, line, fragments", [
    ("TrainerConfig.train_steps = 10\nTrainerConfig.steps_per_loop = = 2\n", 2,
     ["Unable to parse value"]),
    ("TrainerConfig.train_steps = [1,\n", 2, ["unclosed bracket"]),
    ("TrainerConfig.train_steps = @no_such_builder()\n", 1,
     ["'@no_such_builder' is not a registered configurable"]),
    ("include 'configs/missing.gin'\n", 1, ["Unable to open file", "configs/missing.gin"]),
])
def test_gin_syntax_errors_name_the_file_and_line(tmp_path, text, line, fragments):
    config = tmp_path / "bad.gin"
    config.write_text(text)
    with pytest.raises(UserError) as caught:
        gin_config.parse_gin([str(config)])
    message = str(caught.value)
    assert message.startswith(f"{config}:{line}: ") and "\n" not in message
    assert all(fragment in message for fragment in fragments), message


def test_shipped_includes_resolve_beside_a_configs_folder_on_sys_path(tmp_path, monkeypatch):
    # An empty configs/ folder in the working directory, importable as a namespace package
    # (as under `python -m` there, or with the repository root on PYTHONPATH).
    (tmp_path / "configs").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    gin.clear_config()
    try:
        gin_config.parse_gin(["smoke.gin"])  # includes 'configs/base.gin'
        assert gin.query_parameter("build_encoder.hidden_size") == 64  # smoke.gin
        # base.gin's own include, two levels down (smoke.gin sets every base.gin value it keeps)
        assert gin.query_parameter("build_encoder.vocab_size") == 30522
        with pytest.raises(UserError, match=r"missing.gin:1: Unable to open file: "
                                            r"configs/missing.gin"):
            (tmp_path / "missing.gin").write_text("include 'configs/missing.gin'\n")
            gin_config.parse_gin([str(tmp_path / "missing.gin")])
    finally:
        gin.clear_config()


def test_gin_param_errors_and_unset_required_values():
    with pytest.raises(UserError, match=r"^--gin_param 'TrainerConfig.train_stepz = 3'.*"
                                        r"doesn't have a parameter named 'train_stepz'"):
        gin_config.parse_gin([], ["TrainerConfig.train_stepz = 3"])
    with pytest.raises(UserError, match=r"^TrainerConfig.train_steps is not set; bind it"):
        gin_config.build_configured(configurables.TrainerConfig, "TrainerConfig")
    gin.parse_config("TrainerConfig.train_steps = -5")
    with pytest.raises(UserError, match=r"^TrainerConfig: train_steps=-5 must be a positive "
                                        r"integer$"):
        gin_config.build_configured(configurables.TrainerConfig, "TrainerConfig")


def test_unwritable_model_dir(tmp_path, monkeypatch):
    # Simulated: as root every directory is writable, so a chmod would prove nothing here.
    monkeypatch.setattr(common.os, "access", lambda path, mode: str(path) != str(tmp_path))
    with pytest.raises(UserError, match=f"--model_dir={tmp_path}/run: {tmp_path} is not "
                                        "writable; choose another directory"):
        common.check_model_dir(str(tmp_path / "run"))
    (tmp_path / "ok").mkdir()
    assert common.check_model_dir(str(tmp_path / "ok" / "b")) == str(tmp_path / "ok" / "b")


def test_strategy_flag_offers_exactly_the_strategies():
    assert common.STRATEGY_NAMES == strategies.STRATEGY_NAMES
    assert flags.FLAGS["strategy"].parser.enum_values == list(strategies.STRATEGY_NAMES)
