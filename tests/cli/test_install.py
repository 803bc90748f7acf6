"""A non-editable install finds its shipped configs from any directory.

The package is built from a copy of the source and installed with pip into a fresh target
folder (no network: --no-deps --no-build-isolation --no-index; the dependencies come from the
test venv), then its `bert-train` console script pretrains from a directory outside the
repository with only that folder on PYTHONPATH.
"""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

SOURCES = ("bert_trainer", "setup.cfg", "pyproject.toml", "README.md")


def _run(argv, **kwargs):
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kwargs)
    assert proc.returncode == 0, f"{argv[:4]} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """`pip install --target` of a copy of the source: (site folder, env that imports only it)."""
    pytest.importorskip("setuptools")  # --no-build-isolation builds with the venv's own
    root = tmp_path_factory.mktemp("install")
    source = root / "source"
    for name in SOURCES:  # a copy, so the build leaves no build/ or egg-info in the checkout
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, source / name)
    site = root / "site"
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
          "--no-build-isolation", "--no-index", f"--target={site}", str(source)])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=str(site), TF_CPP_MIN_LOG_LEVEL="2")
    return site, env


@pytest.mark.slow
def test_every_config_is_installed(installed):
    site, _ = installed
    ours = {p.relative_to(REPO / "bert_trainer").as_posix()
            for p in (REPO / "bert_trainer" / "configs").rglob("*.gin")}
    theirs = {p.relative_to(site / "bert_trainer").as_posix()
              for p in (site / "bert_trainer" / "configs").rglob("*.gin")}
    assert "configs/tasks/classification.gin" in ours and "configs/smoke.gin" in ours
    assert theirs == ours


@pytest.mark.slow
def test_the_ops_a_saved_model_may_hold_are_installed(installed):
    site, _ = installed  # predict/generate --saved_model read them (export/graph_check.py)
    listed = REPO / "bert_trainer" / "export" / "allowed_ops.txt"
    assert (site / "bert_trainer" / "export" / "allowed_ops.txt").read_text() == listed.read_text()


@pytest.mark.slow
def test_names_resolve_inside_the_installed_package(installed, tmp_path):
    site, env = installed
    code = ("import bert_trainer; from bert_trainer.runs import gin_config; "
            "print(bert_trainer.__file__); "
            "[print(gin_config.resolve_gin_file(n)) for n in ('base.gin', 'configs/base.gin', "
            "'encoders/tiny.gin', 'configs/tasks/classification.gin')]")
    lines = _run([sys.executable, "-c", code], cwd=tmp_path, env=env).stdout.splitlines()
    configs = (site / "bert_trainer" / "configs").resolve()
    assert pathlib.Path(lines[0]).resolve() == (site / "bert_trainer" / "__init__.py").resolve()
    assert [pathlib.Path(line) for line in lines[1:]] == [
        configs / "base.gin", configs / "base.gin", configs / "encoders" / "tiny.gin",
        configs / "tasks" / "classification.gin"]


@pytest.mark.slow
def test_pretrain_with_a_shipped_config_from_another_directory(installed, pretraining_data,
                                                               tmp_path):
    site, env = installed
    # A user's own file in the working directory, including a shipped one by its configs/ name.
    (tmp_path / "my.gin").write_text("include 'configs/smoke.gin'\n"
                                     "TrainerConfig.train_steps = 2\n")
    model_dir = tmp_path / "run"
    script = site / "bin" / "bert-train"  # what `pip install .` puts on PATH
    assert script.is_file()
    for gin_file in ("smoke.gin", "my.gin"):
        shutil.rmtree(model_dir, ignore_errors=True)
        proc = _run([str(script), "pretrain",
                     f"--gin_file={gin_file}", f"--model_dir={model_dir}",
                     f"--gin_param=build_encoder.vocab_size = {pretraining_data['vocab_size']}",
                     "--gin_param=TrainerConfig.train_steps = 2",
                     f"--train_data={pretraining_data['train']}",
                     f"--eval_data={pretraining_data['eval']}",
                     f"--vocab_file={pretraining_data['vocab_file']}"], cwd=tmp_path, env=env)
        assert "bert-train pretrain: step 2 |" in proc.stdout, proc.stdout[-2000:]
        operative = (model_dir / "operative_config.gin").read_text()
        assert "build_encoder.hidden_size = 64" in operative  # smoke.gin's width
        assert "TrainerConfig.train_steps = 2" in operative
        assert sorted(p.name for p in model_dir.glob("ckpt-*.index")) == ["ckpt-2.index"]
