"""The bad-input sweep: malformed inputs across the CLI and the library, each refused cleanly.

Every case must give a non-zero exit code (or a clear exception from the library), one message
that names the offending thing, no Python traceback, and leave every existing model directory
byte for byte as it was (sha256 of each file before and after).

Most CLI cases run in this process through `cli.main`, the CLI's own entry point (a fresh
TensorFlow import per case would cost ~10 s each); `convert`/`predict`/`export` run in one
subprocess per command (their flag definitions clash with the training commands' in one
process), the output cases of `vocab` and `create_pretraining_data` in one more; a handful
go through `python -m bert_trainer.cli` to prove real exit codes and no traceback.
"""

import json
import os
import pathlib
import pickle
import re
import shutil
import subprocess
import sys

import bad_input_cases
import pytest
from bad_input_cases import (
    BAD_FILES,
    CLI_CASES,
    GOOD_ROWS,
    MODEL_DIR_CASES,
    OUTPUT_CASES,
    SST2,
    SST2_AGAIN,
    SST2_HEADER,
    SUBPROCESS_CASES,
)
from disk_testing import fill_disk, small_disk
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
    paths.update(bad_input_cases.write_untrusted_dirs(root, tiny_pretrained["dir"]))
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


# convert, predict and export each need a process of their own (their flags clash with the
# other commands'); vocab and create_pretraining_data share one, as they share this process
# with the training commands in CLI_CASES.
OWN_PROCESS = ("convert", "predict", "export")


def _process_of(args: list[str]) -> str:
    return args[0] if args[0] in OWN_PROCESS else "data"


