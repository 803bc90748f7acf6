"""The bad-input sweep: malformed inputs across the CLI and the library, each refused cleanly.

Every case must give a non-zero exit code (or a clear exception from the library), one message
that names the offending thing, no Python traceback, and leave every existing model directory
byte for byte as it was (sha256 of each file before and after).

Most CLI cases run in this process through `cli.main`, the CLI's own entry point (a fresh
TensorFlow import per case would cost ~10 s each); `convert`/`predict`/`export` run in one
subprocess per command (their flag definitions clash with the training commands' in one
process); a handful go through `python -m bert_trainer.cli` to prove real exit codes and no
traceback.
"""

import json
import os
import pathlib
import pickle
import re
import shutil
import subprocess
import sys

import pytest
from bad_input_cases import BAD_FILES, CLI_CASES, GOOD_ROWS, SST2, SST2_HEADER, SUBPROCESS_CASES
from robust_testing import RESULT, TESTS, subprocess_env, tree_digest

from bert_trainer.commands import common
from bert_trainer.errors import EXIT_USER_ERROR, UserError


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_pretrained):
    """Every malformed file of the sweep, and model directories that must stay untouched."""
    root = tmp_path_factory.mktemp("bad_inputs")
    paths = {"root": str(root), "pretrained": tiny_pretrained["dir"],
             "vocab": tiny_pretrained["vocab_file"], "missing": str(root / "missing.tsv")}
    for name, text in BAD_FILES.items():
        (root / name).write_text(text, encoding="utf-8")
        paths[name] = str(root / name)
    (root / "binary.tsv").write_bytes(bytes(range(256)) * 8)
    (root / "latin1.tsv").write_bytes((SST2_HEADER + GOOD_ROWS + "caf\xe9 cr\xe8me\t1\n")
                                      .encode("latin-1"))
    (root / "latin1.txt").write_bytes("caf\xe9 cr\xe8me br\xfbl\xe9e\n".encode("latin-1"))
    vocab = pathlib.Path(tiny_pretrained["vocab_file"]).read_text(encoding="utf-8").splitlines()
    (root / "no_cls_vocab.txt").write_text("".join(t + "\n" for t in vocab if t != "[CLS]"))
    paths.update({n: str(root / n) for n in ("binary.tsv", "latin1.tsv", "latin1.txt",
                                             "no_cls_vocab.txt")})
    paths.update(_checkpoint_dirs(root, tiny_pretrained["dir"]))
    return paths


def _checkpoint_dirs(root: pathlib.Path, pretrained: str) -> dict[str, str]:
    """A truncated copy of the pretrained dir, a pickle-only HF dir, a bad config.json dir."""
    truncated = root / "truncated_model"
    shutil.copytree(pretrained, truncated)
    data = next(truncated.glob("ckpt-*.data-*"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 3])
    hf = json.dumps({"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 100,
                     "max_position_embeddings": 64, "type_vocab_size": 2})
    pickled = root / "pickle_model"
    pickled.mkdir()
    (pickled / "config.json").write_text(hf)
    (pickled / "pytorch_model.bin").write_bytes(pickle.dumps({"weights": [1.0, 2.0]}))
    shutil.copy(pathlib.Path(pretrained) / "vocab.txt", pickled / "vocab.txt")
    bad_config = root / "bad_config_model"
    bad_config.mkdir()
    (bad_config / "config.json").write_text('{"model_type": "bert", "hidden_size": ')
    garbage = root / "garbage_weights_model"
    garbage.mkdir()
    (garbage / "config.json").write_text(hf)
    for directory in (bad_config, garbage):
        (directory / "model.safetensors").write_bytes(b"\x00\x01 not safetensors" * 10)
        shutil.copy(pathlib.Path(pretrained) / "vocab.txt", directory / "vocab.txt")
    return {"truncated_model": str(truncated), "pickle_model": str(pickled),
            "bad_config_model": str(bad_config), "garbage_weights_model": str(garbage)}


@pytest.fixture(scope="module")
def finetuned(inputs, tmp_path_factory):
    """A real fine-tuned model directory (2 steps of sst2): bad inputs must not change it."""
    from bert_trainer import cli  # noqa: PLC0415

    directory = tmp_path_factory.mktemp("finetuned") / "run"
    reset()
    args = fill([*SST2, "--train_file={good.tsv}"], {**inputs, "existing": str(directory)})
    assert cli.main(["bert-train", *args]) == 0
    return str(directory)


@pytest.fixture(scope="module")
def paths(inputs, finetuned, tmp_path_factory):
    """Every placeholder of the cases: the inputs, and the model directories."""
    root = tmp_path_factory.mktemp("model_dirs")
    pretraining_run = root / "pretraining_run"  # holds a BertPretrainer checkpoint
    shutil.copytree(inputs["pretrained"], pretraining_run)
    broken_run = root / "broken_run"  # the fine-tuned run with every checkpoint truncated
    shutil.copytree(finetuned, broken_run)
    for data in broken_run.glob("**/ckpt-*.data-*"):
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 3])
    return {**inputs, "existing": finetuned, "pretraining_run": str(pretraining_run),
            "broken_run": str(broken_run), "fresh": str(root / "fresh_run")}


@pytest.fixture(scope="module")
def digests(paths):
    """sha256 of every file of the model directories that no bad input may change."""
    return {d: tree_digest(paths[d]) for d in GUARDED}


GUARDED = ("existing", "pretrained", "pretraining_run", "broken_run", "truncated_model")


