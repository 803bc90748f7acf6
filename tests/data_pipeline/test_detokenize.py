"""Detokenization: `##` joining, special tokens dropped, punctuation spacing restored, in-graph.

The round trip on real Spanish/English pairs with a learned cased vocabulary is in
tests/data_pipeline/test_vocab.py (it shares the vocabulary learned there from a pair file).
"""

import json
import subprocess
import sys

import pytest
import tensorflow as tf
from conftest import TESTS
from robust_testing import subprocess_env

from bert_trainer import features
from bert_trainer.data.tokenizer import Tokenizer, restore_spacing

_WORDS = ["¿", "¡", "?", "!", ".", ",", '"', "'", "-", "(", ")", "%", "$", ":", "#",
          "Dónde", "está", "el", "baño", "mañana", "Tom", "dice", "hola", "don", "t", "know",
          "I", "Coca", "Cola", "at", "2", "30", "p", "m", "6", "Sí", "un", "##ito", "##s", "niñ",
          "##o", "perr"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("detok") / "vocab.txt"
    path.write_text("\n".join([*features.SPECIAL_TOKENS, *_WORDS]) + "\n", encoding="utf-8")
    return Tokenizer(str(path), lower_case=False)


def _text(tensor) -> list[str]:
    return [t.decode("utf-8") for t in tensor.numpy().tolist()]


# (tokenized form, readable text): the spacing BERT's basic tokenizer adds and removes.
SPACING = [
    ("¿ Dónde está el baño ?", "¿Dónde está el baño?"),
    ("¡ Oh , no !", "¡Oh, no!"),
    ('Tom dice " hola " .', 'Tom dice "hola".'),
    ('" Look , " she said .', '"Look," she said.'),
    ("I don ' t know , it ' s Tom ' s .", "I don't know, it's Tom's."),
    ("I ’ m here", "I’m here"),
    ("my parents ' house", "my parents' house"),
    ("O ' Brien", "O'Brien"),
    ("a mother - in - law", "a mother-in-law"),
    ("at 2 : 30 p . m .", "at 2:30 p.m."),
    ("the U . S . A . is", "the U.S.A. is"),
    ("Hemos ido a EE . UU . hoy", "Hemos ido a EE.UU. hoy"),
    ("Sí . No . Yo .", "Sí. No. Yo."),
    ("I owe you 3 , 000 yen .", "I owe you 3,000 yen."),
    ("1 , 234 , 567", "1,234,567"),
    ("October 20 , 2013 .", "October 20, 2013."),
    ("It cost $ 30 .", "It cost $30."),
    ("Pagué 200 $ en impuestos .", "Pagué 200 $ en impuestos."),
    ("¿ Eres « poli » ?", "¿Eres «poli»?"),
    ("( Él ) Estaba [ a ] { b } 6 % ; c : d", "(Él) Estaba [a] {b} 6%; c: d"),
    ("20 / 20 y 3 . 5", "20/20 y 3.5"),
    ("Es tan triste . . .", "Es tan triste..."),
    ("el [UNK] y [MASK] .", "el [UNK] y [MASK]."),
    ("", ""),
]


@pytest.mark.parametrize("spaced,text", SPACING)
def test_restore_spacing(spaced, text):
    assert _text(restore_spacing(tf.constant([spaced]))) == [text]


def test_restore_spacing_keeps_the_shape():
    out = restore_spacing(tf.constant([["a ,", "b ."], ["¿ c", "d !"]]))
    assert out.shape == (2, 2)
    assert out.numpy().tolist() == [[b"a,", b"b."], [b"\xc2\xbfc", b"d!"]]


def test_detokenize_drops_specials_joins_pieces_and_restores_spacing(tokenizer):
    texts = ["¿Dónde está el perrito?", "Tom dice \"hola\".", "¡Sí! Coca-Cola, 6%",
             "I don't know", "at 2:30 p.m.", "mañana niños"]
    ids = tokenizer.tokenize(texts)
    assert tokenizer.unk_id not in ids.flat_values.numpy()
    assert _text(tokenizer.detokenize(ids)) == texts
    # Packed as the model sees them: [CLS] ... [SEP] and [PAD] to a fixed length, int64 too.
    packed = tokenizer.pack([ids], seq_length=12)[features.INPUT_WORD_IDS]
    assert packed.shape == (6, 12)
    assert _text(tokenizer.detokenize(packed)) == [
        "¿Dónde está el perrito?", 'Tom dice "hola".', "¡Sí! Coca-Cola, 6%", "I don't know",
        "at 2:30 p.m.", "mañana niños"]
    assert _text(tokenizer.detokenize(tf.cast(packed, tf.int64))) == _text(
        tokenizer.detokenize(packed))


def test_detokenize_edge_cases(tokenizer):
    vocab = {t: i for i, t in enumerate(tokenizer.vocab)}
    rows = [
        [],  # empty
        [vocab["[CLS]"], vocab["[SEP]"], 0, 0],  # only specials
        [vocab["##s"], vocab["el"]],  # a leading continuation piece has nothing to join
        [vocab["#"], vocab["#"], vocab["el"]],  # the word "##" is not a continuation
        [vocab["el"], vocab["[UNK]"], vocab["##s"], vocab["[MASK]"]],
    ]
    out = _text(tokenizer.detokenize(tf.ragged.constant(rows, dtype=tf.int32)))
    assert out == ["", "", "s el", "# # el", "el [UNK]s [MASK]"]


def test_detokenize_runs_in_a_tf_function(tokenizer):
    @tf.function(input_signature=[tf.RaggedTensorSpec([None, None], tf.int32)])
    def detok(ids):
        return tokenizer.detokenize(ids)

    ids = tokenizer.tokenize(["¿Dónde está el baño?", "hola"])
    assert _text(detok(ids)) == ["¿Dónde está el baño?", "hola"]


@pytest.mark.slow  # a fresh TensorFlow process
def test_detokenize_serves_from_a_saved_model_without_bert_trainer(tokenizer, tmp_path):
    module = tf.Module()
    module.tokenizer = tokenizer
    module.detokenize = tf.function(
        lambda ids: {"text": tokenizer.detokenize(ids)},
        input_signature=[tf.TensorSpec([None, None], tf.int32)])
    export = tmp_path / "export"
    tf.saved_model.save(module, str(export),
                        signatures={"serving_default": module.detokenize})
    ids = tokenizer.pack([tokenizer.tokenize(["¿Dónde está el baño?", "mañana"])], 10)
    requests = [{"key": "detok", "export": str(export), "signature": "serving_default",
                 "inputs": {"ids": ids[features.INPUT_WORD_IDS].numpy().tolist()}}]
    (tmp_path / "requests.json").write_text(json.dumps(requests), encoding="utf-8")
    subprocess.run([sys.executable, "-I", str(TESTS / "serving_check.py"),
                    str(tmp_path / "requests.json"), str(tmp_path / "results.json")],
                   check=True, env=subprocess_env())
    results = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert results["detok"]["text"] == ["¿Dónde está el baño?", "mañana"]
