"""create_pretraining_data --runner=DirectRunner: the local output, byte for byte.

The Beam pipeline (bert_trainer.data.beam) must write the same shards and summary counts as the
local path for the same seed and inputs, whatever the number of workers on either side, for
both objectives; without Apache Beam installed, or with an unknown runner, a run stops in one
line before anything is written.
"""

import json
import pathlib
import sys
import types
import uuid

import pytest
import tensorflow as tf
from absl import flags

from bert_trainer import cli
from bert_trainer.data import pretraining_data_report as report
from bert_trainer.data.corpus_options import CorpusOptions
from bert_trainer.errors import UserError
from bert_trainer.tasks.causal_lm import corpus as causal_lm_data
from bert_trainer.tasks.masked_lm import corpus as cpd

# Beam's in-process runner with two worker threads: chunks made and shards written in bundles
# on both, in whatever order they finish.
TWO_WORKERS = "--direct_num_workers=2 --direct_running_mode=multi_threading"


@pytest.fixture
def corpus(shared_dir):
    """Blake's two books of poems (prose, ~90 KB, 99 documents in 2 files)."""
    return str(shared_dir / "data" / "corpus" / "gutenberg" / "blake-*.txt")


@pytest.fixture
def beam():
    return pytest.importorskip("apache_beam", reason="pip install 'bert-trainer[beam]'")


def _files(directory):
    """Every file the run left: shards by name (bytes), the summary without run keys."""
    out = {}
    for path in sorted(directory.iterdir()):
        if path.name.endswith("summary.json"):
            summary = json.loads(path.read_text())
            out[path.name] = {k: v for k, v in summary.items() if k not in report.RUN_KEYS}
        else:
            out[path.name] = path.read_bytes()
    return out


def test_direct_runner_writes_the_local_masked_lm_bytes(beam, corpus, vocab_file, tmp_path):
    # Chunks of 10 documents: 10 chunks, one of them across the two files.
    config = cpd.PretrainingDataConfig(max_seq_length=64, seed=11, chunk_documents=10,
                                       static_masking=True, dupe_factor=2)
    runs = {"local": {"num_workers": 1}, "local-2": {"num_workers": 2},
            "direct-1": {"runner": "DirectRunner"},
            "direct-2": {"runner": "DirectRunner", "beam_options": TWO_WORKERS}}
    summaries, files = {}, {}
    for name, kwargs in runs.items():
        summaries[name] = cpd.create_pretraining_data(
            corpus, vocab_file, str(tmp_path / name / "t-*.tfrecord"), config,
            options=CorpusOptions(num_shards=3, **kwargs), progress=None)
        files[name] = _files(tmp_path / name)
    local = files["local"]
    assert sorted(local) == [f"t-0000{i}-of-00003.tfrecord" for i in range(3)] + [
        "t-summary.json"]
    assert local["t-summary.json"]["documents"] == 99 and all(
        len(local[f"t-0000{i}-of-00003.tfrecord"]) > 10_000 for i in range(3))
    for name in runs:
        assert files[name] == local, name
        assert summaries[name]["examples"] == summaries["local"]["examples"] > 400
    assert summaries["direct-2"]["throughput"]["runner"] == "DirectRunner"
    assert summaries["direct-2"]["throughput"]["num_workers"] == 2


