"""Tokenizer: parity with Hugging Face BertTokenizer ids, offsets, words, packing, errors."""

import json
import unicodedata

import pytest
import tensorflow as tf
import tensorflow_text as tf_text
from conftest import TESTS

from bert_trainer import features
from bert_trainer.data import bert_normalizer, tokenizer
from bert_trainer.data.tokenizer import Tokenizer
from bert_trainer.errors import UserError

# Mismatch classes we accept against the Hugging Face reference: none. On all 712 texts
# (accents, CJK, emoji -> [UNK], control, zero-width and non-breaking characters, a 120-char
# word -> [UNK]), the 68 compatibility-character texts of tests/data and every IMDB and SST-2
# text the ids match exactly, so the tests below demand 100 %. A known divergence we would
# accept if a future text hit it: words of 100..400 bytes but at most 100 characters (tf-text
# limits bytes, the reference characters).

COMPAT_GOLDEN = TESTS / "data" / "tokenizer_compat_golden.jsonl"
# FastBertTokenizer's built-in normalization (NFKC_Casefold), which the Tokenizer used before.
BUILT_IN_DELETED = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x{9f}\x{fffd}\p{Co}]"


# Texts google-research/bert's `_clean_text` changes and bare FastBertTokenizer got wrong, with
# ids (no [CLS]/[SEP]) from the pure-Python Hugging Face reference, made on the MiniLM vocab by
#   from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy
#   BertTokenizerLegacy(vocab_txt, do_lower_case=True)(text, add_special_tokens=False)["input_ids"]
# (transformers 5.23; its `BertTokenizer` is the Rust one). The first five are corpus lines of
# `make bench` (the files are read with errors="replace", which leaves U+FFFD): U+FFFD is deleted,
# not [UNK]. Then C0/C1 controls and DEL are deleted, not word breaks; private-use characters are
# deleted, not [UNK]; \t \n \r stay spaces.
CLEAN_TEXT_REFERENCE = [
    ("Ant. C\ufffdsar, my Lord", [14405, 1012, 27804, 2099, 1010, 2026, 2935]),
    ("As a people, we had too many visions\ufffdXand too little vision.",
     [2004, 1037, 2111, 1010, 2057, 2018, 2205, 2116, 12018, 18684, 4859, 2205, 2210, 4432, 1012]),
    ("The program I shall propose to Congress will be the most comprehensive and costly program "
     "in this field in America\ufffd\ufffds history.",
     [1996, 2565, 1045, 4618, 16599, 2000, 3519, 2097, 2022, 1996, 2087, 7721, 1998, 17047, 2565,
      1999, 2023, 2492, 1999, 10925, 2381, 1012]),
    ("Listen to President Thomas Jefferson in 1802: We act not \ufffd\ufffdfor ourselves along, "
     "but for the whole human race.\ufffd\ufffd",
     [4952, 2000, 2343, 2726, 7625, 1999, 13515, 1024, 2057, 2552, 2025, 2005, 9731, 2247, 1010,
      2021, 2005, 1996, 2878, 2529, 2679, 1012]),
    ("\ufffd@These first years of the 1970s have been good years for America.",
     [1030, 2122, 2034, 2086, 1997, 1996, 3955, 2031, 2042, 2204, 2086, 2005, 2637, 1012]),
    ("c\x00sar c\x01sar c\x1bsar c\x7fsar c\x85sar c\x9fsar",
     [27804, 2099, 27804, 2099, 27804, 2099, 27804, 2099, 27804, 2099, 27804, 2099]),
    ("c\ue000sar \U000f0001c\U0010fffdsar \ufffd\ufffd", [27804, 2099, 27804, 2099]),
    ("tab\tnew\nline\rreturn \x0bvertical\x0cfeed", [21628, 2047, 2240, 2709, 7471, 7959, 2098]),
    ("\x01\x02H\u00e9llo \x85W\u00f6rld\ue000!\x7f", [7592, 2088, 999]),
]


@pytest.fixture
def minilm_tokenizer(minilm_dir):
    return Tokenizer(str(minilm_dir / "vocab.txt"), lower_case=True)


