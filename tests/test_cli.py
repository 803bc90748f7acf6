"""The `bert-train` dispatcher: usage, unknown subcommands, and commands sharing one process."""

from bert_trainer import cli


def test_usage_lists_every_subcommand(capsys):
    assert cli.main(["bert-train", "--help"]) == 0
    out = capsys.readouterr().out
    for name in cli.SUBCOMMANDS:
        assert f"  {name} " in out


def test_unknown_subcommand_names_the_choices(capsys):
    assert cli.main(["bert-train", "pretrian"]) == 2
    err = capsys.readouterr().err
    assert "unknown subcommand 'pretrian'" in err and "pretrain" in err


def test_importing_one_command_does_not_constrain_another(capsys):
    # convert/export/predict check their required flags in main(): a process-global absl
    # validator would make every other command fail once they are imported.
    import bert_trainer.commands.convert  # noqa: F401

    assert cli.main(["bert-train", "vocab", "--output=/nonexistent/vocab.txt"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["bert-train vocab: error: --input is required (see 'bert-train vocab --help')"]
    assert cli.main(["bert-train", "convert"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["bert-train convert: error: --input and --output are required (see --help)"]