def test_direct_runner_writes_the_local_causal_lm_bytes(beam, corpus, vocab_file, tmp_path):
    # Blocks of 64 tokens span documents and chunks (of 3 documents, some shorter than a block).
    config = causal_lm_data.CausalDataConfig(block_size=64, seed=5, chunk_documents=3)
    runs = {"local": {}, "direct-1": {"runner": "DirectRunner"},
            "direct-2": {"runner": "DirectRunner", "beam_options": TWO_WORKERS}}
    summaries, files = {}, {}
    for name, kwargs in runs.items():
        summaries[name] = causal_lm_data.create_causal_lm_data(
            corpus, vocab_file, str(tmp_path / name / "c-*.tfrecord"), config,
            options=CorpusOptions(examples_per_shard=100, **kwargs), progress=None)
        files[name] = _files(tmp_path / name)
    local = summaries["local"]
    assert local["examples"] > 200 and 0 < local["tokens_dropped"] < 64
    assert len(files["local"]) == -(-local["examples"] // 100) + 1 >= 4
    for name in runs:
        assert files[name] == files["local"], name
        assert summaries[name]["tokens_dropped"] == local["tokens_dropped"]


def test_command_line_direct_runner(beam, corpus, vocab_file, tmp_path, capsys):
    flags.FLAGS.unparse_flags()
    common = [f"--input={corpus}", f"--vocab={vocab_file}", "--max_seq_length=48",
              "--examples_per_shard=200"]
    assert cli.main(["bert-train", "create_pretraining_data", *common, "--num_workers=1",
                     f"--output={tmp_path}/local/t-*.tfrecord"]) == 0
    flags.FLAGS.unparse_flags()
    assert cli.main(["bert-train", "create_pretraining_data", *common, "--runner=DirectRunner",
                     f"--beam_options={TWO_WORKERS}",
                     f"--output={tmp_path}/beam/t-*.tfrecord"]) == 0
    flags.FLAGS.unparse_flags()
    assert "examples/s on 2 worker(s) of DirectRunner" in capsys.readouterr().out
    assert _files(tmp_path / "beam") == _files(tmp_path / "local")


def test_a_failing_pipeline_keeps_the_old_set(beam, corpus, vocab_file, tmp_path):
    bad = tmp_path / "text" / "bad.txt"
    bad.parent.mkdir()
    bad.write_bytes(b"A first sentence.\nA second one.\n\nNot \xff UTF-8.\nEnd.\n")
    pattern = tmp_path / "data" / "t-*.tfrecord"
    cpd.create_pretraining_data(corpus, vocab_file, str(pattern),
                                options=CorpusOptions(num_shards=2), progress=None)
    old = {p.name: p.read_bytes() for p in (tmp_path / "data").iterdir()}
    with pytest.raises(UserError) as e:
        cpd.create_pretraining_data(
            [corpus, str(bad)], vocab_file, str(pattern),
            options=CorpusOptions(num_shards=2, overwrite=True, runner="DirectRunner"),
            progress=None)
    # The worker's one-line error, without Beam's step name; the old set as it was.
    assert str(e.value) == (f"{bad}: line 4 is not UTF-8 (invalid start byte at byte 4); "
                            "convert the file to UTF-8 or pass --encoding_errors=replace|skip")
    assert {p.name: p.read_bytes() for p in (tmp_path / "data").iterdir()} == old


def test_without_apache_beam_a_runner_fails_in_one_line(corpus, vocab_file, tmp_path,
                                                        monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "apache_beam", None)  # `import apache_beam` fails.
    with pytest.raises(UserError, match=r"^--runner=DirectRunner needs Apache Beam, which is "
                       r"not installed: pip install 'bert-trainer\[beam\]'$"):
        cpd.create_pretraining_data(corpus, vocab_file, str(tmp_path / "d" / "t-*.tfrecord"),
                                    options=CorpusOptions(runner="DirectRunner"), progress=None)
    flags.FLAGS.unparse_flags()
    rc = cli.main(["bert-train", "create_pretraining_data", f"--input={corpus}",
                   f"--vocab={vocab_file}", f"--output={tmp_path}/d/t-*.tfrecord",
                   "--runner=SparkRunner", "--beam_options=--spark_master_url=spark://m:7077"])
    flags.FLAGS.unparse_flags()
    err = capsys.readouterr().err
    assert rc == 2
    assert err == ("bert-train create_pretraining_data: error: --runner=SparkRunner needs "
                   "Apache Beam, which is not installed: pip install 'bert-trainer[beam]'\n")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("args, message", [
    (["--runner=Direct"], "--runner=Direct is unknown; use one of local, DirectRunner, "),
    (["--beam_options=--direct_num_workers=2"], "--beam_options apply to a Beam --runner"),
    (["--runner=DirectRunner", "--beam_options=direct_num_workers=2"],
     "--beam_options: 'direct_num_workers=2' is not an option"),
    (["--runner=DirectRunner", "--beam_options=--runner=FlinkRunner"],
     "--beam_options must not hold --runner"),
    (["--runner=DirectRunner", "--num_workers=2"], "--num_workers is for --runner=local"),
    (["--runner=DirectRunner", "--tfds=imdb_reviews"], "--runner=DirectRunner reads text files"),
])
def test_bad_runner_arguments_fail_in_one_line(args, message, corpus, vocab_file, tmp_path,
                                               capsys, monkeypatch):
    if "--tfds=imdb_reviews" not in args:
        args = [f"--input={corpus}", *args]
    # The arguments are refused before Beam is looked for.
    monkeypatch.setitem(sys.modules, "apache_beam", None)
    flags.FLAGS.unparse_flags()
    rc = cli.main(["bert-train", "create_pretraining_data", f"--vocab={vocab_file}",
                   f"--output={tmp_path}/d/t-*.tfrecord", *args])
    flags.FLAGS.unparse_flags()
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith(f"bert-train create_pretraining_data: error: {message}"), err
    assert err.count("\n") == 1
    assert not (tmp_path / "d").exists()


def _ram_files(directory):
    """`_files` of a directory on TensorFlow's in-memory file system (ram://)."""
    out = {}
    for name in sorted(tf.io.gfile.listdir(directory)):
        with tf.io.gfile.GFile(f"{directory}/{name}", "rb") as f:
            data = f.read()
        if name.endswith("summary.json"):
            summary = json.loads(data)
            out[name] = {k: v for k, v in summary.items() if k not in report.RUN_KEYS}
        else:
            out[name] = data
    return out


def _to_ram(paths, directory):
    """Copies local files to `directory` on ram://; returns their new paths."""
    tf.io.gfile.makedirs(directory)
    copied = []
    for path in paths:
        copied.append(f"{directory}/{path.name}")
        tf.io.gfile.copy(str(path), copied[-1])
    return copied


def test_direct_runner_reads_and_writes_through_tf_io_gfile(beam, corpus, vocab_file,
                                                             shared_dir, tmp_path):
    # ram:// (TensorFlow's in-memory file system) stands in for gs://: both are reached only
    # through tf.io.gfile, and the DirectRunner's threads share this process's ram://.
    root = f"ram://beam-{uuid.uuid4().hex}"
    books = sorted((shared_dir / "data" / "corpus" / "gutenberg").glob("blake-*.txt"))
    ram_corpus = ",".join(_to_ram(books, f"{root}/text"))
    ram_vocab = _to_ram([pathlib.Path(vocab_file)], f"{root}/vocab")[0]
    config = cpd.PretrainingDataConfig(max_seq_length=64, seed=11, chunk_documents=10,
                                       static_masking=True)
    local = cpd.create_pretraining_data(corpus, vocab_file, str(tmp_path / "local" / "t-*.tf"),
                                        config, options=CorpusOptions(num_shards=3), progress=None)
    expected = _files(tmp_path / "local")
    del expected["t-summary.json"]["vocab_file"]
    runs = {"all-ram": (ram_corpus, ram_vocab, TWO_WORKERS),  # Text, vocab and output on ram://.
            "local-text": (corpus, vocab_file, "")}  # Local text and vocab, output on ram://.
    for name, (inputs, vocab, options) in runs.items():
        summary = cpd.create_pretraining_data(inputs, vocab, f"{root}/{name}/t-*.tf", config,
                                              options=CorpusOptions(
                                                  num_shards=3, runner="DirectRunner",
                                                  beam_options=options), progress=None)
        files = _ram_files(f"{root}/{name}")  # No staging directory or temporary file left.
        assert files.pop("t-summary.json").pop("vocab_file") == (
            ram_vocab if vocab == ram_vocab else str(vocab_file))
        assert files == {k: v for k, v in expected.items() if k != "t-summary.json"}, name
        assert summary["examples"] == local["examples"] > 200
        assert summary["throughput"]["text_mb"] == local["throughput"]["text_mb"] > 0.05
    # The local runner reads and writes the same paths through tf.io.gfile too.
    cpd.create_pretraining_data(ram_corpus, ram_vocab, f"{root}/by-local/t-*.tf", config,
                                options=CorpusOptions(num_shards=3, num_workers=1),
                                progress=None)
    files = _ram_files(f"{root}/by-local")  # ram:// lists by prefix: not "local*"
    assert files.pop("t-summary.json").pop("vocab_file") == ram_vocab
    assert files == {k: v for k, v in expected.items() if k != "t-summary.json"}
    # --overwrite on an object store: the new set replaces the old one, stale shards go.
    with pytest.raises(UserError, match="already matches 3 file"):
        cpd.create_pretraining_data(ram_corpus, ram_vocab, f"{root}/all-ram/t-*.tf", config,
                                    options=CorpusOptions(num_shards=2, runner="DirectRunner"),
                                    progress=None)
    cpd.create_pretraining_data(ram_corpus, ram_vocab, f"{root}/all-ram/t-*.tf", config,
                                options=CorpusOptions(num_shards=2, runner="DirectRunner",
                                                      overwrite=True),
                                progress=None)
    cpd.create_pretraining_data(corpus, vocab_file, str(tmp_path / "local-2" / "t-*.tf"),
                                config, options=CorpusOptions(num_shards=2), progress=None)
    two = _files(tmp_path / "local-2")
    ram_two = _ram_files(f"{root}/all-ram")
    assert sorted(ram_two) == ["t-00000-of-00002.tf", "t-00001-of-00002.tf", "t-summary.json"]
    assert {k: v for k, v in ram_two.items() if k != "t-summary.json"} == {
        k: v for k, v in two.items() if k != "t-summary.json"}
    tf.io.gfile.rmtree(root)


def test_causal_lm_on_tf_io_gfile_paths(beam, corpus, vocab_file, tmp_path):
    root = f"ram://beam-{uuid.uuid4().hex}"
    config = causal_lm_data.CausalDataConfig(block_size=64, seed=5, chunk_documents=3)
    causal_lm_data.create_causal_lm_data(corpus, vocab_file, str(tmp_path / "c-*.tf"), config,
                                         options=CorpusOptions(examples_per_shard=100),
                                         progress=None)
    summary = causal_lm_data.create_causal_lm_data(
        corpus, vocab_file, f"{root}/c-*.tf", config,
        options=CorpusOptions(examples_per_shard=100, runner="DirectRunner",
                              beam_options=TWO_WORKERS), progress=None)
    assert summary["examples"] > 200
    assert _ram_files(root) == _files(tmp_path)
    tf.io.gfile.rmtree(root)


def test_dataflow_runner_with_local_paths_fails_in_one_line(beam, corpus, vocab_file, tmp_path,
                                                            capsys):
    flags.FLAGS.unparse_flags()
    rc = cli.main(["bert-train", "create_pretraining_data", f"--input={corpus}",
                   f"--vocab={vocab_file}", f"--output={tmp_path}/d/t-*.tfrecord",
                   "--runner=DataflowRunner",
                   "--beam_options=--project=p --region=r --temp_location=gs://b/tmp"])
    flags.FLAGS.unparse_flags()
    err = capsys.readouterr().err
    assert rc == 2
    assert err == ("bert-train create_pretraining_data: error: --runner=DataflowRunner: "
                   f"--input={corpus} is not on gs://, and DataflowRunner's workers cannot see "
                   "this machine's files; put --input, --vocab and --output on Cloud Storage "
                   "(gs://BUCKET/...)\n")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("local", ["--vocab", "--output"])
def test_dataflow_runner_needs_every_path_on_gs(local, beam, vocab_file, tmp_path,
                                                monkeypatch):
    paths = {"--input": "gs://b/text/*.txt,gs://b/more.txt", "--vocab": "gs://b/vocab.txt",
             "--output": "gs://b/data/train-*.tfrecord"}
    # Accepted with every path on gs:// (Beam's Google Cloud extra stubbed: not installed here).
    monkeypatch.setitem(sys.modules, "apache_beam.runners.dataflow.internal.apiclient",
                        types.ModuleType("apiclient"))
    assert beam.__name__ == "apache_beam"
    from bert_trainer.data import beam as runners

    runners.check_paths("DataflowRunner", *paths.values())
    runners.check_paths("DirectRunner", str(tmp_path), vocab_file, str(tmp_path / "t-*"))
    paths[local] = str(tmp_path / "x")
    with pytest.raises(UserError, match=f"^--runner=DataflowRunner: {local}={tmp_path}/x is "
                       "not on gs://"):
        runners.check_paths("DataflowRunner", *paths.values())


def test_dataflow_runner_without_the_gcp_extra_fails_in_one_line(beam, monkeypatch):
    from bert_trainer.data import beam as runners

    monkeypatch.setitem(sys.modules, "apache_beam.runners.dataflow.internal.apiclient", None)
    with pytest.raises(UserError, match=r"^--runner=DataflowRunner needs Beam's Google Cloud "
                       r"extra, which is not installed: pip install 'apache-beam\[gcp\]"):
        runners.check_paths("DataflowRunner", "gs://b/a.txt", "gs://b/v.txt", "gs://b/t-*.tf")