def _golden(shared_dir):
    path = shared_dir / "fixtures" / "minilm" / "tokenizer_golden.jsonl"
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_ids_match_huggingface_reference(minilm_tokenizer, shared_dir):
    rows = _golden(shared_dir)
    assert len(rows) == 712
    ids = minilm_tokenizer.tokenize([r["text"] for r in rows]).to_list()
    got = [[minilm_tokenizer.cls_id] + i + [minilm_tokenizer.sep_id] for i in ids]
    mismatched = [r["text"] for r, g in zip(rows, got, strict=True) if g != r["ids"]]
    assert mismatched == []


def test_deleted_characters_match_huggingface_reference(minilm_tokenizer):
    texts = [text for text, _ in CLEAN_TEXT_REFERENCE]
    got = minilm_tokenizer.tokenize(texts).to_list()
    with_offsets = minilm_tokenizer.tokenize_with_offsets(texts)[0].to_list()
    for (text, expected), ids, offset_ids in zip(CLEAN_TEXT_REFERENCE, got, with_offsets,
                                                 strict=True):
        assert ids == expected, ascii(text)
        assert offset_ids == expected, ascii(text)


def test_offsets_index_the_original_bytes_around_deleted_characters(minilm_tokenizer):
    # The normalizer deletes them with an offset map, so a piece's span starts at its first kept
    # character and ends where the next kept character begins: a deleted character right after
    # a piece belongs to its span. Plane-16 private use is first rewritten to a same-length mark.
    text = "\x1bC\ufffdsar\x00, my L\x01ord\x7f \x85x\U000f0001y"
    ids, starts, ends = minilm_tokenizer.tokenize_with_offsets([text])
    raw = text.encode("utf-8")
    spans = zip(starts[0].numpy(), ends[0].numpy(), strict=True)
    pieces = [raw[s:e].decode("utf-8") for s, e in spans]
    assert pieces == ["C\ufffdsa", "r\x00", ",", "my", "L\x01ord\x7f", "x\U000f0001", "y"]
    tokens = minilm_tokenizer.convert_ids_to_tokens(ids[0]).numpy().tolist()
    assert tokens == [b"csa", b"##r", b",", b"my", b"lord", b"x", b"##y"]


def test_special_ids_and_vocab_size(minilm_tokenizer):
    tok = minilm_tokenizer
    assert tok.vocab_size == 30522 == len(tok.vocab)
    assert tok.special_ids == (0, 100, 101, 102, 103)
    assert tok.convert_ids_to_tokens(tf.constant([101, 7592])).numpy().tolist() == [
        b"[CLS]", b"hello"]


def test_offsets_index_the_original_utf8_bytes(minilm_tokenizer):
    text = "Héllo Wörld! unflinchingly"
    ids, starts, ends = minilm_tokenizer.tokenize_with_offsets([text])
    raw = text.encode("utf-8")
    spans = zip(starts[0].numpy(), ends[0].numpy(), strict=True)
    pieces = [raw[s:e].decode("utf-8") for s, e in spans]
    # Accented words keep their original bytes (é is 2 bytes in UTF-8, 1 after accent strip).
    assert pieces == ["Héllo", "Wörld", "!", "un", "fl", "in", "ching", "ly"]
    assert ids.dtype == tf.int32 and starts.dtype == tf.int64


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_words_group_pieces_like_tf_text_bert_tokenizer(minilm_tokenizer, shared_dir):
    texts = [r["text"] for r in _golden(shared_dir)] + ["", "##abc ##"]
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
        minilm_tokenizer.vocab, tf.range(minilm_tokenizer.vocab_size, dtype=tf.int64)), -1)
    reference = tf_text.BertTokenizer(table, token_out_type=tf.int32, lower_case=True)
    words = minilm_tokenizer.tokenize_words(texts)
    assert words.shape.rank == 3
    assert words.to_list() == reference.tokenize(texts).to_list()


def test_words_in_graph(minilm_tokenizer):
    fn = tf.function(minilm_tokenizer.tokenize_words)
    assert fn(tf.constant(["unflinchingly bleak", ""])).to_list() == [
        [[4895, 10258, 2378, 8450, 2135], [21657]], []]