def run_batches(cases: list[list[str]]) -> list[dict]:
    """Runs the cases in one subprocess per command (see OWN_PROCESS), all at once; results in
    case order."""
    groups = sorted({_process_of(args) for args in cases})
    procs = {g: subprocess.Popen([sys.executable, str(TESTS / "robust_testing.py"),
                                  "--cli_batch"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=subprocess_env())
             for g in groups}
    results = {}
    for group, proc in procs.items():
        mine = [args for args in cases if _process_of(args) == group]
        out, err = proc.communicate(json.dumps(mine), timeout=600)
        lines = [line for line in out.splitlines() if line.startswith(RESULT)]
        assert proc.returncode == 0 and lines, err[-3000:]
        results[group] = iter(json.loads(lines[-1][len(RESULT):]))
    return [next(results[_process_of(args)]) for args in cases]


def fill(args, paths) -> list[str]:
    """Replaces each {name} in `args` with paths[name] (names may hold dots: {lines.txt})."""
    return [re.sub(r"\{([^{}]+)\}", lambda m: paths[m.group(1)], a) for a in args]


TABLE = os.environ.get("BAD_INPUTS_TABLE")  # a file: each case's message is appended to it


def assert_one_line(case, rc, stderr, expected: str) -> None:
    """Exit code 2 and one `bert-train ...` line holding `expected`; no traceback."""
    lines = [line for line in stderr.splitlines() if line.startswith("bert-train")]
    if TABLE:
        with open(TABLE, "a") as f:
            f.write(f"{case}\t{rc}\t{' / '.join(lines) or stderr[-300:]!r}\n")
    assert "Traceback" not in stderr, stderr[-3000:]
    assert rc == EXIT_USER_ERROR, stderr[-3000:]
    assert len(lines) == 1, stderr[-3000:]
    assert expected in lines[0], lines[0]


def assert_refusal(case, rc, stderr, expected, paths, digests) -> None:
    """Exit code 2, one `bert-train ...` line naming the thing, no traceback, nothing changed."""
    assert_one_line(case, rc, stderr, fill([expected], paths)[0])
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
def batch_results(output_paths):
    """SUBPROCESS_CASES and OUTPUT_CASES in the same batch processes (one TensorFlow start-up
    per process, not per fixture): (SUBPROCESS_CASES' results, the guarded digests before the
    OUTPUT_CASES, OUTPUT_CASES' results). Every case is a refusal that writes nothing, as each
    test checks."""
    before = output_digests(output_paths)
    cases = [fill(args, output_paths) for _, args, _ in SUBPROCESS_CASES + OUTPUT_CASES]
    results = run_batches(cases)
    return results[:len(SUBPROCESS_CASES)], before, results[len(SUBPROCESS_CASES):]


@pytest.fixture(scope="module")
def subprocess_results(batch_results):
    return batch_results[0]


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
    from bert_trainer.checkpoints import select  # noqa: PLC0415
    from bert_trainer.training import TrainerConfig, strategies  # noqa: PLC0415

    with pytest.raises(UserError, match=r"^train_steps=0 must be a positive integer$"):
        TrainerConfig(train_steps=0)
    with pytest.raises(UserError, match=r"^steps_per_loop=-1 must be a positive integer$"):
        TrainerConfig(train_steps=5, steps_per_loop=-1)
    with pytest.raises(UserError, match="none is usable"):
        select.select_checkpoint(paths["broken_run"])
    with pytest.raises(UserError, match="--strategy='horovod' is unknown"):
        strategies.get_strategy("horovod")


# ------------------------------------------------------------------ outputs (OUTPUT_CASES)

TEMPORARY = re.compile(r"\.tmp-\d+$|\.old-\d+$")


@pytest.fixture(scope="module")
def output_paths(paths, tmp_path_factory):
    """The placeholders of OUTPUT_CASES: `paths` plus earlier outputs the cases must keep."""
    from bert_trainer.data.corpus_options import CorpusOptions  # noqa: PLC0415
    from bert_trainer.tasks.masked_lm import corpus as cpd  # noqa: PLC0415

    root = tmp_path_factory.mktemp("outputs_root")
    (root / "old.jsonl").write_text('{"line": 1, "text": "fine", "label": "positive"}\n')
    (root / "notes.txt").write_text("my notes\n")
    shutil.copy(paths["vocab"], root / "my_vocab.txt")
    (root / "mixed_export").mkdir()
    (root / "mixed_export" / "saved_model.pb").write_bytes(b"\x08\x01")
    (root / "mixed_export" / "notes.txt").write_text("mine\n")
    corpus = root / "corpus.txt"
    corpus.write_text("".join(f"the film {i} was good . it was fine .\nthe end {i} .\n\n"
                              for i in range(20)))
    for name in ("data", "mixed_data", "odd_summary"):
        cpd.create_pretraining_data(
            str(corpus), paths["vocab"], str(root / name / "train-*.tfrecord"),
            cpd.PretrainingDataConfig(max_seq_length=16, seed=1),
            options=CorpusOptions(num_shards=2), progress=None)
    (root / "mixed_data" / "train-notes.tfrecord").write_bytes(b"mine")
    (root / "odd_summary" / "train-summary.json").write_text('{"mine": true}\n')
    parent = pathlib.Path(paths["existing"]).parent
    (parent / "unrelated.txt").write_text("kept\n")
    return {**paths, "outputs_root": str(root), "existing_parent": str(parent)}


def output_digests(paths) -> dict:
    """sha256 of every guarded file: the model directories and the earlier outputs."""
    return {d: tree_digest(paths[d])
            for d in (*GUARDED, "outputs_root", "existing_parent")}


@pytest.fixture(scope="module")
def output_results(batch_results):
    return batch_results[1:]


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(OUTPUT_CASES)), ids=[c[0] for c in OUTPUT_CASES])
def test_outputs_are_replaced_only_when_ours(index, output_results, output_paths):
    before, results = output_results
    case, _, expected = OUTPUT_CASES[index]
    assert_one_line(case, results[index]["rc"], results[index]["stderr"],
                    fill([expected], output_paths)[0])
    assert output_digests(output_paths) == before
    left = [os.path.join(d, n) for key in ("outputs_root", "existing_parent", "pretraining_run",
                                           "pretrained")
            for d, dirs, files in os.walk(output_paths[key]) for n in dirs + files
            if TEMPORARY.search(n)]
    assert not left, left
# --------------------------------------------------------------------------------------------
# A model_dir belongs to one run (cases: bad_input_cases.MODEL_DIR_CASES).

