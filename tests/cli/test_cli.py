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


def test_a_bad_fused_kernels_setting_is_one_line_before_any_work(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("BERT_TRAIN_FUSED_KERNELS", "yes")
    model_dir = tmp_path / "run"
    assert cli.main(["bert-train", "pretrain", "--gin_file=configs/smoke.gin",
                     f"--model_dir={model_dir}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["bert-train: BERT_TRAIN_FUSED_KERNELS='yes': expected one of auto, on, off"]
    assert not model_dir.exists()


class _LostPeer:
    """A command whose training collective fails as a MultiWorkerMirrored survivor's does."""

    def __init__(self, error_type):
        self.error_type = error_type

    def main(self, argv):
        raise self.error_type(None, None, "Socket closed\nAdditional GRPC error information: ...")


def test_a_lost_peer_worker_is_one_line_with_a_retry_exit_code(capsys):
    import tensorflow as tf

    from bert_trainer.commands import run_command
    from bert_trainer.errors import EXIT_PEER_LOST

    for error_type in (tf.errors.UnavailableError, tf.errors.AbortedError):
        assert run_command(_LostPeer(error_type), ["bert-train pretrain"]) == EXIT_PEER_LOST
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert err.startswith("bert-train pretrain: error: lost contact with another worker "
                              f"({error_type.__name__}: Socket closed)")
        assert "restart every worker with the same command" in err


def test_other_tensorflow_errors_are_not_disguised_as_a_lost_peer():
    import pytest
    import tensorflow as tf

    from bert_trainer.commands import run_command

    with pytest.raises(tf.errors.InternalError):
        run_command(_LostPeer(tf.errors.InternalError), ["bert-train pretrain"])
