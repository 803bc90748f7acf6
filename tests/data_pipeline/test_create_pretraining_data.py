"""create_pretraining_data: example layout, NSP labels, determinism, static masks, summary."""

import json
import os
import pathlib
import random
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from absl import flags

from bert_trainer import cli, features
from bert_trainer.data import example_wire
from bert_trainer.data.corpus_options import CorpusOptions
from bert_trainer.errors import UserError
from bert_trainer.tasks.masked_lm import corpus as cpd

UNMASKED = {features.INPUT_WORD_IDS, features.INPUT_MASK, features.INPUT_TYPE_IDS,
            features.NEXT_SENTENCE_LABELS}
GOOGLE = {"input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
          "masked_lm_weights", "next_sentence_labels"}


@pytest.fixture
def corpus(shared_dir):
    """Eight inaugural addresses (prose, 1801-1829): ~120 KB of real text."""
    return str(shared_dir / "data" / "corpus" / "inaugural" / "18[0-2]*.txt")


@pytest.fixture
def numbered(tmp_path):
    """40 documents x 30 sentences "D S ." in lines format: every sentence knows its place."""
    path = tmp_path / "numbered.txt"
    path.write_text("\n\n".join("\n".join(f"{d} {s} ." for s in range(30)) for d in range(40)),
                    encoding="utf-8")
    return str(path)


def read_records(pattern):
    out = []
    for path in sorted(tf.io.gfile.glob(pattern)):
        for raw in tf.data.TFRecordDataset(path):
            example = tf.train.Example.FromString(raw.numpy())
            out.append({k: list(getattr(v, v.WhichOneof("kind")).value)
                        for k, v in example.features.feature.items()})
    return out


def test_unmasked_examples_layout_and_summary(corpus, vocab_file, tmp_path):
    summary = cpd.create_pretraining_data(
        corpus, vocab_file, str(tmp_path / "out" / "train-*.tfrecord"),
        cpd.PretrainingDataConfig(max_seq_length=64, seed=3),
        options=CorpusOptions(num_shards=3), progress=None)
    records = read_records(str(tmp_path / "out" / "train-*.tfrecord"))
    assert summary["shards"] == [f"train-0000{i}-of-00003.tfrecord" for i in range(3)]
    assert summary["examples"] == len(records) > 150
    for r in records:
        assert set(r) == UNMASKED
        ids, mask, types = (np.array(r[k]) for k in features.ENCODER_INPUTS)
        assert len(ids) == len(mask) == len(types) == 64
        n = int(mask.sum())
        assert (mask[:n] == 1).all() and (ids[n:] == 0).all() and (types[n:] == 0).all()
        seps = np.flatnonzero(ids == 102)
        assert ids[0] == 101 and len(seps) == 2 and seps[1] == n - 1 and seps[0] >= 2
        assert (types[:seps[0] + 1] == 0).all() and (types[seps[0] + 1:n] == 1).all()
    labels = np.array([r[features.NEXT_SENTENCE_LABELS][0] for r in records])
    # google-research/bert's algorithm, with one-sentence chunks completed by the true next
    # sentence, gives ~50 % random; only document-final one-sentence chunks force a random B.
    assert 0.45 <= labels.mean() <= 0.58
    on_disk = json.loads((tmp_path / "out" / "train-summary.json").read_text())
    assert on_disk["examples"] == len(records) and on_disk["documents"] >= 8
    assert on_disk["tokens"] == sum(sum(r[features.INPUT_MASK]) for r in records)
    assert on_disk["fraction_random_next"] == pytest.approx(labels.mean())
    assert 0.0 < on_disk["fraction_truncated"] < 1.0 and on_disk["seconds"] > 0
    assert on_disk["config"]["max_seq_length"] == 64 and on_disk["input_files"] == 8


def _segments(record, tokenizer):
    """(doc, sentence) pairs of the complete "D S ." triples in A and in B."""
    ids = np.array(record[features.INPUT_WORD_IDS])
    seps = np.flatnonzero(ids == tokenizer.sep_id)
    out = []
    for piece in (ids[1:seps[0]], ids[seps[0] + 1:seps[1]]):
        words = tokenizer.convert_ids_to_tokens(tf.constant(piece)).numpy().tolist()
        out.append([(int(words[i]), int(words[i + 1])) for i in range(len(words) - 2)
                    if words[i + 2] == b"." and words[i].isdigit() and words[i + 1].isdigit()])
    return out


