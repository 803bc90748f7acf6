"""TFDS paths: the offline one-line error, and every TFDS task through `tfds.testing.mock_data`."""


import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from conftest import SHARED

from bert_trainer import features
from bert_trainer.data.corpus_options import CorpusOptions
from bert_trainer.data.tfds_sources import load_tfds
from bert_trainer.errors import UserError
from bert_trainer.tasks import registry
from bert_trainer.tasks.classification.data import classification_dataset
from bert_trainer.tasks.squad import data as squad_data
from bert_trainer.tasks.tagging import data as tagging_data

CONTEXT = "The Broncos beat the Panthers in Santa Clara, California, in February 2016."


def _examples(name: str, n: int) -> list[dict]:
    """Consistent fake examples in each dataset's TFDS layout (random mock data is not)."""
    if name == "imdb_reviews":
        return [{"text": f"review {i} was {'great' if i % 2 else 'bad'}", "label": i % 2}
                for i in range(n)]
    if name == "glue":
        return [{"sentence1": f"first {i}", "sentence2": f"second sentence {i}",
                 "label": i % 2, "idx": i} for i in range(n)]
    if name == "squad":
        answers = ["Broncos", "Santa Clara, California", "February 2016"]
        return [{"id": f"q{i}", "title": "t", "context": CONTEXT, "question": f"What {i}?",
                 "answers": {"text": [answers[i % 3]],
                             "answer_start": [CONTEXT.index(answers[i % 3])]}}
                for i in range(n)]
    assert name == "conll2003", name
    # IOB1 ids in TFDS's CoNLL order: I-PER=2, I-LOC=6, B-LOC=5.
    return [{"tokens": ["John", "Smith", "visited", "Paris", "London"][: 3 + i % 3],
             "pos": [0] * (3 + i % 3), "chunks": [0] * (3 + i % 3),
             "ner": [2, 2, 0, 6, 5][: 3 + i % 3]} for i in range(n)]


_STRING, _INT = tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.int64)
_SIGNATURES = {
    "imdb_reviews": {"text": _STRING, "label": _INT},
    "glue": {"sentence1": _STRING, "sentence2": _STRING, "label": _INT,
             "idx": tf.TensorSpec([], tf.int32)},
    "squad": {"id": _STRING, "title": _STRING, "context": _STRING, "question": _STRING,
              "answers": {"text": tf.TensorSpec([None], tf.string),
                          "answer_start": tf.TensorSpec([None], tf.int32)}},
    "conll2003": {"tokens": tf.TensorSpec([None], tf.string),
                  **{k: tf.TensorSpec([None], tf.int64) for k in ("pos", "chunks", "ner")}},
}


def _as_dataset(self, split, decoders=None, read_config=None, shuffle_files=False):
    del split, decoders, read_config, shuffle_files
    rows = _examples(self.name, 10)
    return tf.data.Dataset.from_generator(lambda: iter(rows),
                                          output_signature=_SIGNATURES[self.name])


@pytest.fixture
def mock_tfds():
    with tfds.testing.mock_data(as_dataset_fn=_as_dataset):
        yield


def test_not_prepared_offline_is_one_line(tmp_path):
    with pytest.raises(UserError) as info:
        registry.get_task_data("mrpc").load("train", data_dir=str(tmp_path))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"TFDS dataset 'glue/mrpc' is not prepared in {tmp_path} ")
    assert "--data_dir=DIR" in message and "--train_file/--eval_file" in message


def test_download_failure_is_one_line(tmp_path, monkeypatch):
    def offline(self, *args, **kwargs):
        raise OSError("[Errno 101] Network is unreachable\nlong traceback text")

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", offline)
    with pytest.raises(UserError, match=r"^TFDS dataset 'imdb_reviews' is not in .* and "
                                        r"downloading it failed \(\[Errno 101\] Network is "
                                        r"unreachable\): pass --data_dir=DIR.*--train_file"):
        load_tfds("imdb_reviews", "train", str(tmp_path), download=True)


def test_unknown_dataset():
    with pytest.raises(UserError, match="TFDS has no dataset 'no_such_set'"):
        load_tfds("no_such_set", "train")