# A process that holds a model_dir's lock until killed, as test_run_lock.hold_in_subprocess,
# with run_lock.py loaded alone: the package's training/__init__ would import TensorFlow.
HOLD = ("import importlib.util, sys, time; sys.path.insert(0, {repo!r}); "
        "spec = importlib.util.spec_from_file_location('run_lock', {module!r}); "
        "run_lock = importlib.util.module_from_spec(spec); spec.loader.exec_module(run_lock); "
        "run_lock.acquire(sys.argv[1], 'bert-train finetune'); print('locked', flush=True); "
        "time.sleep(600)")


def hold_in_subprocess(model_dir) -> subprocess.Popen:
    from bert_trainer.training import run_lock  # noqa: PLC0415

    proc = subprocess.Popen([sys.executable, "-c", HOLD.format(repo=str(TESTS.parent),
                                                               module=run_lock.__file__),
                             str(model_dir)], stdout=subprocess.PIPE, text=True,
                            env=subprocess_env())
    assert proc.stdout.readline().strip() == "locked"
    return proc


@pytest.fixture(scope="module")
def run_paths(paths, tmp_path_factory):
    """`paths` plus a vocabulary of the same size in another order, and model_dirs held by a
    live process (copies of the fine-tuned run; {unlinked_run}'s lock file then deleted)."""
    root = tmp_path_factory.mktemp("owned")
    tokens = pathlib.Path(paths["existing"], "vocab.txt").read_text(encoding="utf-8").split("\n")
    tokens[-3], tokens[-2] = tokens[-2], tokens[-3]  # two words swapped: same size, other ids
    (root / "swapped_vocab.txt").write_text("\n".join(tokens), encoding="utf-8")
    locked = root / "locked_run"
    shutil.copytree(paths["existing"], locked)
    holder = hold_in_subprocess(locked)
    unlinked = root / "unlinked_run"
    shutil.copytree(paths["existing"], unlinked)
    unlinked_holder = hold_in_subprocess(unlinked)
    (unlinked / ".bert_train.lock").unlink()
    yield {**paths, "swapped_vocab": str(root / "swapped_vocab.txt"), "locked_run": str(locked),
           "unlinked_run": str(unlinked)}
    for proc in (holder, unlinked_holder):
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("case, args, expected", MODEL_DIR_CASES,
                         ids=[c[0] for c in MODEL_DIR_CASES])
def test_model_dir_is_not_reused(case, args, expected, run_paths, digests, capsys):
    from bert_trainer import cli  # noqa: PLC0415

    held = ("locked_run", "unlinked_run")
    locked = {name: tree_digest(run_paths[name]) for name in held}
    reset()
    capsys.readouterr()
    rc = cli.main(["bert-train", *fill(args, run_paths)])
    assert_refusal(case, rc, capsys.readouterr().err, expected, run_paths, digests)
    assert {name: tree_digest(run_paths[name]) for name in held} == locked