def test_next_sentence_labels_are_true(numbered, vocab_file, tmp_path):
    from bert_trainer.data.tokenizer import Tokenizer

    tok = Tokenizer(vocab_file)
    config = cpd.PretrainingDataConfig(max_seq_length=32, seed=5, chunk_documents=10)
    cpd.create_pretraining_data(numbered, vocab_file, str(tmp_path / "t-*.rec"), config,
                                options=CorpusOptions(num_shards=1), progress=None)
    checked = {0: 0, 1: 0}
    for r in read_records(str(tmp_path / "t-*.rec")):
        a, b = _segments(r, tok)
        if not a or not b:
            continue  # Truncation cut every complete triple out of one side.
        label = r[features.NEXT_SENTENCE_LABELS][0]
        (doc_a, sent_a), (doc_b, sent_b) = a[-1], b[0]
        if label == 0:  # The actual continuation: same document, later sentence.
            assert doc_b == doc_a and sent_b > sent_a
        else:  # Random: another document of the same chunk of 10.
            assert doc_b != doc_a and doc_b // 10 == doc_a // 10
        checked[label] += 1
    assert min(checked.values()) > 80


def test_same_seed_same_bytes_other_seed_differs(corpus, vocab_file, tmp_path):
    def run(name, seed):
        cpd.create_pretraining_data(corpus, vocab_file, str(tmp_path / name / "d-*.tfrecord"),
                                    cpd.PretrainingDataConfig(max_seq_length=64, seed=seed),
                                    options=CorpusOptions(num_shards=2), progress=None)
        return [p.read_bytes() for p in sorted((tmp_path / name).glob("d-*.tfrecord"))]

    first, again, other = run("a", 1), run("b", 1), run("c", 2)
    assert first == again
    assert first != other


