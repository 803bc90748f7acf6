"""Outputs of the writing commands: replaced whole and only when ours, faults one line.

Covers what the refusal sweep (OUTPUT_CASES in bad_input_cases.py) cannot: `--overwrite` of a
command's own output succeeds and leaves nothing of the old one; an interrupt or a failure
mid-run leaves the old output byte for byte; a full disk (a small tmpfs, see disk_testing.py)
or a refused write while writing gives one line naming the path, removes the temporaries and
keeps the old output.
"""

import errno
import json
import os
import re
import subprocess
import sys

import pytest
from disk_testing import fill_disk, small_disk
from export_testing import make_model_dir
from robust_testing import subprocess_env, tree_digest

from bert_trainer import outputs
from bert_trainer.errors import EXIT_USER_ERROR, UserError

TEMPORARY = re.compile(r"\.tmp-\d+$|\.old-\d+$")
CORPUS = "".join(f"the film {i} was good . it was fine and long .\nthe end of part {i} .\n\n"
                 for i in range(60))


def temporaries(directory) -> list[str]:
    return [n for _, dirs, files in os.walk(directory) for n in dirs + files
            if TEMPORARY.search(n)]


def storage_message(message: str, writing: str, path, cause: str) -> None:
    """One line: 'writing WHAT to PATH failed: CAUSE ...; ... and run again'."""
    assert "\n" not in message, message
    assert message.startswith(f"writing {writing} to {path} failed: {cause}"), message
    assert "and run again" in message, message


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(CORPUS)
    return str(path)


@pytest.fixture
def vocab_file(tiny_pretrained):
    return tiny_pretrained["vocab_file"]


# ----------------------------------------------------------------- create_pretraining_data

def make_data(corpus, vocab_file, pattern, num_shards, seed=1, **kwargs):
    from bert_trainer.data.corpus_options import CorpusOptions  # noqa: PLC0415
    from bert_trainer.tasks.masked_lm import corpus as cpd  # noqa: PLC0415

    return cpd.create_pretraining_data(
        corpus, vocab_file, str(pattern), cpd.PretrainingDataConfig(max_seq_length=16, seed=seed),
        options=CorpusOptions(num_shards=num_shards, **kwargs), progress=None)