@pytest.mark.slow
def test_two_finetune_runs_at_once_on_one_model_dir(paths, tmp_path):
    # Both start together; the one that locks first trains, the other refuses in one line.
    run_paths = {**paths, "existing": str(tmp_path / "run")}
    procs = [subprocess.Popen([sys.executable, "-m", "bert_trainer.cli",
                               *fill(SST2_AGAIN, run_paths)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=subprocess_env())
             for _ in range(2)]
    results = [(proc.pid, proc.returncode, err) for proc in procs
               for _, err in [proc.communicate(timeout=600)]]
    assert sorted(rc for _, rc, _ in results) == [0, EXIT_USER_ERROR], results
    (winner, _, _), (_, _, refused) = sorted(results, key=lambda r: r[1])
    lines = [line for line in refused.splitlines() if line.startswith("bert-train")]
    assert "Traceback" not in refused and len(lines) == 1, refused
    assert lines[0].startswith(f"bert-train finetune: error: --model_dir={tmp_path / 'run'} is "
                               f"in use by bert-train finetune (pid {winner} on host ")
    assert not (tmp_path / "run" / ".bert_train.lock").exists()
    assert (tmp_path / "run" / "eval_results.json").is_file()  # the winner finished


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
def test_finetune_on_a_full_disk_keeps_the_last_checkpoint(paths, capsys):
    # The fine-tuned run (2 steps) resumed for 2 more on a small tmpfs filled up: the summary
    # and info files fit, the step-4 checkpoint does not.
    from bert_trainer import cli  # noqa: PLC0415

    with small_disk(16384) as disk:
        run = os.path.join(disk, "run")
        shutil.copytree(paths["existing"], run)
        kept = {k: v for k, v in tree_digest(run).items()
                if not k.startswith(("train/", "eval/", "operative_config"))}
        filler = fill_disk(disk, leave_bytes=400_000)
        args = fill([*SST2_AGAIN, "--train_steps=4"], {**paths, "existing": run})
        reset()
        capsys.readouterr()
        rc = cli.main(["bert-train", *args])
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("bert-train")]
        assert rc == EXIT_USER_ERROR and "Traceback" not in err and len(lines) == 1, err[-3000:]
        assert lines[0].startswith(f"bert-train finetune: error: writing checkpoint ckpt-4 to "
                                   f"{run} failed: no space left on the device (needs about ")
        assert lines[0].endswith("the last good checkpoint ckpt-2 is intact; run the same "
                                 "command again to resume from it")
        after = tree_digest(run)
        assert {k: after.get(k) for k in kept} == kept
        assert not [k for k in after if "_temp" in k or ".tmp" in k or "lock" in k]
        os.remove(filler)
        reset()
        assert cli.main(["bert-train", *args]) == 0
        assert "bert-train finetune: step 4 |" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------
# Checked before the first step (bad_input_cases.PRECHECK_CASES), and what must now work: a
# checkpoint prefix as --init_checkpoint, evaluate on a model_dir it cannot write.
# ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def precheck_paths(paths, tmp_path_factory):
    root = tmp_path_factory.mktemp("precheck_inputs")
    for name, text in bad_input_cases.PRECHECK_FILES.items():
        (root / name).write_text(text, encoding="utf-8")
    (root / "a_dir").mkdir()
    names = [*bad_input_cases.PRECHECK_FILES, "a_dir"]
    return {**paths, **{name: str(root / name) for name in names}}


@pytest.mark.parametrize("case, args, expected", bad_input_cases.PRECHECK_CASES,
                         ids=[c[0] for c in bad_input_cases.PRECHECK_CASES])
