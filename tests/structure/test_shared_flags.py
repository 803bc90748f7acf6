"""Every `bert-train` command module imported into one process: one definition per flag name,
each command's `--help` lists its own flags with its own meaning, and commands run one after
another in-process with their own defaults and no value leaking from the previous run."""

import importlib
import re

import pytest
from absl import flags
from conftest import REPO

from bert_trainer import cli
from bert_trainer.commands import shared_flags

FLAGS = flags.FLAGS
# All of them, before any test runs: the point is that importing them together cannot fail.
COMMANDS = {name: importlib.import_module(f"bert_trainer.commands.{name}")
            for name in cli.SUBCOMMANDS}


def _bert_trainer_flags() -> dict[str, str]:
    """Flag name -> the bert_trainer module that defines it."""
    return {name: module for module, defined in FLAGS.flags_by_module_dict().items()
            if module.startswith("bert_trainer.") for name in (f.name for f in defined)}


def _own_flag_names(module) -> set[str]:
    return {flag.name for flag in FLAGS.get_key_flags_for_module(module)}


def run(capsys, *argv) -> tuple[int, list[str]]:
    """Runs `bert-train ARGV` in this process; returns its exit code and stderr lines."""
    code = cli.main(["bert-train", *argv])
    return code, capsys.readouterr().err.strip().splitlines()


def test_no_flag_may_be_silently_replaced():
    # allow_override would let a second definition replace the first (its default and help
    # included) instead of failing: that is how vocab's --lower_case once became None after
    # `finetune` was imported.
    overridable = sorted(name for name in _bert_trainer_flags() if FLAGS[name].allow_override)
    assert overridable == []
    defined_by = _bert_trainer_flags()
    assert {defined_by[name] for name in shared_flags.NAMES} == {shared_flags.__name__}


def test_every_shared_flag_is_taken_by_two_commands_and_only_there_defined():
    takers = {name: [cmd for cmd, module in COMMANDS.items()
                     if name in getattr(module, "SHARED_FLAGS", {})]
              for name in shared_flags.NAMES}
    assert {name: len(cmds) >= 2 for name, cmds in takers.items()} == dict.fromkeys(
        shared_flags.NAMES, True), takers
    for name, module in COMMANDS.items():
        usages = getattr(module, "SHARED_FLAGS", {})
        # Every shared flag a command reads is one of its key flags (so --help lists it).
        assert set(usages) <= _own_flag_names(module), name


def test_declare_rejects_a_name_that_is_not_shared():
    with pytest.raises(ValueError, match=r"\['vocab_size'\] are not shared flags"):
        shared_flags.declare("some.module", vocab_size=shared_flags.Usage(1, "x"))


@pytest.mark.parametrize("name", list(cli.SUBCOMMANDS))
def test_help_lists_the_commands_flags_with_its_own_help(name, capsys):
    assert cli.main(["bert-train", name, "--help"]) == 0
    out = capsys.readouterr().out
    listed = {line.split(":")[0].strip().removeprefix("--").removeprefix("[no]")
              for line in out.split("\nflags:\n", 1)[1].splitlines() if line.startswith("  --")}
    module = COMMANDS[name]
    assert listed == _own_flag_names(module) | {"verbose"}
    flat = " ".join(out.split())  # help lines are wrapped at 80 columns
    for flag, usage in getattr(module, "SHARED_FLAGS", {}).items():
        assert usage.help in flat, (flag, usage.help)
        assert FLAGS[flag].help not in flat or FLAGS[flag].help in usage.help


def test_help_shows_each_commands_own_default(capsys):
    cli.main(["bert-train", "predict", "--help"])
    predict_help = capsys.readouterr().out
    assert ("  --output: Output JSON lines file, or - for stdout.\n    (default: '-')\n"
            in predict_help)
    assert "  --batch_size: Inputs per model call.\n    (default: '32')\n" in predict_help
    cli.main(["bert-train", "vocab", "--help"])
    vocab_help = capsys.readouterr().out
    assert ("  --[no]lower_case: Lower-case and strip accents (uncased model).\n"
            "    (default: 'true')\n" in vocab_help)
    assert "--checkpoint" not in vocab_help and "--model_dir" not in vocab_help
    cli.main(["bert-train", "finetune", "--help"])
    finetune_help = capsys.readouterr().out
    # finetune's --lower_case has no default of its own: the checkpoint's is used.
    entry = finetune_help.split("  --[no]lower_case: ", 1)[1].split("\n  --", 1)[0]
    assert " ".join(entry.split()) == ("Lower-case text; default: --init_checkpoint's (from "
                                       "scratch: cased when --vocab_file has capitals).")