def test_overwrite_replaces_the_whole_shard_set(corpus, vocab_file, tmp_path):
    data = tmp_path / "data"
    make_data(corpus, vocab_file, data / "train-*.tfrecord", 3)
    summary = make_data(corpus, vocab_file, data / "train-*.tfrecord", 2, seed=2, overwrite=True)
    names = ["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]
    assert sorted(os.listdir(data)) == [*names, "train-summary.json"]  # no old shard left
    assert summary["shards"] == names
    assert json.loads((data / "train-summary.json").read_text())["config"]["seed"] == 2


@pytest.mark.parametrize("where", ["writing", "swapping"])
def test_an_interrupt_leaves_the_old_set_and_summary(corpus, vocab_file, tmp_path, monkeypatch,
                                                     where):
    from bert_trainer.tasks.masked_lm import corpus as cpd  # noqa: PLC0415

    data = tmp_path / "data"
    make_data(corpus, vocab_file, data / "train-*.tfrecord", 3)
    before = tree_digest(data)
    if where == "writing":
        def interrupted(*args):
            raise KeyboardInterrupt

        monkeypatch.setattr(cpd, "_process_chunk", interrupted)
    else:  # after the old summary and two old shards went aside
        real_rename, calls = os.rename, []

        def rename(src, dst):
            calls.append(src)
            if len(calls) == 3:
                raise KeyboardInterrupt
            real_rename(src, dst)

        monkeypatch.setattr(outputs.os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        make_data(corpus, vocab_file, data / "train-*.tfrecord", 2, overwrite=True)
    assert tree_digest(data) == before
    assert not temporaries(tmp_path)


def test_a_refused_write_mid_run_is_one_line(corpus, vocab_file, tmp_path, monkeypatch):
    import tensorflow as tf  # noqa: PLC0415

    from bert_trainer.tasks.masked_lm import corpus as cpd  # noqa: PLC0415

    data = tmp_path / "data"
    make_data(corpus, vocab_file, data / "train-*.tfrecord", 2)
    before = tree_digest(data)
    real_writer = tf.io.TFRecordWriter

    class RefusingWriter(real_writer):
        def write(self, record):
            raise tf.errors.PermissionDeniedError(None, None, f"{data}/x; Permission denied")

    monkeypatch.setattr(cpd.tf.io, "TFRecordWriter", RefusingWriter)
    with pytest.raises(UserError) as e:
        make_data(corpus, vocab_file, data / "train-*.tfrecord", 2, overwrite=True)
    storage_message(str(e.value), "pretraining data", data / "train-shards.tfrecord",
                    "permission denied")
    assert tree_digest(data) == before and not temporaries(tmp_path)


@pytest.mark.slow
def test_create_pretraining_data_on_a_full_disk(corpus, vocab_file, tmp_path):
    with small_disk(512) as disk:
        pattern = os.path.join(disk, "train-*.tfrecord")
        make_data(corpus, vocab_file, pattern, 1)
        before = tree_digest(disk)
        big = tmp_path / "big.txt"
        big.write_text(CORPUS * 40)
        fill_disk(disk, leave_bytes=64 << 10)
        before["filler.bin"] = tree_digest(disk)["filler.bin"]
        proc = subprocess.run(
            [sys.executable, "-m", "bert_trainer.cli", "create_pretraining_data",
             f"--input={big}", f"--vocab={vocab_file}", f"--output={pattern}",
             "--max_seq_length=64", "--dupe_factor=3", "--overwrite"],
            capture_output=True, text=True, env=subprocess_env(), timeout=600)
        assert proc.returncode == EXIT_USER_ERROR, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.startswith("bert-train")]
        assert len(lines) == 1, proc.stderr[-3000:]
        assert lines[0].startswith(f"bert-train create_pretraining_data: error: writing "
                                   f"pretraining data to {disk}/train-shards.tfrecord failed: "
                                   "no space left on the device"), lines[0]
        assert tree_digest(disk) == before  # the old set, its summary and nothing else


# ------------------------------------------------------------------------------- export

@pytest.fixture(scope="module")
def serving_module(tmp_path_factory):
    from bert_trainer.export import build_serving_module  # noqa: PLC0415

    path, _ = make_model_dir(tmp_path_factory.mktemp("export_src") / "model", "classification")
    return build_serving_module(str(path))


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_export_overwrite_replaces_its_own_export_only(serving_module, tmp_path):
    from bert_trainer.export import exporter  # noqa: PLC0415

    out = tmp_path / "export"
    exporter.save(serving_module, str(out))
    entries = sorted(os.listdir(out))
    assert outputs.MARKER in entries and "saved_model.pb" in entries
    (out / "variables" / "stale.bin").write_bytes(b"old")  # inside the SavedModel: ours
    exporter.save(serving_module, str(out), overwrite=True)
    assert not (out / "variables" / "stale.bin").exists()
    (out / outputs.MARKER).unlink()  # an export made before markers: a SavedModel only
    exporter.save(serving_module, str(out), overwrite=True)
    (out / "README.md").write_text("mine")
    before = tree_digest(out)
    with pytest.raises(UserError, match=rf"^--output={out} holds README.md besides what "
                       "bert-train export wrote there"):
        exporter.save(serving_module, str(out), overwrite=True)
    assert tree_digest(out) == before and not temporaries(tmp_path)


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_export_on_a_full_disk_keeps_the_old_export(serving_module):
    from bert_trainer.export import exporter  # noqa: PLC0415

    with small_disk(4096) as disk:
        out = os.path.join(disk, "export")
        exporter.save(serving_module, out)
        before = tree_digest(disk)
        fill_disk(disk, leave_bytes=96 << 10)
        before["filler.bin"] = tree_digest(disk)["filler.bin"]
        with pytest.raises(UserError) as e:
            exporter.save(serving_module, out, overwrite=True)
        storage_message(str(e.value), "SavedModel", out, "no space left on the device")
        assert re.search(r"\(needs about [0-9.]+ MB, [0-9.]+ MB free\)", str(e.value))
        assert tree_digest(disk) == before


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_export_refused_mid_write_keeps_the_old_export(serving_module, tmp_path, monkeypatch):
    import tensorflow as tf  # noqa: PLC0415

    from bert_trainer.export import exporter  # noqa: PLC0415

    out = tmp_path / "export"
    exporter.save(serving_module, str(out))
    before = tree_digest(tmp_path)
    real_save = tf.saved_model.save

    def refused(module, staging, **kwargs):
        real_save(module, staging, **kwargs)  # written, then a late write is refused
        raise tf.errors.PermissionDeniedError(
            None, None, f"{staging}/variables/variables_temp; Permission denied")

    monkeypatch.setattr(exporter.tf.saved_model, "save", refused)
    with pytest.raises(UserError) as e:
        exporter.save(serving_module, str(out), overwrite=True)
    storage_message(str(e.value), "SavedModel", out, "permission denied")
    assert tree_digest(tmp_path) == before


# ---------------------------------------------------------------- vocab, convert, predict

@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_vocab_on_a_full_disk_and_a_refused_write(corpus, tmp_path, monkeypatch):
    from bert_trainer.data.vocab import learn_vocab  # noqa: PLC0415

    with small_disk(64) as disk:
        out = os.path.join(disk, "vocab.txt")
        learn_vocab(corpus, 60, out, progress=None, lower_thresh=1)
        before = tree_digest(disk)
        fill_disk(disk)
        before["filler.bin"] = tree_digest(disk)["filler.bin"]
        with pytest.raises(UserError) as e:
            learn_vocab(corpus, 60, out, overwrite=True, progress=None, lower_thresh=1)
        storage_message(str(e.value), "the vocabulary", out, "no space left on the device")
        assert tree_digest(disk) == before

    def refuse(*args):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(outputs.os, "replace", refuse)  # the rename into place is refused
    target = tmp_path / "out" / "vocab.txt"
    with pytest.raises(UserError) as e:
        learn_vocab(corpus, 60, str(target), progress=None, lower_thresh=1)
    storage_message(str(e.value), "the vocabulary", target, "permission denied")
    assert sorted(os.listdir(tmp_path)) == ["corpus.txt"]  # nor the directory it made


def test_convert_on_a_full_disk_keeps_the_old_output(tiny_pretrained):
    from bert_trainer.commands.convert import convert  # noqa: PLC0415

    with small_disk(2048) as disk:
        out = os.path.join(disk, "hf")
        convert(tiny_pretrained["dir"], out, to="hf", log=lambda _: None)
        before = tree_digest(disk)
        fill_disk(disk, leave_bytes=32 << 10)
        before["filler.bin"] = tree_digest(disk)["filler.bin"]
        with pytest.raises(UserError) as e:
            convert(tiny_pretrained["dir"], out, to="hf", overwrite=True, log=lambda _: None)
        storage_message(str(e.value), "the converted hf model", out,
                        "no space left on the device")
        assert "(needs about " in str(e.value)
        assert tree_digest(disk) == before


def test_predict_on_a_full_disk_keeps_the_old_output(tmp_path):
    import tensorflow as tf  # noqa: PLC0415

    from bert_trainer.export import predict  # noqa: PLC0415

    predictor = predict.Predictor(("text",), lambda text: {"score": tf.zeros_like(
        tf.strings.length(text), tf.float32)}, "regression")
    source = tmp_path / "in.txt"
    source.write_text("".join(f"{'a long input line ' * 20}{i}\n" for i in range(400)))
    with small_disk(64) as disk:
        out = os.path.join(disk, "predictions.jsonl")
        with open(out, "w") as f:
            f.write('{"line": 1, "text": "old", "score": 0.5}\n')
        fill_disk(disk, leave_bytes=16 << 10)
        before = tree_digest(disk)
        with pytest.raises(UserError) as e:
            predict.run_predict(predictor, str(source), out, overwrite=True,
                                stderr=open(os.devnull, "w"))
        storage_message(str(e.value), "predictions", out, "no space left on the device")
        assert tree_digest(disk) == before