def test_imdb_mock(mock_tfds, tokenizer):
    raw = registry.get_task_data("imdb").load("train")
    ds = classification_dataset(raw, tokenizer, seq_length=16, batch_size=4, is_training=False)
    batches = list(ds)
    assert [b[features.LABEL_IDS].shape[0] for b in batches] == [4, 4, 2]
    assert np.concatenate([b[features.LABEL_IDS] for b in batches]).tolist() == [0, 1] * 5
    ids = batches[0][features.INPUT_WORD_IDS].numpy()[1]
    expected = tokenizer.tokenize(["review 1 was great"]).flat_values.numpy().tolist()
    assert ids[:len(expected) + 2].tolist() == [tokenizer.cls_id, *expected, tokenizer.sep_id]


def test_glue_mrpc_mock_pairs(mock_tfds, tokenizer):
    raw = registry.get_task_data("mrpc").load("eval")
    assert set(raw.element_spec) == {"text", "text_b", "label"}
    batch = next(iter(classification_dataset(raw, tokenizer, seq_length=12, batch_size=10,
                                             is_training=False)))
    assert batch[features.INPUT_WORD_IDS].shape == (10, 12)
    # "first 0" / "second sentence 0": [CLS] a b [SEP] c d e [SEP].
    assert batch[features.INPUT_TYPE_IDS].numpy()[0].tolist() == [0] * 4 + [1] * 4 + [0] * 4
    assert batch[features.LABEL_IDS].dtype == tf.int32


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_squad_mock_recovers_answers(mock_tfds, tokenizer):
    raw = registry.get_task_data("squad").load("eval")
    data = squad_data.squad_eval_data(raw, tokenizer, seq_length=32, doc_stride=8,
                                      max_query_length=8, batch_size=4)
    assert all(not ex.is_impossible for ex in data.examples)  # v1.1 lacks the field.
    n = len(data.features)
    start, end = np.full((n, 32), -9.0), np.full((n, 32), -9.0)
    for i, w in enumerate(data.features):
        start[i, w.start_position], end[i, w.end_position] = 9.0, 9.0
    predictions = squad_data.postprocess_squad(data.examples, data.features, start, end)
    assert predictions == {ex.id: ex.answer_texts[0] for ex in data.examples}
    assert len(predictions) == 10


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_conll2003_mock_iob2(mock_tfds, tokenizer):
    task = registry.get_task_data("conll2003")
    rows = list(task.load("train").as_numpy_iterator())
    assert [task.label_names[t] for t in rows[2]["tags"]] == [
        "B-PER", "I-PER", "O", "B-LOC", "B-LOC"]
    ds = tagging_data.tagging_dataset(task.load("train"), tokenizer, seq_length=16,
                                      batch_size=5, is_training=True, shuffle_buffer=4, seed=0)
    batch = next(iter(ds))
    assert batch[features.LABEL_IDS].shape == (5, 16)
    assert set(batch[features.LABEL_IDS].numpy().ravel()) <= {-1, 0, 1, 2, 5}


# ---------------------------------------------------- pretraining text from a TFDS dataset

class MovieReviewText(tfds.core.GeneratorBasedBuilder):
    """A small local TFDS text dataset: real IMDB reviews (../shared/data), prepared by a test."""

    VERSION = tfds.core.Version("1.0.0")
    REVIEWS = ()  # Set by the fixture before preparing.

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {"text": tfds.features.Text(), "label": tfds.features.ClassLabel(num_classes=2)}))

    def _split_generators(self, dl_manager):
        del dl_manager
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i, (text, label) in enumerate(self.REVIEWS):
            yield i, {"text": text, "label": label}


@pytest.fixture(scope="module")
def review_dataset(tmp_path_factory):
    """(data_dir, reviews): 40 real reviews, paragraphs on their own lines, as a TFDS dataset."""
    shared = SHARED / "data" / "imdb"
    if not shared.is_dir():
        pytest.skip(f"{shared} is absent (it holds the real test data; CI provides it)")
    rows = [row for row in (shared / "train_sample.tsv").read_text(encoding="utf-8")
            .split("\n")[1:] if "\t" in row][:40]
    reviews = tuple((text.replace("<br /><br />", "\n"), int(label))
                    for text, label in (row.rsplit("\t", 1) for row in rows))
    data_dir = tmp_path_factory.mktemp("tfds")
    MovieReviewText.REVIEWS = reviews
    MovieReviewText(data_dir=str(data_dir)).download_and_prepare()
    return str(data_dir), reviews


