"""SIGTERM is an interrupt: every command cleans up on SIGTERM (and SIGHUP) as on Ctrl-C, and
the model_dir's own write-aside files follow the `.NAME.tmp-PID` naming."""

import os
import signal
import types

import pytest

from bert_trainer import outputs
from bert_trainer.commands import run_command


def writing_command(output, signum):
    """A command that writes `output` aside (as export/predict/convert do) and is signalled
    half way through."""
    def main(argv):
        with outputs.new_file(str(output), writing="predictions") as f:
            f.write('{"line": 1}\n')
            os.kill(os.getpid(), signum)
            f.write('{"line": 2}\n')  # not reached: the signal interrupts the write
        return 0

    return types.SimpleNamespace(__name__="fake_command", __doc__="A test command.", main=main)


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130),
                                          (signal.SIGHUP, 129)])
def test_a_signal_mid_write_leaves_the_old_output_and_no_temporary(tmp_path, capsys, signum,
                                                                   code):
    output = tmp_path / "predictions.jsonl"
    output.write_text('{"line": 0}\n')
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    # Python's own Ctrl-C handler: a process started in the background by a shell without job
    # control (`make test &`) inherits SIGINT ignored, and Python then leaves it so.
    interrupts = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        rc = run_command(writing_command(output, signum), ["bert-train predict"])
    finally:
        signal.signal(signal.SIGINT, interrupts)
    assert rc == code
    assert capsys.readouterr().err.strip() == "bert-train predict: interrupted"
    assert output.read_text() == '{"line": 0}\n'
    assert sorted(os.listdir(tmp_path)) == ["predictions.jsonl"]  # no .predictions.jsonl.tmp-PID
    # restored after the command
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before


def test_model_dir_files_are_written_aside_as_dot_name_tmp_pid(tmp_path, monkeypatch):
    import tensorflow as tf  # noqa: PLC0415

    from bert_trainer.checkpoints import storage  # noqa: PLC0415

    renamed = []
    real = tf.io.gfile.rename
    monkeypatch.setattr(tf.io.gfile, "rename",
                        lambda src, dst, overwrite=False: (renamed.append((src, dst)),
                                                           real(src, dst, overwrite)))
    storage.write_text_atomically(str(tmp_path / "operative_config.gin"), "x = 1\n")
    pid = os.getpid()
    assert renamed == [(str(tmp_path / f".operative_config.gin.tmp-{pid}"),
                        str(tmp_path / "operative_config.gin"))]
    assert sorted(os.listdir(tmp_path)) == ["operative_config.gin"]


def test_leftovers_of_dead_processes_are_removed_when_the_next_run_starts(tmp_path, caplog):
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from bert_trainer.training import run_lock  # noqa: PLC0415

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    model_dir = tmp_path / "run"
    (model_dir / "ckpt-7_temp").mkdir(parents=True)
    (model_dir / "ckpt-7_temp" / "part-00000-of-00001.data-00000-of-00001").write_text("x")
    (model_dir / "best" / "ckpt-3_temp").mkdir(parents=True)
    (model_dir / f".bert_train.json.tmp-{dead}").write_text("{")
    (model_dir / f".eval_results.json.tmp-{os.getppid()}").write_text("{")  # a live process's
    (model_dir / f".export.old-{dead}").mkdir()  # a previous output set aside: kept
    (model_dir / "ckpt-6.index").write_text("kept")
    with caplog.at_level("WARNING"), run_lock.acquire(str(model_dir), "bert-train finetune"):
        left = sorted(os.listdir(model_dir))
    assert left == sorted([f".eval_results.json.tmp-{os.getppid()}", f".export.old-{dead}",
                           ".bert_train.lock", "best", "ckpt-6.index"])
    assert os.listdir(model_dir / "best") == []
    assert (f"Removed what an interrupted run left in {model_dir}: .bert_train.json.tmp-{dead}, "
            "ckpt-7_temp, best/ckpt-3_temp") in caplog.text