def test_detokenize_joins_pieces(minilm_tokenizer):
    ids = minilm_tokenizer.tokenize(["Unflinchingly bleak, Héllo!"])
    assert minilm_tokenizer.detokenize(ids).numpy().tolist() == [b"unflinchingly bleak, hello!"]


def test_pack_pair_truncates_longer_segment_first(minilm_tokenizer):
    tok = minilm_tokenizer
    a = tf.ragged.constant([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [1, 2], [1, 2, 3, 4, 5]])
    b = tf.ragged.constant([[11, 12, 13], [14], [11, 12, 13, 14, 15]])
    out = tok.pack([a, b], seq_length=10)
    assert set(out) == set(features.ENCODER_INPUTS)
    for value in out.values():
        assert value.dtype == tf.int32 and value.shape == (3, 10)
    ids = out[features.INPUT_WORD_IDS].numpy().tolist()
    # Budget 7: (10, 3) -> (4, 3); (5, 5) -> (4, 3) as _truncate_seq_pair (ties trim B).
    assert ids[0] == [101, 1, 2, 3, 4, 102, 11, 12, 13, 102]
    assert ids[1] == [101, 1, 2, 102, 14, 102, 0, 0, 0, 0]
    assert ids[2] == [101, 1, 2, 3, 4, 102, 11, 12, 13, 102]
    assert out[features.INPUT_TYPE_IDS].numpy().tolist()[1] == [0, 0, 0, 0, 1, 1, 0, 0, 0, 0]
    assert out[features.INPUT_MASK].numpy().tolist()[1] == [1, 1, 1, 1, 1, 1, 0, 0, 0, 0]


def test_pack_single_segment(minilm_tokenizer):
    out = minilm_tokenizer.pack([minilm_tokenizer.tokenize(["a sometimes tedious film ."])], 6)
    assert out[features.INPUT_WORD_IDS].numpy().tolist() == [[101, 1037, 2823, 6945, 6313, 102]]
    assert out[features.INPUT_TYPE_IDS].numpy().sum() == 0


def test_pack_rejects_too_short_length(minilm_tokenizer):
    seg = tf.ragged.constant([[1]])
    with pytest.raises(UserError, match="seq_length=2 is too short for 2 segment"):
        minilm_tokenizer.pack([seg, seg], 2)
    with pytest.raises(UserError, match="seq_length=1 is too short for 1 segment"):
        minilm_tokenizer.pack([seg], 1)


