"""create_pretraining_data --objective=causal_lm: block packing, coverage, determinism, summary."""

import hashlib
import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from bert_trainer import cli, features
from bert_trainer.data import corpus_chunks, text_corpus
from bert_trainer.data.corpus_options import CorpusOptions
from bert_trainer.data.tokenizer import Tokenizer
from bert_trainer.errors import UserError
from bert_trainer.tasks.causal_lm import corpus as cld


@pytest.fixture
def corpus(shared_dir):
    """Three inaugural addresses (prose, 1801-1809): ~30 KB of real text."""
    return str(shared_dir / "data" / "corpus" / "inaugural" / "180*.txt")


def read_blocks(pattern) -> list[np.ndarray]:
    """Every record's input_word_ids, shard by shard, in file order."""
    blocks = []
    for path in sorted(tf.io.gfile.glob(pattern)):
        for raw in tf.data.TFRecordDataset(path):
            example = tf.train.Example.FromString(raw.numpy())
            assert set(example.features.feature) == {features.INPUT_WORD_IDS}
            blocks.append(np.array(example.features.feature[features.INPUT_WORD_IDS]
                                   .int64_list.value))
    return blocks


def expected_stream(corpus, vocab_file) -> np.ndarray:
    """The corpus tokenized document by document, each document after one [SEP]."""
    tokenizer = Tokenizer(vocab_file)
    files = text_corpus.expand_inputs(corpus)
    ids = []
    for document in text_corpus.read_documents(files):
        tokens = [t for s in tokenizer.tokenize(document).to_list() for t in s]
        if tokens:
            ids += [tokenizer.sep_id, *tokens]
    return np.array(ids)


def digest(directory: pathlib.Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.iterdir())}


def test_blocks_cover_every_token_exactly_once(corpus, vocab_file, tmp_path):
    # Small chunks, so blocks cross chunk boundaries as well as documents.
    config = cld.CausalDataConfig(block_size=100, seed=3, chunk_documents=3)
    summary = cld.create_causal_lm_data(corpus, vocab_file, str(tmp_path / "d" / "t-*.tfrecord"),
                                        config, options=CorpusOptions(num_shards=3), progress=None)
    stream = expected_stream(corpus, vocab_file)
    blocks = read_blocks(str(tmp_path / "d" / "t-*.tfrecord"))
    n = len(stream) // 100
    assert len(blocks) == summary["examples"] == n > 50
    assert all(b.shape == (100,) for b in blocks)
    # The shards hold exactly the blocks of the stream (shuffled within a chunk)...
    want = stream[:n * 100].reshape(n, 100)
    assert sorted(map(tuple, blocks)) == sorted(map(tuple, want))
    # ... and the packer, in stream order, is the stream cut into blocks: concatenated they
    # give back every token once, the last partial block left over.
    tokenizer = Tokenizer(vocab_file)
    docs = corpus_chunks.tokenize_documents(list(text_corpus.read_documents(
        text_corpus.expand_inputs(corpus))), tokenizer)
    packer = cld.BlockPacker(100)
    packed = [packer.add(cld.document_stream(docs[i:i + 2], tokenizer.sep_id))
              for i in range(0, len(docs), 2)]
    np.testing.assert_array_equal(np.concatenate([*np.concatenate(packed), packer.pending]),
                                  stream)
    assert (stream == tokenizer.sep_id).sum() == summary["documents"] == summary["separator_tokens"]
    assert summary["tokens"] == n * 100
    assert summary["tokens_dropped"] == len(stream) - n * 100 == len(packer.pending) < 100
    assert summary["corpus_tokens"] + summary["documents"] == len(stream)
    assert summary["final_block"] == "dropped" and summary["objective"] == "causal_lm"
    assert summary["shards"] == [f"t-0000{i}-of-00003.tfrecord" for i in range(3)]
    written = json.loads((tmp_path / "d" / "t-summary.json").read_text())
    assert written == summary


def test_separator_before_each_document(tmp_path, vocab_file):
    text = tmp_path / "docs.txt"
    text.write_text("the cat sat .\n\nthe dog ran .\nit ran .\n\nend .\n", encoding="utf-8")
    tokenizer = Tokenizer(vocab_file)
    summary = cld.create_causal_lm_data(str(text), vocab_file, str(tmp_path / "o-*.rec"),
                                        cld.CausalDataConfig(block_size=4),
                                        options=CorpusOptions(input_format="lines"),
                                        progress=None)
    words = tokenizer.tokenize(["the cat sat .", "the dog ran . it ran .", "end ."]).to_list()
    stream = [t for w in words for t in (tokenizer.sep_id, *w)]
    assert stream[0] == tokenizer.sep_id and len(stream) == 16  # 3 + 7 + 2 tokens, 3 [SEP]
    assert sorted(map(tuple, read_blocks(str(tmp_path / "o-*.rec")))) == sorted(
        tuple(stream[i:i + 4]) for i in range(0, 16, 4))
    assert summary["tokens_dropped"] == 0 and summary["examples"] == 4