def reset() -> None:
    """What a fresh process would have: gin bindings of an earlier in-process run leak."""
    import gin  # noqa: PLC0415
    import keras  # noqa: PLC0415

    gin.clear_config()
    keras.backend.clear_session()


def run_batches(cases: list[list[str]]) -> list[dict]:
    """Runs the cases in one subprocess per command, all at once; results in case order."""
    commands = sorted({args[0] for args in cases})
    procs = {c: subprocess.Popen([sys.executable, str(TESTS / "robust_testing.py"),
                                  "--cli_batch"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=subprocess_env())
             for c in commands}
    results = {}
    for command, proc in procs.items():
        mine = [args for args in cases if args[0] == command]
        out, err = proc.communicate(json.dumps(mine), timeout=600)
        lines = [line for line in out.splitlines() if line.startswith(RESULT)]
        assert proc.returncode == 0 and lines, err[-3000:]
        results[command] = iter(json.loads(lines[-1][len(RESULT):]))
    return [next(results[args[0]]) for args in cases]


def fill(args, paths) -> list[str]:
    """Replaces each {name} in `args` with paths[name] (names may hold dots: {lines.txt})."""
    return [re.sub(r"\{([^{}]+)\}", lambda m: paths[m.group(1)], a) for a in args]


TABLE = os.environ.get("BAD_INPUTS_TABLE")  # a file: each case's message is appended to it


def assert_refusal(case, rc, stderr, expected, paths, digests) -> None:
    """Exit code 2, one `bert-train ...` line naming the thing, no traceback, nothing changed."""
    lines = [line for line in stderr.splitlines() if line.startswith("bert-train")]
    if TABLE:
        with open(TABLE, "a") as f:
            f.write(f"{case}\t{rc}\t{' / '.join(lines) or stderr[-300:]!r}\n")
    assert "Traceback" not in stderr, stderr[-3000:]
    assert rc == EXIT_USER_ERROR, stderr[-3000:]
    assert len(lines) == 1, stderr[-3000:]
    assert fill([expected], paths)[0] in lines[0]
    assert {d: tree_digest(paths[d]) for d in GUARDED} == digests
    assert not os.path.exists(paths["fresh"]), "a failed run left a new model_dir behind"


@pytest.mark.parametrize("case, args, expected", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_refuses_bad_input(case, args, expected, paths, digests, capsys):
    from bert_trainer import cli  # noqa: PLC0415 (imports TensorFlow)

    reset()
    capsys.readouterr()
    rc = cli.main(["bert-train", *fill(args, paths)])
    assert_refusal(case, rc, capsys.readouterr().err, expected, paths, digests)


@pytest.fixture(scope="module")
def subprocess_results(paths):
    return run_batches([fill(args, paths) for _, args, _ in SUBPROCESS_CASES])


@pytest.mark.parametrize("index", range(len(SUBPROCESS_CASES)),
                         ids=[c[0] for c in SUBPROCESS_CASES])
@pytest.mark.slow
def test_convert_predict_and_export_refuse_bad_input(index, subprocess_results, paths, digests):
    case, _, expected = SUBPROCESS_CASES[index]
    result = subprocess_results[index]
    assert_refusal(case, result["rc"], result["stderr"], expected, paths, digests)


@pytest.mark.slow
def test_real_command_lines_exit_2_with_one_line(paths, digests):
    # The real entry point, in parallel: exit status, stderr's last line, no traceback.
    by_name = {case[0]: case for case in CLI_CASES + SUBPROCESS_CASES}
    cases = [by_name[name] for name in ("finetune label outside the label set",
                                        "convert pickle .bin", "vocab non-UTF-8 input")]
    procs = [subprocess.Popen([sys.executable, "-m", "bert_trainer.cli", *fill(args, paths)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=subprocess_env()) for _, args, _ in cases]
    for (_, _, expected), proc in zip(cases, procs, strict=True):
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == EXIT_USER_ERROR, stderr[-3000:]
        assert "Traceback" not in stderr
        last = stderr.strip().splitlines()[-1]
        assert last.startswith("bert-train ") and fill([expected], paths)[0] in last, stderr
    assert {d: tree_digest(paths[d]) for d in GUARDED} == digests


def test_read_only_model_dir(paths, digests, capsys, monkeypatch):
    # We run as root, for whom permission bits do not stop writes; what a normal user gets is
    # simulated by os.access answering as it would for them.
    from bert_trainer import cli  # noqa: PLC0415

    read_only = os.path.realpath(paths["existing"])
    real_access = os.access
    monkeypatch.setattr(common.os, "access", lambda path, mode, **kw: (
        False if os.path.realpath(path) == read_only and mode & os.W_OK
        else real_access(path, mode, **kw)))
    reset()
    rc = cli.main(["bert-train", *fill([*SST2, "--train_file={good.tsv}"], paths)])
    assert_refusal("finetune read-only model_dir", rc, capsys.readouterr().err,
                  "--model_dir={existing}: {existing} is not writable; choose another directory",
                  paths, digests)


def test_library_raises_clear_errors(paths):
    from bert_trainer.training import TrainerConfig, checkpointing, strategies  # noqa: PLC0415

    with pytest.raises(UserError, match=r"^train_steps=0 must be a positive integer$"):
        TrainerConfig(train_steps=0)
    with pytest.raises(UserError, match=r"^steps_per_loop=-1 must be a positive integer$"):
        TrainerConfig(train_steps=5, steps_per_loop=-1)
    with pytest.raises(UserError, match="none is usable"):
        checkpointing.latest_checkpoint(paths["broken_run"])
    with pytest.raises(UserError, match="--strategy='horovod' is unknown"):
        strategies.get_strategy("horovod")