def test_static_masking_writes_google_names(corpus, vocab_file, tmp_path):
    config = cpd.PretrainingDataConfig(max_seq_length=64, static_masking=True,
                                       max_predictions_per_seq=10, whole_word_masking=True)
    cpd.create_pretraining_data(corpus, vocab_file, str(tmp_path / "s-*.tfrecord"), config,
                                options=CorpusOptions(examples_per_shard=200), progress=None)
    records = read_records(str(tmp_path / "s-*.tfrecord"))
    assert len(list(tmp_path.glob("s-*-of-*.tfrecord"))) == -(-len(records) // 200)
    predicted = as_mask = 0
    for r in records:
        assert set(r) == GOOGLE
        assert len(r["masked_lm_positions"]) == len(r["masked_lm_weights"]) == 10
        n = int(sum(r["masked_lm_weights"]))
        positions, ids = r["masked_lm_positions"][:n], np.array(r["input_ids"])
        assert 1 <= n <= 10 and all(0 < p < sum(r["input_mask"]) - 1 for p in positions)
        assert not np.isin(np.array(r["masked_lm_ids"][:n]), [0, 101, 102]).any()
        predicted += n
        as_mask += int((ids[positions] == 103).sum())
    assert predicted > 1000 and abs(as_mask / predicted - 0.8) < 0.04


def test_bad_arguments_are_user_errors(corpus, vocab_file, tmp_path):
    out = str(tmp_path / "x-*.tfrecord")
    with pytest.raises(UserError, match=r"--output=.*train.tfrecord must hold exactly one '\*'"):
        cpd.create_pretraining_data(corpus, vocab_file, str(tmp_path / "train.tfrecord"))
    with pytest.raises(UserError, match="--num_shards or --examples_per_shard, not both"):
        cpd.create_pretraining_data(corpus, vocab_file, out,
                                    options=CorpusOptions(num_shards=2, examples_per_shard=5))
    with pytest.raises(UserError, match="--max_seq_length=4 is too short"):
        cpd.create_pretraining_data(corpus, vocab_file, out,
                                    cpd.PretrainingDataConfig(max_seq_length=4))
    (tmp_path / "x-00000-of-00001.tfrecord").write_bytes(b"old")
    with pytest.raises(UserError, match=r"already matches 1 file\(s\).*--overwrite"):
        cpd.create_pretraining_data(corpus, vocab_file, out, progress=None)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n", encoding="utf-8")
    with pytest.raises(UserError, match="produced no examples"):
        cpd.create_pretraining_data(str(empty), vocab_file, out,
                                    options=CorpusOptions(overwrite=True), progress=None)
    # The refused run leaves the old shard as it was, no empty new one, and no temporaries.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt", "x-00000-of-00001.tfrecord"]
    assert (tmp_path / "x-00000-of-00001.tfrecord").read_bytes() == b"old"


def _google_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
    """google-research/bert's create_pretraining_data.truncate_seq_pair, as published."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


def test_truncate_seq_pair_matches_google_research_bert():
    draw = random.Random(0)
    for k in range(2000):
        longest = 60 if k < 1000 else 400
        a = list(range(draw.randint(0, longest)))
        b = list(range(1000, 1000 + draw.randint(0, longest)))
        limit, seed = draw.randint(1, 70), draw.randint(0, 10**6)
        want_a, want_b, before = list(a), list(b), len(a) + len(b)
        google, mine = random.Random(seed), random.Random(seed)
        _google_truncate_seq_pair(want_a, want_b, limit, google)
        truncated = cpd.truncate_seq_pair(a, b, limit, mine)
        assert (a, b) == (want_a, want_b)
        assert truncated == (before > limit)
        assert mine.getstate() == google.getstate()  # The same draws, as many.
    a, b = list(range(10)), [100, 101, 102]
    assert cpd.truncate_seq_pair(a, b, 8, random.Random(0)) and len(a) == 5 and len(b) == 3


def test_command_line(corpus, vocab_file, tmp_path, capsys):
    flags.FLAGS.unparse_flags()
    rc = cli.main(["bert-train", "create_pretraining_data", f"--input={corpus}",
                   f"--vocab={vocab_file}", f"--output={tmp_path}/c-*.tfrecord",
                   "--max_seq_length=48", "--num_shards=2", "--static_masking",
                   "--max_predictions_per_seq=8", "--num_workers=1"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "examples/s on 1 worker(s)" in out and "MB/s, " in out
    summary = json.loads((tmp_path / "c-summary.json").read_text())
    assert summary["feature_names"] == "google-research/bert"
    assert len(read_records(f"{tmp_path}/c-*.tfrecord")) == summary["examples"]
    flags.FLAGS.unparse_flags()
    rc = cli.main(["bert-train", "create_pretraining_data", f"--input={corpus}",
                   f"--vocab={pathlib.Path(vocab_file).parent}/none.txt",
                   f"--output={tmp_path}/d-*.tfrecord"])
    assert rc == 2
    assert "none.txt does not exist" in capsys.readouterr().err
    flags.FLAGS.unparse_flags()


def test_num_workers_defaults_to_the_cores_this_process_may_use():
    import os

    from bert_trainer.commands import create_pretraining_data as command

    assert command._num_workers(None) == len(os.sched_getaffinity(0))  # --num_workers not given
    assert command._num_workers(3) == 3


def test_the_flags_are_read_once_into_settings():
    from bert_trainer.commands import create_pretraining_data as command
    from bert_trainer.tasks import plugins

    flags.FLAGS.unparse_flags()
    try:
        flags.FLAGS(["bert-train", "--num_workers=3", "--block_size=64", "--tfds=wiki"])
        settings = command.PretrainingDataSettings.from_flags(plugins.objectives().values())
    finally:
        flags.FLAGS.unparse_flags()
    assert (settings.num_workers, settings.tfds, settings.tfds_split) == (3, "wiki", "train")
    # Every objective's corpus flags, given or not: main passes the chosen one's to its writer.
    assert settings.corpus_values["block_size"] == 64
    assert settings.corpus_values["max_seq_length"] == 128
    assert {"num_workers", "block_size", "tfds"} <= settings.given
    assert "max_seq_length" not in settings.given


def _run_and_read(pattern, config, num_workers, corpus, vocab_file, **kwargs):
    summary = cpd.create_pretraining_data(
        corpus, vocab_file, str(pattern), config,
        options=CorpusOptions(num_workers=num_workers, **kwargs), progress=None)
    shards = {p.name: p.read_bytes() for p in sorted(pattern.parent.glob("*.tfrecord"))}
    return shards, summary


def _without_run_keys(summary):
    from bert_trainer.data import pretraining_data_report as report

    return {k: v for k, v in summary.items() if k not in report.RUN_KEYS}


def test_a_corpus_of_one_chunk_runs_in_this_process_whatever_num_workers(
        corpus, vocab_file, tmp_path, monkeypatch):
    from bert_trainer.data import chunk_workers

    def no_pool(*args, **kwargs):
        raise AssertionError("a worker pool was started for a single chunk")

    config = cpd.PretrainingDataConfig(max_seq_length=64, seed=7, static_masking=True)
    one, summary_one = _run_and_read(tmp_path / "one" / "t-*.tfrecord", config, 1, corpus,
                                     vocab_file)
    monkeypatch.setattr(chunk_workers.futures, "ProcessPoolExecutor", no_pool)
    two, summary_two = _run_and_read(tmp_path / "two" / "t-*.tfrecord", config, 2, corpus,
                                     vocab_file)
    assert summary_one["documents"] < config.chunk_documents and summary_one["examples"] > 0
    assert one == two and summary_two["throughput"]["num_workers"] == 1


@pytest.mark.slow  # starts two TensorFlow worker processes
def test_two_workers_write_the_same_bytes_as_one(corpus, vocab_file, tmp_path, monkeypatch):
    from bert_trainer.data import chunk_workers

    # Chunks of 2 documents: the 8 addresses are cut into several chunks, dealt to both workers
    # (the parent would make them all while the pool starts: it makes none here).
    monkeypatch.setattr(chunk_workers, "_made_here", lambda *args: iter(()))
    config = cpd.PretrainingDataConfig(max_seq_length=64, seed=7, chunk_documents=2,
                                       static_masking=True)
    one, summary_one = _run_and_read(tmp_path / "one" / "t-*.tfrecord", config, 1, corpus,
                                     vocab_file, examples_per_shard=100)
    two, summary_two = _run_and_read(tmp_path / "two" / "t-*.tfrecord", config, 2, corpus,
                                     vocab_file, examples_per_shard=100)
    assert len(one) == -(-summary_one["examples"] // 100) >= 3
    assert one == two
    assert _without_run_keys(summary_one) == _without_run_keys(summary_two)
    assert summary_two["documents"] >= 3 * config.chunk_documents
    assert (summary_one["throughput"]["num_workers"], summary_two["throughput"]["num_workers"]) \
        == (1, 2)
    rate = summary_two["throughput"]
    assert rate["text_mb"] == pytest.approx(sum(
        p.stat().st_size for p in pathlib.Path(corpus).parent.glob("18[0-2]*.txt")) / 1e6,
        abs=1e-3)
    assert rate["text_mb_per_second_per_worker"] == pytest.approx(  # Both rounded to 0.001.
        rate["text_mb_per_second"] / 2, abs=1e-3)
    assert rate["examples_per_second_per_worker"] == pytest.approx(
        rate["examples_per_second"] / 2, abs=0.1)


@pytest.mark.slow  # starts two TensorFlow worker processes
def test_a_dead_worker_stops_the_run_and_keeps_the_old_set(corpus, vocab_file, tmp_path,
                                                           monkeypatch):
    import os
    import signal
    from concurrent import futures

    pattern = tmp_path / "data" / "t-*.tfrecord"
    config = cpd.PretrainingDataConfig(max_seq_length=64, chunk_documents=2)
    old, _ = _run_and_read(pattern, config, 1, corpus, vocab_file, num_shards=2)
    old["t-summary.json"] = (tmp_path / "data" / "t-summary.json").read_bytes()
    from bert_trainer.data import chunk_workers

    # Every chunk to the pool: with this short corpus the parent would make them all while the
    # pool starts, and a worker's death would not matter.
    monkeypatch.setattr(chunk_workers, "_made_here", lambda *args: iter(()))
    real_submit, submitted = futures.ProcessPoolExecutor.submit, []

    def submit(self, *args, **kwargs):  # A worker is killed once the first chunk is handed out
        # (after the two workers' readiness probes).
        future = real_submit(self, *args, **kwargs)
        submitted.append(future)
        if len(submitted) == 3:
            os.kill(next(iter(self._processes)), signal.SIGKILL)
        return future

    monkeypatch.setattr(futures.ProcessPoolExecutor, "submit", submit)
    with pytest.raises(UserError) as e:
        cpd.create_pretraining_data(
            corpus, vocab_file, str(pattern), config,
            options=CorpusOptions(num_shards=2, num_workers=2, overwrite=True), progress=None)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("a worker process of --num_workers=2 died"), message
    assert "nothing was written" in message
    # The old set and its summary, byte for byte, and nothing else (no staging directory).
    assert {p.name: p.read_bytes() for p in (tmp_path / "data").iterdir()} == old


def _state_slow_in_workers(parent_pid: int, delay: float) -> str:
    if os.getpid() != parent_pid:
        time.sleep(delay)  # A pool slow to start; the parent's state comes at once.
    return "state"


def _square_and_pid(state: str, chunk: int) -> tuple:
    time.sleep(0.01)
    return (state, chunk, chunk * chunk), os.getpid()


@pytest.mark.slow  # starts two TensorFlow worker processes
def test_the_parent_makes_the_first_chunks_while_the_pool_starts():
    from bert_trainer.data import chunk_workers

    parent, pids = os.getpid(), []

    def chunks():  # More than the parent makes while the pool starts, however slow it is.
        for chunk in range(10_000):
            if pids.count(parent) < len(pids) >= 8:  # The pool made some; a few more.
                return
            yield chunk

    with chunk_workers.map_chunks(_square_and_pid, _state_slow_in_workers, (parent, 0.5),
                                  chunks(), num_workers=2) as results:
        values = []
        for value, pid in results:
            values.append(value)
            pids.append(pid)
    assert results.num_workers == 2
    # In order, and what one process makes (`map_chunks` with one worker calls `work` so).
    assert values == [_square_and_pid("state", chunk)[0] for chunk in range(len(values))]
    here = [pid == parent for pid in pids]
    first_of_pool = here.index(False)  # The pool made some ...
    assert first_of_pool >= 1 and all(here[:first_of_pool])  # ... after the parent's first,
    assert not any(here[first_of_pool:])  # and all those after (the parent stopped).
    assert len(set(pids) - {parent}) <= 2


def test_a_corpus_shorter_than_the_pool_start_is_not_kept_waiting(monkeypatch):
    from bert_trainer.data import chunk_workers

    release = threading.Event()

    def start_pool(*args):  # A forkserver still importing TensorFlow: no worker is ready.
        release.wait(10)

    monkeypatch.setattr(chunk_workers, "_start_pool", start_pool)
    begin = time.perf_counter()
    with chunk_workers.map_chunks(_square_and_pid, _state_slow_in_workers, (os.getpid(), 0),
                                  range(3), num_workers=2) as results:
        made = list(results)
    seconds = time.perf_counter() - begin
    release.set()
    assert made == [_square_and_pid("state", chunk) for chunk in range(3)]  # All by the parent,
    assert seconds < 5  # which did not wait for the pool.


def test_num_workers_below_one_is_refused_before_anything_is_written(corpus, vocab_file,
                                                                     tmp_path):
    with pytest.raises(UserError, match=r"^--num_workers=0 must be >= 1 \(default: the \d+ "):
        cpd.create_pretraining_data(corpus, vocab_file, str(tmp_path / "d" / "t-*.tfrecord"),
                                    options=CorpusOptions(num_workers=0), progress=None)
    assert not (tmp_path / "d").exists()


def _int64s(rng, n):
    """Random int64 values of every varint size: small, token ids, up to +-2**63."""
    bits = [7, 14, 21, 28, 35, 63]
    return [rng.randrange(-(2 ** 63), 2 ** 63) if rng.random() < 0.1
            else rng.randrange(2 ** rng.choice(bits)) for _ in range(n)]


def test_example_bytes_are_protobufs_deterministic_serialization():
    rng = random.Random(0)
    names = ["input_ids", "a", "masked_lm_weights", "z" * 130, "next_sentence_labels", "B"]
    for _ in range(500):
        ints, floats = {}, {}
        for name in rng.sample(names, rng.randint(0, len(names))):
            n = rng.choice([0, 1, 2, 20, 128, 200, 600])
            if rng.random() < 0.3:
                floats[name] = np.array([rng.uniform(-1e6, 1e6) for _ in range(n)], np.float32)
            else:
                ints[name] = _int64s(rng, n)
        want = tf.train.Example(features=tf.train.Features(feature={
            **{k: tf.train.Feature(int64_list=tf.train.Int64List(value=v))
               for k, v in ints.items()},
            **{k: tf.train.Feature(float_list=tf.train.FloatList(value=v))
               for k, v in floats.items()}})).SerializeToString(deterministic=True)
        wire = example_wire
        got = wire.example_bytes({
            **{k: wire.int64_feature(wire.pack_int64(v)) for k, v in ints.items()},
            **{k: wire.float_feature(v.astype("<f4").tobytes()) for k, v in floats.items()}})
        assert got == want
    table = example_wire.varint_table(40_000)
    assert all(table[i] == example_wire.pack_int64([i]) for i in range(0, 40_000, 7))


@pytest.mark.parametrize("static_masking", [False, True])
def test_records_are_the_examples_protobuf_writes(static_masking, tokenizer):
    """instance_to_record's bytes against the tf.train.Example built from the same instance."""
    vocab = cpd.masking.MaskingVocab.from_tokenizer(tokenizer)
    config = cpd.PretrainingDataConfig(max_seq_length=64, static_masking=static_masking,
                                       max_predictions_per_seq=9, whole_word_masking=True)
    rng = random.Random(4)
    for k in range(300):
        len_a = rng.randint(1, 30)
        len_b = rng.randint(1, 61 - len_a)
        ids = [rng.randrange(999, vocab.vocab_size) for _ in range(len_a + len_b)]
        instance = cpd.Instance(ids[:len_a], ids[len_a:], bool(k % 2), False)
        state = rng.getstate()
        got = cpd.instance_to_record(instance, tokenizer, config, rng, vocab)
        rng.setstate(state)
        tokens = [tokenizer.cls_id, *ids[:len_a], tokenizer.sep_id, *ids[len_a:],
                  tokenizer.sep_id]
        pad = 64 - len(tokens)
        feats = {"input_mask": [1] * len(tokens) + [0] * pad,
                 "segment_ids": [0] * (len_a + 2) + [1] * (len_b + 1) + [0] * pad,
                 "next_sentence_labels": [k % 2]}
        floats = {}
        if static_masking:
            masked, positions, labels = cpd.masking.static_mask(
                np.array(tokens), rng, vocab=vocab, max_predictions_per_seq=9,
                whole_word=True)
            assert len(positions) >= 1
            tokens = masked.tolist()
            feats["masked_lm_positions"] = positions.tolist() + [0] * (9 - len(positions))
            feats["masked_lm_ids"] = labels.tolist() + [0] * (9 - len(positions))
            floats["masked_lm_weights"] = [1.0] * len(positions) + [0.0] * (9 - len(positions))
        feats["input_ids"] = tokens + [tokenizer.pad_id] * pad
        if not static_masking:
            names = {v: k for k, v in features.GOOGLE_BERT_NAMES.items()}
            feats = {name: feats[names[name]] for name in UNMASKED}
        want = tf.train.Example(features=tf.train.Features(feature={
            **{n: tf.train.Feature(int64_list=tf.train.Int64List(value=v))
               for n, v in feats.items()},
            **{n: tf.train.Feature(float_list=tf.train.FloatList(value=v))
               for n, v in floats.items()}}))
        assert got == want.SerializeToString(deterministic=True)
