"""Tokenizer: parity with Hugging Face BertTokenizer ids, offsets, words, packing, errors."""

import json

import pytest
import tensorflow as tf
import tensorflow_text as tf_text

from bert_trainer import features
from bert_trainer.data.tokenizer import Tokenizer
from bert_trainer.errors import UserError

# Mismatch classes we accept against the Hugging Face reference: none. On all 712 texts
# (accents, CJK, emoji -> [UNK], control, zero-width and non-breaking characters, a 120-char
# word -> [UNK]) the ids match exactly, so the test below demands 100 % even though the issue
# asks for >= 99.9 %. Known divergences we would accept if a future fixture hit them:
# words of 100..200 bytes but < 100 chars (tf-text limits bytes, HF limits characters) and
# NFKC-only compatibility characters; neither occurs in the fixture.


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
    assert minilm_tokenizer.detokenize(ids).numpy().tolist() == [b"unflinchingly bleak , hello !"]


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
