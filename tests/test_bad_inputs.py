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
from robust_testing import RESULT, TESTS, subprocess_env, tree_digest

from bert_trainer.commands import common
from bert_trainer.errors import EXIT_USER_ERROR, UserError

SST2_HEADER = "sentence\tlabel\n"
GOOD_ROWS = "".join(f"a {w} film\t{i % 2}\n" for i, w in enumerate(
    ["fine", "bad", "great", "dull", "lovely", "awful", "superb", "poor"] * 3))
SQUAD_CONTEXT = "The cat sat on the mat."


def squad(answer_text: str, answer_start: int) -> str:
    qa = {"id": "q1", "question": "Who sat?",
          "answers": [{"text": answer_text, "answer_start": answer_start}]}
    return json.dumps({"version": "1.1", "data": [
        {"title": "t", "paragraphs": [{"context": SQUAD_CONTEXT, "qas": [qa]}]}]})


CONLL_GOOD = "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n. . O O\n\n"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_pretrained):
    """Every malformed file of the sweep, and model directories that must stay untouched."""
    root = tmp_path_factory.mktemp("bad_inputs")
    files = {
        "empty.tsv": "",
        "good.tsv": SST2_HEADER + GOOD_ROWS,
        "good_squad.json": squad("cat", 4),
        "good.conll": CONLL_GOOD * 3,
        "columns.tsv": SST2_HEADER + GOOD_ROWS + "a film with no label\n",
        "extra_column.tsv": SST2_HEADER + GOOD_ROWS + "a\tb\t1\n",
        "label.tsv": SST2_HEADER + GOOD_ROWS + "a great film\t7\n",
        "answer_outside.json": squad("dog", 40),
        "answer_mismatch.json": squad("dog", 4),
        "truncated.json": squad("cat", 4)[:50],
        "ragged.conll": CONLL_GOOD + "EU\nrejects VBZ B-VP O\n\n",
        "short_row.conll": CONLL_GOOD + "EU NNP\nrejects VBZ B-VP O\n\n",
        "unknown_tag.conll": CONLL_GOOD + "EU NNP B-NP B-XYZ\n\n",
        "typo.gin": "include 'configs/tiny.gin'\nTrainerConfig.train_stepz = 10\n",
        "syntax.gin": "include 'configs/tiny.gin'\nTrainerConfig.train_steps = = 3\n",
        "unknown.gin": "include 'configs/tiny.gin'\nNoSuchConfig.value = 3\n",
        "a_file": "not a directory\n",
        "lines.txt": "one line of text\n",
        "bad.jsonl": '{"text": "fine"}\nnot json\n',
    }
    paths = {"root": str(root), "pretrained": tiny_pretrained["dir"],
             "vocab": tiny_pretrained["vocab_file"], "missing": str(root / "missing.tsv")}
    for name, text in files.items():
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


FT = ["finetune", "--init_checkpoint={pretrained}", "--model_dir={existing}", "--seq_length=32",
      "--batch_size=8"]
SST2 = [*FT, "--task=sst2", "--train_steps=2", "--eval_file={good.tsv}"]
SQUAD = [*FT, "--task=squad", "--train_steps=2", "--eval_file={good_squad.json}",
         "--gin_param=SquadConfig.max_query_length = 8", "--gin_param=SquadConfig.doc_stride = 8"]
CONLL = [*FT, "--task=conll2003", "--train_steps=2", "--eval_file={good.conll}"]
PRETRAIN = ["pretrain", "--gin_file=configs/tiny.gin", "--model_dir={existing}",
            "--gin_param=build_encoder.vocab_size = 3000", "--train_data={lines.txt}",
            "--vocab_file={vocab}"]