def test_refused_before_the_first_step(case, args, expected, precheck_paths, digests, capsys):
    from bert_trainer import cli  # noqa: PLC0415

    reset()
    capsys.readouterr()
    rc = cli.main(["bert-train", *fill(args, precheck_paths)])
    assert_refusal(case, rc, capsys.readouterr().err, expected, precheck_paths, digests)


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
def test_init_checkpoint_prefix_warm_starts_from_that_checkpoint(paths, tiny_pretrained,
                                                                 tmp_path, capsys):
    # The directory's latest checkpoint (ckpt-5) holds other weights: the prefix must win.
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    from bert_trainer import cli  # noqa: PLC0415
    from bert_trainer.checkpoints import model_dir  # noqa: PLC0415
    from bert_trainer.checkpoints.layout import model_trackable  # noqa: PLC0415
    from bert_trainer.models import BertPretrainer  # noqa: PLC0415
    from bert_trainer.tasks import finetuning  # noqa: PLC0415

    pretrained = tmp_path / "pretrained"
    shutil.copytree(paths["pretrained"], pretrained)
    spec = finetuning.spec_from_checkpoint(str(pretrained))
    original = tiny_pretrained["encoder_weights"]
    other = spec.build()
    other.set_weights([w + 1.0 for w in original])
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=model_trackable(BertPretrainer(other))), str(pretrained),
        max_to_keep=5, checkpoint_name="ckpt")
    manager.save(checkpoint_number=5)
    assert tf.train.latest_checkpoint(str(pretrained)).endswith("ckpt-5")
    keras.backend.clear_session()

    prefix = str(pretrained / "ckpt-3")
    run = tmp_path / "run"
    reset()
    rc = cli.main(["bert-train", *fill([*SST2, "--train_file={good.tsv}"], paths),
                   f"--init_checkpoint={prefix}", f"--model_dir={run}", "--train_steps=1",
                   "--learning_rate=1e-12"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"warm start from {prefix}: loaded {len(original)} encoder variables" in out
    # One step at a learning rate of 1e-12 leaves the encoder at ckpt-3's weights.
    encoder = spec.build()
    model_dir.restore_pretrained(str(run), encoder=encoder)
    for variable, expected in zip(encoder.weights, original, strict=True):
        np.testing.assert_allclose(variable.numpy(), expected, atol=1e-6, err_msg=variable.path)


def _evaluate_read_only(model_dir: str, paths, capsys) -> tuple[int, str, str]:
    from bert_trainer import cli  # noqa: PLC0415

    reset()
    capsys.readouterr()
    rc = cli.main(["bert-train", "evaluate", f"--model_dir={model_dir}",
                   f"--eval_file={paths['good.tsv']}"])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _assert_metrics_printed(rc, out, err, model_dir, finetuned) -> None:
    """rc 0, the metrics of the run's own final evaluation, one warning line, no traceback."""
    assert rc == 0 and "Traceback" not in err, err[-3000:]
    recorded = json.loads(pathlib.Path(finetuned, "eval_results.json").read_text())["metrics"]
    printed = dict(re.findall(r"^  (\w+)\s+(-?[\d.]+)$", out, re.MULTILINE))
    assert {k: float(v) for k, v in printed.items()} == pytest.approx(recorded, abs=1e-4)
    warnings = [line for line in err.splitlines() if line.startswith("bert-train")]
    step = json.loads(pathlib.Path(finetuned, "eval_results.json").read_text())["step"]
    assert warnings == [f"bert-train evaluate: warning: {model_dir} is not writable; the metrics "
                        f"are printed only (eval_results-ckpt-{step}.json, eval/ summaries not "
                        "written)"]


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_evaluate_prints_the_metrics_of_a_model_dir_it_cannot_write(paths, digests, capsys,
                                                                    monkeypatch):
    # As test_read_only_model_dir: os.access answers as it would for a user without write
    # permission. Any write evaluate made anyway would change the directory's digest.
    read_only = os.path.realpath(paths["existing"])
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: (
        False if os.path.realpath(path) == read_only and mode & os.W_OK
        else real_access(path, mode, **kw)))
    rc, out, err = _evaluate_read_only(paths["existing"], paths, capsys)
    _assert_metrics_printed(rc, out, err, read_only, paths["existing"])
    assert {d: tree_digest(paths[d]) for d in GUARDED} == digests


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_evaluate_on_a_read_only_mount(paths, digests, capsys, tmp_path):
    # A real read-only file system, where the system allows a bind mount (root on Linux).
    mount = tmp_path / "read_only_run"
    mount.mkdir()
    try:
        subprocess.run(["mount", "--bind", paths["existing"], str(mount)], check=True,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot bind-mount here: {e}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(mount)], check=True,
                       capture_output=True)
        with pytest.raises(OSError):
            (mount / "probe").write_text("")
        rc, out, err = _evaluate_read_only(str(mount), paths, capsys)
    finally:
        subprocess.run(["umount", str(mount)], check=True)
    _assert_metrics_printed(rc, out, err, str(mount), paths["existing"])
    assert {d: tree_digest(paths[d]) for d in GUARDED} == digests


# ------------------------------------------------------------------------------------------
# Fine-tuning options: multi-seed runs (bad --seeds/--num_seeds, a multi-seed run in a
# single-seed model_dir), batch fitting and long-text windows (bad_input_cases.SEED_CASES,
# BATCH_FIT_CASES, WINDOW_CASES).
# ------------------------------------------------------------------------------------------
OPTION_CASES = (bad_input_cases.SEED_CASES + bad_input_cases.BATCH_FIT_CASES
                + bad_input_cases.WINDOW_CASES)


@pytest.mark.parametrize("case, args, expected", OPTION_CASES, ids=[c[0] for c in OPTION_CASES])
def test_finetune_options_refused_before_anything_is_written(case, args, expected, paths,
                                                             digests, capsys):
    from bert_trainer import cli  # noqa: PLC0415

    reset()
    capsys.readouterr()
    rc = cli.main(["bert-train", *fill(args, paths)])
    assert_refusal(case, rc, capsys.readouterr().err, expected, paths, digests)