def test_vocab_without_special_tokens_names_file_and_tokens(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("[PAD]\n[UNK]\n[CLS]\nhello\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"vocab.txt lacks the special tokens \[SEP\] \[MASK\]"):
        Tokenizer(str(path))


def test_vocab_file_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        Tokenizer(str(tmp_path / "nope.txt"))
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("[PAD]\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(UserError, match="latin1.txt is not UTF-8"):
        Tokenizer(str(bad))
    dup = tmp_path / "dup.txt"
    dup.write_text("\n".join(features.SPECIAL_TOKENS + ("a", "a")) + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"repeats tokens \['a'\]"):
        Tokenizer(str(dup))


def test_cased_tokenizer_keeps_case(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(features.SPECIAL_TOKENS + ("Hello", "hello", "##s")) + "\n",
                    encoding="utf-8")
    cased = Tokenizer(str(path), lower_case=False)
    uncased = Tokenizer(str(path), lower_case=True)
    assert cased.tokenize(["Hellos hello"]).to_list() == [[5, 7, 6]]
    assert uncased.tokenize(["Hellos HELLO"]).to_list() == [[6, 7, 6]]


def _compat_golden():
    with open(COMPAT_GOLDEN, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _built_in_ids(tokenizer, texts):
    """Ids with FastBertTokenizer's built-in normalization and the old clean-up."""
    fast = tf_text.FastBertTokenizer(vocab=tokenizer.vocab, unknown_token=features.UNK,
                                     token_out_type=tf.int32, lower_case_nfd_strip_accents=True)
    return fast.tokenize(tf.strings.regex_replace(texts, BUILT_IN_DELETED, "")).to_list()


def test_compatibility_characters_match_reference(minilm_tokenizer):
    rows = _compat_golden()
    assert len(rows) == 68
    texts = [r["text"] for r in rows]
    # The file covers the character classes that NFKC and NFD treat differently.
    for char in "´¨˜¸ˆ½¼¾⅓ﬁﬂæœ²³¹ⁿ₂Ａｂ１！（）Ⅻⅳ㎞℃℉㎏№™℡ﻻﷺſµÅK…ŉǆ①\u00a0\u202f영फ़":
        assert any(char in t for t in texts), char
    ids = minilm_tokenizer.tokenize(texts).to_list()
    with_offsets = minilm_tokenizer.tokenize_with_offsets(texts)[0].to_list()
    cls, sep = minilm_tokenizer.cls_id, minilm_tokenizer.sep_id
    mismatched = [ascii(r["text"]) for r, i in zip(rows, ids, strict=True)
                  if [cls] + i + [sep] != r["ids"]]
    assert mismatched == []
    assert with_offsets == ids
    # The reported examples, by token.
    tokens = minilm_tokenizer.convert_ids_to_tokens(
        minilm_tokenizer.tokenize(["it´s ½"])[0]).numpy().tolist()
    assert tokens == [b"it", "##´s".encode(), "½".encode()]


def test_built_in_normalization_fails_the_compat_golden(minilm_tokenizer):
    # The golden test can fail: tf-text's NFKC_Casefold normalization gets most rows wrong.
    rows = _compat_golden()
    got = _built_in_ids(minilm_tokenizer, [r["text"] for r in rows])
    cls, sep = minilm_tokenizer.cls_id, minilm_tokenizer.sep_id
    wrong = sum([cls] + g + [sep] != r["ids"] for r, g in zip(rows, got, strict=True))
    assert wrong >= 30


def test_references_disagree_only_on_known_rows():
    # Rows where the pure-Python google-research/bert implementation differs from tokenizers
    # (its ids are in google_ids): a final capital sigma (str.lower gives ς, tokenizers and we
    # σ) and an unassigned character (google-research/bert deletes it, tokenizers and we keep
    # it as [UNK]).
    differ = [r["text"] for r in _compat_golden() if "google_ids" in r]
    assert len(differ) == 3
    assert sum("Σ" in t for t in differ) == 2
    assert any(unicodedata.category(c) == "Cn" for c in differ[-1])


def _real_texts(shared_dir):
    texts = []
    for path in ("imdb/train_sample.tsv", "sst2/dev.tsv"):
        with open(shared_dir / "data" / path, encoding="utf-8", newline="") as f:
            lines = f.read().split("\n")[1:]
        texts += [line.split("\t")[0] for line in lines if line.strip()]
    return texts


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_real_reviews_match_tokenizers(minilm_tokenizer, minilm_dir, shared_dir):
    # Every IMDB sample review and SST-2 dev sentence, full length, against Hugging Face's
    # tokenizers computed now; the old normalization got three IMDB reviews wrong (´s, ½).
    tokenizers = pytest.importorskip("tokenizers")
    texts = _real_texts(shared_dir)
    assert len(texts) == 1999 + 872
    reference = tokenizers.BertWordPieceTokenizer(str(minilm_dir / "vocab.txt"), lowercase=True)
    want = [e.ids for e in reference.encode_batch(texts, add_special_tokens=False)]
    got = minilm_tokenizer.tokenize(texts).to_list()
    assert [t for t, g, w in zip(texts, got, want, strict=True) if g != w] == []
    old = _built_in_ids(minilm_tokenizer, texts)
    wrong = [t for t, o, w in zip(texts, old, want, strict=True) if o != w]
    assert len(wrong) == 3 and all("´s" in t or "½" in t for t in wrong)


@pytest.mark.slow  # over a few seconds: left out of make test-fast
@pytest.mark.parametrize("lower_case", [True, False])
def test_normalizer_table_on_every_character(lower_case):
    # FastBertNormalizer with the table equals bert_normalizer.normalize_char on every
    # codepoint, so the darts-clone trie, the flatbuffer and the private-use regex are right.
    # The table is computed here; the one a tokenizer reads (from the user cache) is the same.
    model = bert_normalizer.build_normalizer_model(lower_case)
    assert bert_normalizer.normalizer_model(lower_case) == model
    normalizer = tf_text.FastBertNormalizer(model_buffer=model)
    chars = [chr(cp) for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    texts = tf.strings.regex_replace([f"a{c}b" for c in chars],
                                     bert_normalizer.PRIVATE_USE_PLANES,
                                     bert_normalizer.DELETE_MARK)
    got = normalizer.normalize(texts).numpy().tolist()
    wrong = [f"U+{ord(c):04X}" for c, g in zip(chars, got, strict=True)
             if g != f"a{bert_normalizer.normalize_char(c, lower_case)}b".encode()]
    assert wrong == []


def test_normalize_char_follows_bert():
    norm = bert_normalizer.normalize_char
    assert [norm(c, True) for c in "´½ﬁ²ＡⅫ㎞ﷺſµÅKÉ가"] == [
        "´", "½", "ﬁ", "²", "ａ", "ⅻ", "㎞", "ﷺ", "ſ", "µ", "a", "k", "e", "\u1100\u1161"]
    assert [norm(c, True) for c in "\x00\x01\x85\ufffd\u200b\ue000\u0301\u0378"] == [
        "", "", "", "", "", "", "", "\u0378"]
    assert [norm(c, True) for c in "\t\u00a0\u202f\u3000\u2028"] == [" "] * 5
    assert norm("İ", True) == "i" and norm("ẞ", True) == "ß" and norm("Σ", True) == "σ"
    # Cased BERT only cleans: case, accents and compatibility characters stay.
    assert [norm(c, False) for c in "ÉΣ½\u0301\x01\u00a0"] == ["É", "Σ", "½", "\u0301", "", " "]


def test_cased_tokenizer_matches_tokenizers_without_lowercasing(tmp_path):
    # Cased BERT (google-research/bert with do_lower_case=False, tokenizers with
    # lowercase=False): no lower-casing, no NFD, no accent stripping. A vocabulary of every
    # character (and its ## form) of the words makes the ids show the normalization.
    tokenizers = pytest.importorskip("tokenizers")
    texts = [r["text"] for r in _compat_golden()]
    normalizer = tokenizers.normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    chars = sorted({c for t in texts for c in normalizer.normalize_str(t) if not c.isspace()})
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(list(features.SPECIAL_TOKENS) + chars + ["##" + c for c in chars])
                    + "\n", encoding="utf-8")
    reference = tokenizers.BertWordPieceTokenizer(str(path), lowercase=False)
    want = [e.ids for e in reference.encode_batch(texts, add_special_tokens=False)]
    cased = Tokenizer(str(path), lower_case=False)
    got = cased.tokenize(texts).to_list()
    assert [ascii(t) for t, g, w in zip(texts, got, want, strict=True) if g != w] == []
    tokens = cased.convert_ids_to_tokens(cased.tokenize(["Straße½"])[0]).numpy().tolist()
    assert [t.decode() for t in tokens] == ["S", "##t", "##r", "##a", "##ß", "##e", "##½"]


def test_saved_model_tokenizes_like_the_tokenizer(minilm_tokenizer, tmp_path):
    # Exported models carry the normalizer table as a constant of the tokenizer's graph.
    module = tf.Module()
    module.tokenizer = minilm_tokenizer
    module.tokenize = tf.function(lambda texts: minilm_tokenizer.tokenize(texts).to_tensor(),
                                  input_signature=[tf.TensorSpec([None], tf.string)])
    tf.saved_model.save(module, str(tmp_path / "model"))
    loaded = tf.saved_model.load(str(tmp_path / "model"))
    texts = [r["text"] for r in _compat_golden()]
    assert (loaded.tokenize(tf.constant(texts)).numpy().tolist()
            == minilm_tokenizer.tokenize(texts).to_tensor().numpy().tolist())


def test_vocab_is_cased_reads_capitals_outside_the_special_tokens():
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]"]
    assert not tokenizer.vocab_is_cased([*specials, "the", "##s", "ñandú", "¿"])
    assert tokenizer.vocab_is_cased([*specials, "the", "Tom", "ñandú"])
    assert tokenizer.vocab_is_cased([*specials, "##Á"])