def test_tfds_text_makes_the_same_data_as_the_same_text_in_a_file(review_dataset, minilm_dir,
                                                                  tmp_path):
    from bert_trainer.data import text_corpus
    from bert_trainer.data.tfds_sources import TfdsText
    from bert_trainer.tasks.masked_lm import corpus as cpd

    data_dir, reviews = review_dataset
    source = TfdsText("movie_review_text", "train", "text", data_dir)
    documents = list(source.documents())
    # One document per review, in the order TFDS stored them (shuffled by key when prepared,
    # the same on every read).
    split = text_corpus.split_sentences
    assert sorted(documents) == sorted([s for line in text.splitlines() for s in split(line)]
                                       for text, _ in reviews)
    assert documents == list(source.documents())
    assert len(documents) == 40 and sum(map(len, documents)) > 200
    lines = tmp_path / "reviews.txt"
    lines.write_text("\n\n".join("\n".join(d) for d in documents) + "\n", encoding="utf-8")
    vocab = str(minilm_dir / "vocab.txt")
    config = cpd.PretrainingDataConfig(max_seq_length=64, seed=3, chunk_documents=16)
    from_tfds = cpd.create_pretraining_data(source, vocab, str(tmp_path / "a" / "t-*.rec"),
                                            config, options=CorpusOptions(num_shards=2),
                                            progress=None)
    from_file = cpd.create_pretraining_data(str(lines), vocab, str(tmp_path / "b" / "t-*.rec"),
                                            config,
                                            options=CorpusOptions(input_format="lines",
                                                                  num_shards=2),
                                            progress=None)
    for name in from_tfds["shards"]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert from_tfds["examples"] == from_file["examples"] > 100
    text_mb = sum(len(text.encode("utf-8")) for text, _ in reviews) / 1e6
    assert from_tfds["throughput"]["text_mb"] == pytest.approx(text_mb, abs=1e-3)


def test_tfds_text_command_line_and_its_errors(review_dataset, minilm_dir, tmp_path, capsys):
    from absl import flags

    from bert_trainer import cli

    data_dir, _ = review_dataset
    base = ["bert-train", "create_pretraining_data", f"--vocab={minilm_dir / 'vocab.txt'}",
            "--num_workers=1"]
    out = f"--output={tmp_path}/c-*.tfrecord"

    def run(*args):
        flags.FLAGS.unparse_flags()
        rc = cli.main([*base, *args])
        flags.FLAGS.unparse_flags()
        return rc, capsys.readouterr()

    rc, captured = run("--tfds=movie_review_text", "--objective=causal_lm", "--block_size=64",
                       f"--data_dir={data_dir}", out)
    assert rc == 0, captured.err
    assert "blocks of 64 tokens from 40 documents" in captured.out
    for args, message in (
            (["--tfds=movie_review_text", "--tfds_text_key=label"],
             "TFDS dataset 'movie_review_text' has no text feature 'label' (its text features: "
             "text); pass --tfds_text_key=one of them"),
            (["--tfds=movie_review_text", f"--input={tmp_path}/x.txt"],
             "pass --input (text files) or --tfds (a TFDS dataset), not both"),
            (["--tfds=movie_review_text", "--tfds_split=test"],
             "TFDS dataset 'movie_review_text' has no split 'test' (splits: train)"),
            (["--tfds=movie_review_text", f"--data_dir={tmp_path}"],
             f"TFDS dataset 'movie_review_text' is not prepared in {tmp_path} and bert-train "
             "does not download datasets: pass --data_dir=DIR")):
        given_dir = [f"--data_dir={data_dir}"] * (not any("data_dir" in a for a in args))
        rc, captured = run(*args, *given_dir, f"--output={tmp_path}/bad-*.tfrecord")
        assert rc == 2 and message in captured.err, captured.err
        assert len(captured.err.strip().splitlines()) == 1, captured.err
        assert "--train_file" not in captured.err
    assert not list(tmp_path.glob("bad-*"))