@pytest.mark.parametrize("case, env, args, expected", bad_input_cases.ENV_CASES,
                         ids=[c[0] for c in bad_input_cases.ENV_CASES])
def test_environment_refused_before_anything_is_written(case, env, args, expected, paths,
                                                        digests, capsys, monkeypatch):
    from bert_trainer import cli  # noqa: PLC0415

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    reset()
    capsys.readouterr()
    rc = cli.main(["bert-train", *fill(args, paths)])
    assert_refusal(case, rc, capsys.readouterr().err, expected, paths, digests)


# ------------------------------------------------------------------------------------------
# Task family plugins (bad_input_cases.FAMILY_CASES).
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case, args, expected", bad_input_cases.FAMILY_CASES,
                         ids=[c[0] for c in bad_input_cases.FAMILY_CASES])
def test_a_missing_family_module_is_refused_before_anything_is_written(case, args, expected,
                                                                       paths, digests, capsys):
    from bert_trainer import cli  # noqa: PLC0415

    reset()
    capsys.readouterr()
    rc = cli.main(["bert-train", *fill(args, paths)])
    assert_refusal(case, rc, capsys.readouterr().err, expected, paths, digests)


# ------------------------------------------------------------------------------------------
# `vocab --columns` on bad pair files (bad_input_cases.VOCAB_PAIR_CASES): refused before
# anything is written, the input files untouched.
# ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pair_inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair_inputs")
    paths = {"root": str(root), "out": str(root / "out")}
    for name, text in bad_input_cases.VOCAB_PAIR_FILES.items():
        (root / name).write_text(text, encoding="utf-8")
        paths[name] = str(root / name)
    return paths


@pytest.mark.parametrize("case, args, expected", bad_input_cases.VOCAB_PAIR_CASES,
                         ids=[c[0] for c in bad_input_cases.VOCAB_PAIR_CASES])
def test_vocab_refuses_bad_pair_files_before_writing(case, args, expected, pair_inputs,
                                                     capsys):
    from bert_trainer import cli  # noqa: PLC0415

    before = tree_digest(pair_inputs["root"])
    capsys.readouterr()
    rc = cli.main(["bert-train", *fill(args, pair_inputs)])
    assert_one_line(case, rc, capsys.readouterr().err, fill([expected], pair_inputs)[0])
    assert tree_digest(pair_inputs["root"]) == before
    assert not os.path.exists(pair_inputs["out"])


# ------------------------------------------------------------------------------------------
# Translation (bad_input_cases.TRANSLATE_CASES).
# ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def translate_paths(paths, tmp_path_factory):
    """`paths` plus the translate pair files of the cases."""
    root = tmp_path_factory.mktemp("translate_inputs")
    extra = {}
    for name, text in bad_input_cases.TRANSLATE_FILES.items():
        (root / name).write_text(text, encoding="utf-8")
        extra[name] = str(root / name)
    return {**paths, **extra}


@pytest.mark.parametrize("case, args, expected", bad_input_cases.TRANSLATE_CASES,
                         ids=[c[0] for c in bad_input_cases.TRANSLATE_CASES])
def test_translate_bad_input_refused_before_anything_is_written(case, args, expected,
                                                                translate_paths, digests,
                                                                capsys):
    from bert_trainer import cli  # noqa: PLC0415

    reset()
    capsys.readouterr()
    rc = cli.main(["bert-train", *fill(args, translate_paths)])
    assert_refusal(case, rc, capsys.readouterr().err, expected, translate_paths, digests)