def test_commands_run_one_after_another_with_their_own_defaults(capsys, tmp_path):
    code, err = run(capsys, "predict", "--input=in.txt", f"--output={tmp_path}/o.jsonl")
    assert (code, err) == (2, ["bert-train predict: error: pass exactly one of --model_dir (a "
                               "trained run) and --saved_model (an export)"])
    assert (FLAGS.output, FLAGS.batch_size) == (f"{tmp_path}/o.jsonl", 32)

    code, err = run(capsys, "export", f"--model_dir={tmp_path}")  # predict's --output is gone
    assert (code, err) == (2, ["bert-train export: error: --output is required (see --help)"])
    assert (FLAGS.output, FLAGS.overwrite, FLAGS.batch_size) == (None, False, None)

    code, err = run(capsys, "vocab", f"--output={tmp_path}/vocab.txt")
    assert (code, err) == (2, ["bert-train vocab: error: --input is required (see "
                               "'bert-train vocab --help')"])
    assert (FLAGS.lower_case, FLAGS.encoding_errors) == (True, "strict")

    code, err = run(capsys, "evaluate")
    assert code == 2 and err[0].startswith("bert-train evaluate: error: --model_dir is required")
    assert (FLAGS.checkpoint, FLAGS.batch_size, FLAGS.lower_case) == ("latest", 32, None)

    code, err = run(capsys, "create_pretraining_data", "--input=a.txt", "--nolower_case")
    assert (code, err) == (2, ["bert-train create_pretraining_data: error: --vocab is required "
                               "(see 'bert-train create_pretraining_data --help')"])
    assert (FLAGS.lower_case, FLAGS.checkpoint, FLAGS.overwrite) == (False, None, False)

    code, err = run(capsys, "predict", "--input=in.txt", "--batch_size=4")
    assert code == 2 and (FLAGS.output, FLAGS.batch_size) == ("-", 4)


@pytest.mark.parametrize("argv, flag", [
    (["vocab", "--checkpoint=best"], "checkpoint"),  # shared, but not a flag of vocab
    (["predict", "--vocab_size=10"], "vocab_size"),  # another command's own flag
    (["export", "--gin_file=a.gin"], "gin_file"),  # the training commands' flag
])
def test_a_flag_of_another_command_is_refused(argv, flag, capsys):
    code, err = run(capsys, *argv)
    assert (code, err) == (2, [f"bert-train {argv[0]}: error: Unknown command line flag "
                               f"'{flag}' (see 'bert-train {argv[0]} --help')"])


def test_absl_logging_flags_stay_accepted(capsys, tmp_path):
    code, err = run(capsys, "vocab", "--verbosity=-1", f"--output={tmp_path}/v.txt")
    assert (code, err) == (2, ["bert-train vocab: error: --input is required (see "
                               "'bert-train vocab --help')"])


def test_every_flag_is_declared_one_way():
    # A command's flags, its own (`Flag`) and the shared ones it takes (`Usage`), are declared
    # in its `shared_flags.declare` call; absl's DEFINE_* is called in shared_flags alone.
    package = REPO / "bert_trainer"
    others = [str(path.relative_to(REPO)) for path in sorted(package.rglob("*.py"))
              if path.name != "shared_flags.py"
              and re.search(r"\bflags\.DEFINE|\bDEFINE_[a-z]+\(|define_float\(",
                            path.read_text(encoding="utf-8"))]
    assert not others, f"flags declared another way than shared_flags.declare: {others}"
    assert 'kind == "float"' in (package / "commands" / "shared_flags.py").read_text()
