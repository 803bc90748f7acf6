"""The translate family's reader (pair files, Tatoeba, header detection, bad rows) and its pair
pipeline (BERT2BERT packing, truncation, per-side length buckets, evaluation order)."""


import numpy as np
import pytest
import tensorflow as tf
from conftest import SHARED

from bert_trainer import features as F
from bert_trainer.data.tokenizer import Tokenizer
from bert_trainer.errors import UserError
from bert_trainer.tasks import registry
from bert_trainer.tasks.translate import data as translate_data
from bert_trainer.tasks.translate.family import looks_like_header

SPA_ENG = SHARED / "data" / "spa_eng"
TATOEBA = ("Go.\tVe.\tCC-BY 2.0 (France) Attribution: tatoeba.org #2877272 (CM) & #4986655\n"
           "Hi.\tHola.\tCC-BY 2.0 (France) Attribution: tatoeba.org #538123 (CM) & #431736\n"
           "¿Qué?\tWhat?\tCC-BY 2.0 (France) Attribution: tatoeba.org #1 (x)\n")


def pairs(path, *, has_header=None, skip_bad_rows=False, **columns):
    """The pairs (source, target) the translate task reads from `path` (`columns`: the
    column flags, source_column and target_column)."""
    td = registry.resolve_task_data("translate", columns=columns, has_header=has_header)
    ds = td.load("train", file=str(path), skip_bad_rows=skip_bad_rows)
    return [(r["source"].decode(), r["target"].decode()) for r in ds.as_numpy_iterator()]