# ------------------------------------------------------------------------------------------
# Hugging Face GPT-2 checkpoints (bad_input_cases.GPT2_CASES).
# ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt2_paths(tmp_path_factory):
    """tests/data/gpt2_tiny and copies of it with one fault each; a fresh output path."""
    import numpy as np  # noqa: PLC0415
    from safetensors.numpy import load_file, save_file  # noqa: PLC0415

    source = TESTS / "data" / "gpt2_tiny"
    root = tmp_path_factory.mktemp("gpt2_inputs")
    paths = {"gpt2": str(source), "fresh": str(root / "fresh"),
             "sst2.tsv": str(root / "sst2.tsv")}
    (root / "sst2.tsv").write_text(SST2_HEADER + GOOD_ROWS, encoding="utf-8")

    def copy(name, config=None, tensors=None):
        directory = root / name
        shutil.copytree(source, directory)
        if config:
            data = json.loads((directory / "config.json").read_text())
            (directory / "config.json").write_text(json.dumps({**data, **config}))
        if tensors is not None:
            weights = load_file(str(directory / "model.safetensors"))
            tensors(weights)
            save_file(weights, str(directory / "model.safetensors"))
        paths[name] = str(directory)

    copy("gpt2_inverse_layer_idx", config={"scale_attn_by_inverse_layer_idx": True})
    copy("gpt2_swish", config={"activation_function": "swish"})
    copy("gpt2_missing", tensors=lambda w: w.pop("transformer.h.1.mlp.c_fc.bias"))
    copy("gpt2_shape", tensors=lambda w: w.update(
        {"transformer.h.0.attn.c_attn.weight": np.zeros((32, 64), np.float32)}))
    pickle_dir = root / "gpt2_pickle"
    pickle_dir.mkdir()
    shutil.copy(source / "config.json", pickle_dir)
    (pickle_dir / "pytorch_model.bin").write_bytes(b"\x80\x02not read")
    paths["gpt2_pickle"] = str(pickle_dir)
    from bert_trainer.commands.convert import convert  # noqa: PLC0415 (imports TensorFlow)

    convert(str(source), str(root / "gpt2_converted"), log=lambda _: None)
    paths["gpt2_converted"] = str(root / "gpt2_converted")
    return paths


@pytest.mark.parametrize("case, args, expected", bad_input_cases.GPT2_CASES,
                         ids=[c[0] for c in bad_input_cases.GPT2_CASES])
def test_gpt2_checkpoints_refused_before_anything_is_written(case, args, expected, gpt2_paths,
                                                             capsys):
    from bert_trainer import cli  # noqa: PLC0415

    inputs = {k: tree_digest(v) for k, v in gpt2_paths.items() if k.startswith("gpt2")}
    reset()
    capsys.readouterr()
    rc = cli.main(["bert-train", *fill(args, gpt2_paths)])
    assert_one_line(case, rc, capsys.readouterr().err, fill([expected], gpt2_paths)[0])
    assert {k: tree_digest(gpt2_paths[k]) for k in inputs} == inputs
    assert not os.path.exists(gpt2_paths["fresh"])


# ------------------------------------------------------------------------------------------
# Causal language modelling (bad_input_cases.CAUSAL_DATA_CASES, CAUSAL_PRETRAIN_CASES).
# ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def causal_paths(inputs, tmp_path_factory):
    """`inputs` plus causal blocks, masked-LM examples and an output directory to keep empty."""
    from bert_trainer.tasks.causal_lm import corpus as causal_lm_data  # noqa: PLC0415
    from bert_trainer.tasks.masked_lm import corpus as cpd  # noqa: PLC0415

    root = tmp_path_factory.mktemp("causal_inputs")
    text = root / "corpus.txt"
    text.write_text("".join(f"the film {i} was good . it was fine .\nthe end {i} .\n\n"
                            for i in range(60)), encoding="utf-8")
    causal_lm_data.create_causal_lm_data(
        str(text), inputs["vocab"], str(root / "blocks" / "b-*.tfrecord"),
        causal_lm_data.CausalDataConfig(block_size=64), progress=None)
    cpd.create_pretraining_data(str(text), inputs["vocab"], str(root / "mlm" / "m-*.tfrecord"),
                                cpd.PretrainingDataConfig(max_seq_length=64), progress=None)
    (root / "out").mkdir()
    _causal_model_dir(root / "causal_model", inputs["vocab"])
    return {**inputs, "causal_blocks": str(root / "blocks" / "b-*.tfrecord"),
            "causal_model": str(root / "causal_model"),
            "mlm_records": str(root / "mlm" / "m-*.tfrecord"), "causal_out": str(root / "out"),
            "fresh": str(root / "fresh_run"), "causal_root": str(root), "causal_text": str(text)}