# (case, argv, a part of the one-line message that names the offending thing). {name} is a
# path of the `paths` fixture; {fresh} is a model_dir that must still not exist afterwards.
ARCHITECTURE = "holds a checkpoint of another architecture: "
CLI_CASES = [
    ("unknown flag", ["pretrain", "--no_such_flag=1"],
     "error: Unknown command line flag 'no_such_flag'"),
    ("unknown subcommand", ["pretrian"], "unknown subcommand 'pretrian'; choose one of: "),
    ("gin typo", [*PRETRAIN, "--gin_file={typo.gin}"],
     "{typo.gin}:2: Configurable 'TrainerConfig' doesn't have a parameter named 'train_stepz'"),
    ("gin syntax error", [*PRETRAIN, "--gin_file={syntax.gin}"],
     "{syntax.gin}:2: Unable to parse value."),
    ("gin unknown configurable", [*PRETRAIN, "--gin_file={unknown.gin}"],
     "{unknown.gin}:2: No configurable matching 'NoSuchConfig'."),
    ("gin file missing", [*PRETRAIN, "--gin_file={root}/nope.gin"],
     "--gin_file={root}/nope.gin does not exist"),
    ("gin_param typo", [*PRETRAIN, "--gin_param=TrainerConfig.train_stepz = 3"],
     "--gin_param 'TrainerConfig.train_stepz = 3' (line 1): Configurable 'TrainerConfig' "
     "doesn't have a parameter named 'train_stepz'"),
    ("pretrain zero steps", [*PRETRAIN, "--gin_param=TrainerConfig.train_steps = 0"],
     "TrainerConfig: train_steps=0 must be a positive integer"),
    ("pretrain negative steps", [*PRETRAIN, "--gin_param=TrainerConfig.train_steps = -5"],
     "TrainerConfig: train_steps=-5 must be a positive integer"),
    ("pretrain zero batch", [*PRETRAIN, "--gin_param=PretrainingConfig.train_batch_size = 0"],
     "PretrainingConfig.train_batch_size=0 must be >= 1"),
    ("pretrain negative batch",
     [*PRETRAIN, "--gin_param=PretrainingConfig.train_batch_size = -16"],
     "PretrainingConfig.train_batch_size=-16 must be >= 1"),
    ("pretrain train_data matches nothing",
     [*PRETRAIN, "--model_dir={fresh}", "--train_data={root}/none-*.tfrecord"],
     "{root}/none-*.tfrecord"),
    ("pretrain train_data not TFRecord", [*PRETRAIN, "--model_dir={fresh}"], "{lines.txt}"),
    ("pretrain vocab without [CLS]", [*PRETRAIN, "--vocab_file={no_cls_vocab.txt}"],
     "vocab file {no_cls_vocab.txt} lacks the special tokens [CLS]"),
    ("pretrain checkpoint of another size",
     [*PRETRAIN, "--model_dir={pretraining_run}", "--gin_param=build_encoder.hidden_size = 64"],
     "model_dir {pretraining_run} " + ARCHITECTURE),
    ("pretrain model_dir is a file", [*PRETRAIN, "--model_dir={a_file}"],
     "--model_dir={a_file}: {a_file} is a file; give a directory"),
    ("pretrain model_dir under a file", [*PRETRAIN, "--model_dir={a_file}/run"],
     "--model_dir={a_file}/run: {a_file} is a file; give a directory"),
    ("pretrain no model_dir", ["pretrain", "--gin_file=configs/tiny.gin"],
     "--model_dir is required"),
    ("finetune unknown task", [*FT, "--task=sst3"], "unknown task 'sst3'; choose one of: "),
    ("finetune missing train_file", [*SST2, "--train_file={missing}"],
     "input file {missing} does not exist"),
    ("finetune empty train_file", [*SST2, "--train_file={empty.tsv}"],
     "input file {empty.tsv} is empty"),
    ("finetune binary train_file", [*SST2, "--train_file={binary.tsv}"],
     "{binary.tsv}:1: header has no column 'sentence'"),
    ("finetune non-UTF-8 train_file", [*SST2, "--train_file={latin1.tsv}"],
     "{latin1.tsv}:26: not UTF-8 (byte 0xe9 at byte offset 369); re-save the file as UTF-8"),
    ("finetune TSV row with too few columns", [*SST2, "--train_file={columns.tsv}"],
     "{columns.tsv}:26: expected at least 2 columns, found 1"),
    ("finetune TSV row with an extra column", [*SST2, "--train_file={extra_column.tsv}"],
     "{extra_column.tsv}:26: label 'b' is not in the label set ['negative', 'positive']"),
    ("finetune label outside the label set", [*SST2, "--train_file={label.tsv}"],
     "{label.tsv}:26: label '7' is not in the label set ['negative', 'positive']"),
    ("finetune unknown text column",
     [*FT, "--task=classification", "--train_file={good.tsv}", "--text_column=review"],
     "{good.tsv}:1: header has no column 'review' (it has ['sentence', 'label'])"),
    ("squad answer outside the context",
     [*SQUAD, "--train_file={answer_outside.json}", "--model_dir={fresh}"],
     "{answer_outside.json}"),
    ("squad answer text not at answer_start",
     [*SQUAD, "--train_file={answer_mismatch.json}", "--model_dir={fresh}"],
     "{answer_mismatch.json}"),
    ("squad truncated JSON", [*SQUAD, "--train_file={truncated.json}", "--model_dir={fresh}"],
     "{truncated.json}"),
    ("conll ragged columns", [*CONLL, "--train_file={ragged.conll}", "--model_dir={fresh}"],
     "{ragged.conll}:7: expected a word and a tag (>= 2 columns), found 1"),
    ("conll short row", [*CONLL, "--train_file={short_row.conll}", "--model_dir={fresh}"],
     "{short_row.conll}:7"),
    ("conll tag outside the tag set",
     [*CONLL, "--train_file={unknown_tag.conll}", "--model_dir={fresh}"],
     "{unknown_tag.conll}:7"),
    ("finetune vocab without [CLS]",
     [*SST2, "--train_file={good.tsv}", "--vocab_file={no_cls_vocab.txt}"],
     "vocab file {no_cls_vocab.txt} lacks the special tokens [CLS]"),
    ("finetune seq_length over max_sequence_length",
     [*SST2, "--train_file={good.tsv}", "--seq_length=1024"],
     "seq_length=1024 exceeds the encoder's max_sequence_length=64 "
     "(--init_checkpoint={pretrained}); use --seq_length <= 64"),
    ("finetune zero batch", [*SST2, "--train_file={good.tsv}", "--batch_size=0"],
     "train_batch_size=0 must be a positive integer"),
    ("finetune negative batch", [*SST2, "--train_file={good.tsv}", "--batch_size=-8"],
     "train_batch_size=-8 must be a positive integer"),
    ("finetune zero steps", [*SST2, "--train_file={good.tsv}", "--train_steps=0"],
     "TrainerConfig: train_steps=0 must be a positive integer"),
    ("finetune negative steps", [*SST2, "--train_file={good.tsv}", "--train_steps=-3"],
     "TrainerConfig: train_steps=-3 must be a positive integer"),
    ("finetune negative epochs",
     [*FT, "--task=sst2", "--train_file={good.tsv}", "--eval_file={good.tsv}",
      "--num_epochs=-1"], "num_epochs=-1.0 must be > 0"),
    ("finetune init_checkpoint missing",
     [*SST2, "--train_file={good.tsv}", "--init_checkpoint={root}/no_model"],
     "--init_checkpoint={root}/no_model does not exist"),
    ("finetune init_checkpoint truncated",
     [*SST2, "--train_file={good.tsv}", "--init_checkpoint={truncated_model}",
      "--model_dir={fresh}"], "{truncated_model}/ckpt-3"),
    ("finetune init_checkpoint pickle .bin",
     [*SST2, "--train_file={good.tsv}", "--init_checkpoint={pickle_model}"],
     "{pickle_model}/pytorch_model.bin is a pickle (loading it can run arbitrary code)"),
    ("finetune model_dir holds another model",
     [*SST2, "--train_file={good.tsv}", "--model_dir={pretraining_run}"],
     "model_dir {pretraining_run} " + ARCHITECTURE),
    ("finetune model_dir with truncated checkpoints",
     [*SST2, "--train_file={good.tsv}", "--model_dir={broken_run}"],
     "{broken_run}/checkpoint lists 1 checkpoint(s) and none is usable (ckpt-2.data holds "),
    ("finetune model_dir is a file", [*SST2, "--train_file={good.tsv}", "--model_dir={a_file}"],
     "--model_dir={a_file}: {a_file} is a file; give a directory"),
    ("evaluate missing model_dir", ["evaluate", "--model_dir={root}/nowhere"],
     "--model_dir={root}/nowhere does not exist"),
    ("evaluate model_dir without a task", ["evaluate", "--model_dir={pretraining_run}"],
     "{pretraining_run}/bert_train.json names no task"),
    ("evaluate eval_file with a bad label",
     ["evaluate", "--model_dir={existing}", "--eval_file={label.tsv}"],
     "{label.tsv}:26: label '7' is not in the label set"),
    ("evaluate truncated checkpoints",
     ["evaluate", "--model_dir={broken_run}", "--eval_file={good.tsv}"],
     "{broken_run}/checkpoint lists 1 checkpoint(s) and none is usable"),
    ("vocab missing input", ["vocab", "--input={missing}", "--output={root}/v1.txt"],
     "--input: '{missing}' matches no file"),
    ("vocab non-UTF-8 input", ["vocab", "--input={latin1.txt}", "--output={root}/v2.txt"],
     "{latin1.txt}: line 1 is not UTF-8"),
    ("vocab binary input", ["vocab", "--input={binary.tsv}", "--output={root}/v3.txt"],
     "{binary.tsv}: line 2 is not UTF-8"),
    ("vocab zero size",
     ["vocab", "--input={lines.txt}", "--output={root}/v4.txt", "--vocab_size=0"],
     "--vocab_size=0 must exceed the 5 special tokens"),
    ("create_pretraining_data vocab without [CLS]",
     ["create_pretraining_data", "--input={lines.txt}", "--vocab={no_cls_vocab.txt}",
      "--output={root}/d1-*.tfrecord"],
     "vocab file {no_cls_vocab.txt} lacks the special tokens [CLS]"),
    ("create_pretraining_data empty input",
     ["create_pretraining_data", "--input={empty.tsv}", "--vocab={vocab}",
      "--output={root}/d2-*.tfrecord"], "--input={empty.tsv} produced no examples"),
    ("create_pretraining_data max_seq_length too small",
     ["create_pretraining_data", "--input={lines.txt}", "--vocab={vocab}",
      "--output={root}/d3-*.tfrecord", "--max_seq_length=2"],
     "--max_seq_length=2 is too short"),
    ("create_pretraining_data output without *",
     ["create_pretraining_data", "--input={lines.txt}", "--vocab={vocab}",
      "--output={root}/d4.tfrecord"], "--output={root}/d4.tfrecord must hold exactly one '*'"),
]
# In subprocesses, one per command: predict's and export's --model_dir clash with the training
# commands' in one process, and convert marks --input/--output as required for every command.
SUBPROCESS_CASES = [
    ("convert pickle .bin", ["convert", "--input={pickle_model}", "--output={root}/conv1"],
     "{pickle_model}/pytorch_model.bin is a pickle (loading it can run arbitrary code)"),
    ("convert config.json not JSON",
     ["convert", "--input={bad_config_model}", "--output={root}/conv2"],
     "{bad_config_model}/config.json is not valid JSON"),
    ("convert garbage safetensors",
     ["convert", "--input={garbage_weights_model}", "--output={root}/conv3"],
     "{garbage_weights_model}/model.safetensors could not be read as safetensors"),
    ("convert missing input", ["convert", "--input={root}/no_model", "--output={root}/conv4"],
     "{root}/no_model does not exist"),
    ("convert output is a file", ["convert", "--input={pretrained}", "--output={a_file}"],
     "--output={a_file} is a file"),
    ("predict missing input", ["predict", "--model_dir={existing}", "--input={missing}"],
     "--input={missing} does not exist"),
    ("predict bad JSON line",
     ["predict", "--model_dir={existing}", "--input={bad.jsonl}", "--on_error=stop"],
     "{bad.jsonl}:2"),
    ("predict model_dir without a task",
     ["predict", "--model_dir={pretraining_run}", "--input={lines.txt}"],
     "{pretraining_run} is a pretraining model directory: it has no task to predict"),
    ("predict zero batch",
     ["predict", "--model_dir={existing}", "--input={lines.txt}", "--batch_size=0"],
     "flag --batch_size=0: 0 is not a positive integer"),
    ("export output is a file", ["export", "--model_dir={existing}", "--output={a_file}"],
     "--output={a_file} is a file"),
    ("export truncated checkpoint",
     ["export", "--model_dir={broken_run}", "--output={root}/exp2"], "{broken_run}"),
]
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
def test_convert_predict_and_export_refuse_bad_input(index, subprocess_results, paths, digests):
    case, _, expected = SUBPROCESS_CASES[index]
    result = subprocess_results[index]
    assert_refusal(case, result["rc"], result["stderr"], expected, paths, digests)


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