def test_spa_eng_header_is_detected_and_pairs_read_in_order():
    path = SPA_ENG / "dev.tsv"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    got = pairs(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "english\tspanish"
    assert len(got) == len(lines) - 1 == 1166
    assert got[0] == tuple(lines[1].split("\t"))
    assert got[-1] == tuple(lines[-1].split("\t"))


def test_tatoeba_txt_is_read_as_is(tmp_path):
    path = tmp_path / "spa.txt"
    path.write_text(TATOEBA, encoding="utf-8")
    assert pairs(path) == [("Go.", "Ve."), ("Hi.", "Hola."), ("¿Qué?", "What?")]
    # Its columns swapped by index: Spanish -> English.
    assert pairs(path, source_column="1", target_column="0")[1] == ("Hola.", "Hi.")


def test_header_rule():
    assert looks_like_header(["english", "spanish"], (0, 1))
    assert looks_like_header(["pt", "en", "whatever it is"], (0, 1))
    assert not looks_like_header(["Go.", "Ve."], (0, 1))
    assert not looks_like_header(["hi there", "hola"], (0, 1))
    assert not looks_like_header(["English", "spanish"], (0, 1))


def test_header_flag_overrides_detection(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("hi\thola\nGo.\tVe.\n", encoding="utf-8")
    assert pairs(path) == [("Go.", "Ve.")]  # "hi hola" looks like column names
    assert pairs(path, has_header=False) == [("hi", "hola"), ("Go.", "Ve.")]


def test_named_columns_in_csv_and_jsonl(tmp_path):
    csv_path = tmp_path / "pairs.csv"
    csv_path.write_text('id,es,en\n1,"Hola, amigo.",Hi friend.\n2,Ve.,Go.\n', encoding="utf-8")
    assert pairs(csv_path, source_column="en", target_column="es") == [
        ("Hi friend.", "Hola, amigo."), ("Go.", "Ve.")]
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text('{"source": "Go.", "target": "Ve."}\n\n{"source": "Hi.", "target": "Hola."}\n'
                     , encoding="utf-8")
    assert pairs(jsonl) == [("Go.", "Ve."), ("Hi.", "Hola.")]
    keyed = tmp_path / "keyed.jsonl"
    keyed.write_text('{"en": "Go.", "es": "Ve."}\n', encoding="utf-8")
    assert pairs(keyed, source_column="en", target_column="es") == [("Go.", "Ve.")]
    half = tmp_path / "half.jsonl"
    half.write_text('{"en": "Go.", "target": "Ve."}\n', encoding="utf-8")
    assert pairs(half, source_column="en") == [("Go.", "Ve.")]  # the target keeps its key


@pytest.mark.parametrize("name, text, columns, message", [
    ("one.tsv", "Go.\nHi.\n", {}, r"one.tsv:1: one column; a translate file holds a source and "
                                  r"a target column"),
    ("empty.tsv", "english\tspanish\nGo.\tVe.\nHi.\t  \n", {},
     r"empty.tsv:3: empty target; every pair needs a source and a target text: fix the row or "
     r"pass --skip_bad_rows"),
    ("empty_source.tsv", "Go.\tVe.\n\tHola.\n", {}, r"empty_source.tsv:2: empty source"),
    ("short.tsv", "Go.\tVe.\nHi.\n", {}, r"short.tsv:2: expected at least 2 columns, found 1"),
    ("named.tsv", "english\tspanish\nGo.\tVe.\n", {"source_column": "french"},
     r"named.tsv:1: header has no column 'french'"),
    ("keys.jsonl", '{"en": "Go.", "es": "Ve."}\n', {}, r"keys.jsonl:1: object lacks the keys"),
    ("pairs.conll", "Go.\tVe.\n", {}, r"reads TSV, CSV or JSONL pair files"),
])
def test_bad_pair_files_are_one_line_errors(tmp_path, name, text, columns, message):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError, match=message) as info:
        pairs(path, **columns)
    assert "\n" not in str(info.value)


def test_skip_bad_rows_counts_empty_targets(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("Go.\tVe.\nHi.\t\nRun!\t¡Corre!\n", encoding="utf-8")
    from bert_trainer.data import sources  # noqa: PLC0415

    stats = sources.ReadStats(str(path))
    td = registry.resolve_task_data("translate")
    rows = list(td.load("train", file=str(path), skip_bad_rows=True, stats=stats))
    assert len(rows) == 2 and (stats.examples, stats.skipped, stats.skipped_lines) == (2, 1, [2])
    path.write_text("Go.\t\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"holds no examples \(all 1 rows were bad\)"):
        td.load("train", file=str(path), skip_bad_rows=True)


def test_tfds_presets_are_named_and_offline_errors_are_one_line(tmp_path):
    names = registry.task_names()
    assert {"ted_hrlr_translate/pt_to_en", "wmt14_translate/de-en", "translate"} <= set(names)
    td = registry.get_task_data("ted_hrlr_translate/pt_to_en")
    assert td.family_name == "translate" and td.tfds_keys == {"source": "pt", "target": "en"}
    with pytest.raises(UserError) as info:
        td.load("train", data_dir=str(tmp_path / "no_tfds"))
    assert "ted_hrlr_translate" in str(info.value) and "\n" not in str(info.value)


# -- the pipeline ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    words = ["go", "hi", "ve", "hola", "run", "corre", "the", "cat", "el", "gato", "is", "es",
             "big", "grande", ".", "!", "¡", "very", "muy"]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    return Tokenizer(str(path), lower_case=True)


def test_pair_features_follow_the_bert2bert_layout(tokenizer):
    batch = {"source": tf.constant(["Go.", "the cat is very very very big"]),
             "target": tf.constant(["Ve.", "el gato es muy muy muy grande"])}
    out = translate_data.pair_features(tokenizer, batch, seq_length=8, max_target_length=6)
    ids = {t: i for i, t in enumerate(tokenizer.vocab)}
    cls, sep = ids["[CLS]"], ids["[SEP]"]
    words = out[F.INPUT_WORD_IDS].numpy()
    np.testing.assert_array_equal(words[0], [cls, ids["go"], ids["."], sep, 0, 0, 0, 0])
    # The long source keeps its first seq_length - 2 pieces.
    np.testing.assert_array_equal(words[1], [cls, ids["the"], ids["cat"], ids["is"],
                                             ids["very"], ids["very"], ids["very"], sep])
    assert out[F.INPUT_TYPE_IDS].numpy().sum() == 0
    np.testing.assert_array_equal(out[F.INPUT_MASK].numpy().sum(1), [4, 8])
    dec, tgt = out[F.DECODER_INPUT_IDS].numpy(), out[F.TARGET_IDS].numpy()
    np.testing.assert_array_equal(dec[0], [cls, ids["ve"], ids["."], 0, 0, 0])
    np.testing.assert_array_equal(tgt[0], [ids["ve"], ids["."], sep, 0, 0, 0])
    # The long target keeps max_target_length - 1 pieces, then [SEP].
    np.testing.assert_array_equal(dec[1], [cls, ids["el"], ids["gato"], ids["es"], ids["muy"],
                                           ids["muy"]])
    np.testing.assert_array_equal(tgt[1], [ids["el"], ids["gato"], ids["es"], ids["muy"],
                                           ids["muy"], sep])
    # Teacher forcing: the decoder reads the target shifted right by one.
    words = (tgt[:, :-1] != 0) & (tgt[:, :-1] != sep)
    np.testing.assert_array_equal(dec[:, 1:][words], tgt[:, :-1][words])


def _raw(n_short: int, n_long: int) -> tf.data.Dataset:
    sources = ["hi ."] * n_short + ["the cat is very very very very very big ."] * n_long
    targets = ["hola ."] * n_short + ["el gato es muy muy muy muy muy grande ."] * n_long
    return tf.data.Dataset.from_tensor_slices({"source": sources, "target": targets})


def test_batches_are_cut_to_each_side_width(tokenizer):
    ds = translate_data.translate_dataset(
        _raw(8, 8), tokenizer, seq_length=32, max_target_length=24, batch_size=4,
        is_training=False, length_buckets=4)
    batches = list(ds)
    assert len(batches) == 4
    short, long = batches[0], batches[-1]
    # Short pairs pay for neither the long sources nor the long targets.
    assert short[F.INPUT_WORD_IDS].shape[1] == 8 and short[F.TARGET_IDS].shape[1] == 8
    assert long[F.INPUT_WORD_IDS].shape[1] == 16 and long[F.TARGET_IDS].shape[1] == 16
    for batch in batches:  # nothing real was cut
        assert batch[F.INPUT_MASK].numpy()[:, -1].sum() == 0 or batch[F.INPUT_MASK].shape[1] == 32
    full = list(translate_data.translate_dataset(
        _raw(8, 8), tokenizer, seq_length=32, max_target_length=24, batch_size=4,
        is_training=False, length_buckets=0))
    for cut, whole in zip(batches, full, strict=True):
        for key in (F.INPUT_WORD_IDS, F.TARGET_IDS, F.DECODER_INPUT_IDS):
            w = cut[key].shape[1]
            np.testing.assert_array_equal(cut[key].numpy(), whole[key].numpy()[:, :w])
            assert whole[key].numpy()[:, w:].sum() == 0
    index = np.concatenate([b[translate_data.EXAMPLE_INDEX].numpy() for b in batches])
    np.testing.assert_array_equal(index, np.arange(16))


def test_training_batches_are_static_and_grouped(tokenizer):
    ds = translate_data.translate_dataset(
        _raw(20, 20), tokenizer, seq_length=32, max_target_length=24, batch_size=4,
        is_training=True, length_buckets=4, group_by_length=True, seed=3, shuffle_buffer=64)
    for batch in ds.take(6):
        assert batch[F.INPUT_WORD_IDS].shape[0] == 4
        assert translate_data.EXAMPLE_INDEX not in batch
        lengths = set(batch[F.INPUT_MASK].numpy().sum(1).tolist())
        assert len(lengths) == 1  # one source bucket per batch (two lengths in the data)