def test_same_seed_same_bytes_other_seed_differs(corpus, vocab_file, tmp_path):
    runs = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        cld.create_causal_lm_data(corpus, vocab_file, str(tmp_path / name / "t-*.tfrecord"),
                                  cld.CausalDataConfig(block_size=64, seed=seed),
                                  options=CorpusOptions(num_shards=2), progress=None)
        runs[name] = {k: v for k, v in digest(tmp_path / name).items() if "summary" not in k}
    assert runs["a"] == runs["b"]
    assert runs["a"] != runs["c"]


def test_bad_arguments_are_user_errors(corpus, vocab_file, tmp_path):
    out = str(tmp_path / "bad" / "t-*.tfrecord")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    short = tmp_path / "short.txt"
    short.write_text("a few words .\n")
    cases = [(cld.CausalDataConfig(block_size=1), corpus, "--block_size=1 is too short"),
             (cld.CausalDataConfig(block_size=100_000), corpus, "--block_size=100000 exceeds"),
             (cld.CausalDataConfig(), str(empty), "produced no blocks: 0 documents make 0 tokens"),
             (cld.CausalDataConfig(block_size=64), str(short),
              "produced no blocks: 1 documents make 5 tokens with separators, fewer than "
              "--block_size=64")]
    for config, inputs, message in cases:
        with pytest.raises(UserError, match=message):
            cld.create_causal_lm_data(inputs, vocab_file, out, config, progress=None)
    assert not (tmp_path / "bad").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt", "short.txt"]


def test_overwrite_replaces_only_its_own_set(corpus, vocab_file, tmp_path):
    out = str(tmp_path / "t-*.tfrecord")
    first = cld.create_causal_lm_data(corpus, vocab_file, out, cld.CausalDataConfig(64),
                                      options=CorpusOptions(num_shards=3), progress=None)
    with pytest.raises(UserError, match="already matches 3 file"):
        cld.create_causal_lm_data(corpus, vocab_file, out, progress=None)
    second = cld.create_causal_lm_data(corpus, vocab_file, out, cld.CausalDataConfig(128),
                                       options=CorpusOptions(num_shards=2, overwrite=True),
                                       progress=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == [*second["shards"], "t-summary.json"]
    assert len(first["shards"]) == 3 and len(read_blocks(out)) == second["examples"]
    assert all(len(b) == 128 for b in read_blocks(out))


def test_command_line(corpus, vocab_file, tmp_path, capsys):
    out = str(tmp_path / "c-*.tfrecord")
    rc = cli.main(["bert-train", "create_pretraining_data", "--objective=causal_lm",
                   f"--input={corpus}", f"--vocab={vocab_file}", f"--output={out}",
                   "--block_size=32", "--num_shards=2", "--num_workers=1"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    summary = json.loads((tmp_path / "c-summary.json").read_text())
    assert f"wrote {summary['examples']:,} blocks of 32 tokens from " in captured.out
    rate = summary["throughput"]
    assert f"{rate['text_mb_per_second']:.2f} MB/s" in captured.out
    assert "examples/s on 1 worker(s)" in captured.out
    assert {len(b) for b in read_blocks(out)} == {32}
    # A masked-LM flag with the causal objective (and the reverse) is refused, nothing written.
    for args, flag in ((["--objective=causal_lm", "--dupe_factor=2"], "--dupe_factor"),
                       (["--block_size=32"], "--block_size")):
        rc = cli.main(["bert-train", "create_pretraining_data", *args, f"--input={corpus}",
                       f"--vocab={vocab_file}", f"--output={tmp_path}/x-*.tfrecord"])
        err = capsys.readouterr().err
        assert rc == 2 and f"{flag} does not apply to --objective=" in err, err
    assert not list(tmp_path.glob("x-*"))


@pytest.mark.slow  # starts two TensorFlow worker processes
def test_two_workers_write_the_same_bytes_as_one(corpus, vocab_file, tmp_path):
    # One document per chunk: blocks cross chunk boundaries, and chunks alternate workers.
    config = cld.CausalDataConfig(block_size=48, seed=4, chunk_documents=1)
    summaries = {}
    for workers in (1, 2):
        summaries[workers] = cld.create_causal_lm_data(
            corpus, vocab_file, str(tmp_path / str(workers) / "t-*.tfrecord"), config,
            options=CorpusOptions(num_shards=2, num_workers=workers), progress=None)
    one, two = (digest(tmp_path / str(n)) for n in (1, 2))
    assert one.keys() == two.keys() == {"t-00000-of-00002.tfrecord", "t-00001-of-00002.tfrecord",
                                        "t-summary.json"}
    assert {k: v for k, v in one.items() if "summary" not in k} == {
        k: v for k, v in two.items() if "summary" not in k}
    measured = ("seconds", "examples_per_second", "throughput")
    assert ({k: v for k, v in summaries[1].items() if k not in measured}
            == {k: v for k, v in summaries[2].items() if k not in measured})
    assert summaries[2]["documents"] >= 3 and summaries[2]["throughput"]["num_workers"] == 2
    assert len(read_blocks(str(tmp_path / "2" / "t-*.tfrecord"))) == summaries[2]["examples"]