def _causal_model_dir(directory, vocab_file: str) -> None:
    """A bert-train model directory of a tiny CausalLM (random weights) at ckpt-1."""
    import tensorflow as tf  # noqa: PLC0415

    from bert_trainer.checkpoints import layout, model_dir  # noqa: PLC0415
    from bert_trainer.models.causal_lm import CausalLM  # noqa: PLC0415

    model = CausalLM(vocab_size=3000, hidden_size=16, num_layers=1, num_attention_heads=2,
                     inner_dim=32, max_sequence_length=64)
    model_dir.write_model_info(str(directory), model, vocab_file=vocab_file,
                               task={"name": "causal_lm", "family": "causal_lm",
                                     "block_size": 64})
    tf.train.Checkpoint(model=layout.model_trackable(model)).write(str(directory / "ckpt-1"))
    (directory / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')


CAUSAL_CASES = bad_input_cases.CAUSAL_DATA_CASES + bad_input_cases.CAUSAL_PRETRAIN_CASES


@pytest.mark.parametrize("case, args, expected", CAUSAL_CASES, ids=[c[0] for c in CAUSAL_CASES])
def test_causal_lm_bad_input_refused_before_anything_is_written(case, args, expected,
                                                                causal_paths, capsys):
    from bert_trainer import cli  # noqa: PLC0415

    guarded = {d: tree_digest(causal_paths[d]) for d in ("causal_root", "pretrained")}
    reset()
    capsys.readouterr()
    rc = cli.main(["bert-train", *fill(args, causal_paths)])
    assert_one_line(case, rc, capsys.readouterr().err, fill([expected], causal_paths)[0])
    assert {d: tree_digest(causal_paths[d]) for d in guarded} == guarded
    assert os.listdir(causal_paths["causal_out"]) == []
    assert not os.path.exists(causal_paths["fresh"]), "a failed run left a model_dir behind"


# ------------------------------------------------------------------------------------------
# Generation (bad_input_cases.GENERATE_CASES).
# ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def generate_paths(tmp_path_factory):
    """A causal and a classification model_dir, GENERATE_FILES, and their digests."""
    from causal_testing import make_causal_model_dir  # noqa: PLC0415
    from export_testing import make_model_dir  # noqa: PLC0415

    root = tmp_path_factory.mktemp("generate_inputs")
    causal, _ = make_causal_model_dir(root / "causal_run")
    classifier, _ = make_model_dir(root / "classifier_run", "classification")
    files = root / "files"
    files.mkdir()
    for name, text in bad_input_cases.GENERATE_FILES.items():
        (files / name).write_bytes(text.encode("latin-1" if "latin1" in name else "utf-8"))
    relabelled = root / "relabelled_run"  # a BERT classifier whose task says causal_lm
    shutil.copytree(classifier, relabelled)
    info = json.loads((relabelled / "bert_train.json").read_text())
    info["task"] = {"name": "causal_lm", "family": "causal_lm"}
    (relabelled / "bert_train.json").write_text(json.dumps(info))
    paths = {"causal": causal, "classifier": str(classifier), "gen_root": str(files),
             "relabelled": str(relabelled), "missing": str(root / "missing")}
    guarded = ("causal", "classifier", "gen_root", "relabelled")
    return paths, {k: tree_digest(paths[k]) for k in guarded}


@pytest.mark.parametrize("case, args, expected", bad_input_cases.GENERATE_CASES,
                         ids=[c[0] for c in bad_input_cases.GENERATE_CASES])
def test_generate_bad_input_refused_before_anything_is_written(case, args, expected,
                                                               generate_paths, capsys):
    from bert_trainer import cli  # noqa: PLC0415

    paths, before = generate_paths
    capsys.readouterr()
    rc = cli.main(["bert-train", *fill(args, paths)])
    assert_one_line(case, rc, capsys.readouterr().err, fill([expected], paths)[0])
    assert {k: tree_digest(paths[k]) for k in before} == before
    assert not os.path.exists(os.path.join(paths["gen_root"], "new.jsonl"))
    assert not os.path.exists(paths["missing"])

