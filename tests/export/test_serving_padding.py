"""Text signatures pad a batch to its longest row, not to seq_length, in every family.

For each family one model is wrapped twice: padding to the batch's longest row (the default)
and padding to `seq_length` (what exports did before). Both must answer the same (float32
tolerance; discrete answers exactly), and the counts each returns (`input_tokens`,
`padding_tokens`) must show the difference: to the longest, some input of the batch has no
padding and every row is as wide as the longest; to seq_length, every row is seq_length wide.
"""

import numpy as np
import pytest
import tensorflow as tf
from causal_testing import build_causal_lm
from export_testing import ENCODER, TAGS, VOCAB, build_model, scramble, write_vocab
from numerics import assert_close

from bert_trainer import features, kernels
from bert_trainer.encoders import BertEncoder
from bert_trainer.serving import INPUT_TOKENS, PADDING_TOKENS
from bert_trainer.tasks.causal_lm.serving import CausalLMServing
from bert_trainer.tasks.classification.serving import ClassifierServing
from bert_trainer.tasks.regression.serving import RegressionServing
from bert_trainer.tasks.squad.serving import SquadServing
from bert_trainer.tasks.tagging.serving import TaggerServing
from bert_trainer.tasks.translate.serving import TranslateServing
from bert_trainer.tasks.translate.task import TranslateConfig
from bert_trainer.tasks.translate.task import build_model as build_translator

SEQ = 32
TEXTS = ["John Smith lives in Paris, France.", "the cat", "", "a very good film , not bad"]
TEXTS_B = ["a good film", "very  bad", "nice", "x"]
COUNTS = (INPUT_TOKENS, PADDING_TOKENS)


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    return write_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt")


def _scrambled(family, num_classes=2, seed=1):
    model = build_model(family, num_classes)
    scramble(model, seed)
    return model


def _translator():
    config = TranslateConfig(max_target_length=12, max_decode_length=8, beam_size=2)
    model = build_translator(BertEncoder(vocab_size=len(VOCAB), **ENCODER), config)
    ids = np.array([[2, 7, 8, 3, 0]], np.int32)  # a call builds the decoder too
    model({features.INPUT_WORD_IDS: ids, features.INPUT_MASK: (ids > 0).astype(np.int32),
           features.INPUT_TYPE_IDS: np.zeros_like(ids), features.DECODER_INPUT_IDS: ids[:, :4]})
    scramble(model, seed=4, scale=0.1)
    return model, {"beam_size": 2, "max_decode_length": 8}


# family -> (serving class, model factory -> (model, options), inputs)
FAMILIES = {
    "classification": (ClassifierServing, lambda: (_scrambled("classification"), {
        "label_names": ["negative", "positive"]}), {"text": TEXTS}),
    "pairs": (ClassifierServing, lambda: (_scrambled("classification", 3), {
        "label_names": ["a", "b", "c"], "pair": True, "long_texts": "truncate"}),
        {"text": TEXTS, "text_b": TEXTS_B}),
    "regression": (RegressionServing, lambda: (_scrambled("regression"), {
        "long_texts": "head_tail"}), {"text": TEXTS}),
    "tagging": (TaggerServing, lambda: (_scrambled("tagging", len(TAGS), seed=2), {
        "label_names": TAGS}), {"text": TEXTS}),
    "tagging_truncate": (TaggerServing, lambda: (_scrambled("tagging", len(TAGS), seed=2), {
        "label_names": TAGS, "long_texts": "truncate"}), {"text": TEXTS}),
    "squad": (SquadServing, lambda: (_scrambled("squad", seed=3), {
        "doc_stride": 6, "max_query_length": 8, "max_answer_length": 10, "n_best": 10}),
        {"question": ["who lives in paris?", "what?", "", "where is the cat"],
         "context": TEXTS}),
    "translate": (TranslateServing, _translator, {"input": TEXTS}),
    "causal_lm": (CausalLMServing, lambda: (build_causal_lm(seed=1), {"max_new_tokens": 6}),
                  {"prompt": TEXTS}),
}


def _serve(module, inputs) -> dict:
    outputs = module.text_function()(**{k: tf.constant(v) for k, v in inputs.items()})
    return {k: v.numpy() for k, v in outputs.items()}


def _modules(family, vocab_file):
    """The same model served to the batch's longest row, and to seq_length."""
    serving_class, make, inputs = FAMILIES[family]
    model, options = make()
    modules = []
    for pad_to_longest in (True, False):
        module = serving_class(model, vocab_file=vocab_file, lower_case=True, seq_length=SEQ,
                               **options)
        module.pad_to_longest = pad_to_longest
        modules.append(module)
    return modules, inputs


def _assert_same_answers(got: dict, expected: dict) -> None:
    assert set(got) == set(expected)
    for name, value in expected.items():
        if name in COUNTS:
            continue
        if value.dtype.kind == "f":
            assert_close(got[name], value, err_msg=name)
        else:
            np.testing.assert_array_equal(got[name], value, name)


@pytest.mark.slow  # every family's graph traced twice: over a few seconds
@pytest.mark.parametrize("family", list(FAMILIES))
def test_padding_to_the_longest_answers_as_padding_to_seq_length(family, vocab_file):
    (longest, full), inputs = _modules(family, vocab_file)
    got, expected = _serve(longest, inputs), _serve(full, inputs)
    _assert_same_answers(got, expected)
    np.testing.assert_array_equal(got[INPUT_TOKENS], expected[INPUT_TOKENS])
    real = got[INPUT_TOKENS]
    width = real.max()  # every input here is one row (no text is windowed)
    assert 2 <= width < SEQ  # the batch fits in fewer slots: the comparison means something
    # No row is padded beyond the batch's longest, and the longest is not padded at all.
    np.testing.assert_array_equal(got[PADDING_TOKENS], width - real)
    # A causal LM pads its prompts to the batch's longest either way (it always has).
    full_width = width if family == "causal_lm" else SEQ
    np.testing.assert_array_equal(expected[PADDING_TOKENS], full_width - real)


def test_padding_counts_of_windows_add_up_per_text(vocab_file):
    model = _scrambled("classification")
    module = ClassifierServing(model, label_names=["negative", "positive"],
                               vocab_file=vocab_file, lower_case=True, seq_length=12,
                               doc_stride=4)
    texts = ["the cat sat on the mat . " * 3, "nice", "a good film"]
    pieces = [len(module.tokenizer.tokenize([t]).flat_values) for t in texts]
    assert pieces[0] > 10  # the first text is windowed, the others fit
    out = _serve(module, {"text": texts})
    # Windows of 10 pieces, 4 apart, until one reaches the end; the longest row is 12 wide.
    starts = range(0, max(pieces[0] - 10, 0) + 4, 4)
    windows = [min(10, pieces[0] - s) + 2 for s in starts]
    assert out[INPUT_TOKENS].tolist() == [sum(windows), pieces[1] + 2, pieces[2] + 2]
    assert out[PADDING_TOKENS].tolist() == [sum(12 - w for w in windows), 10 - pieces[1],
                                            10 - pieces[2]]


def _op_types(module) -> set[str]:
    """The op types of the text signature's graph and of the functions it calls."""
    graph = module.text_function().get_concrete_function().graph.as_graph_def()
    return ({node.op for node in graph.node}
            | {node.op for f in graph.library.function for node in f.node_def})


@pytest.mark.slow
@pytest.mark.skipif(kernels.library() is None, reason="the fused kernels do not build here")
def test_in_process_serving_packs_tokens_with_the_kernels_and_answers_as_the_export(
        vocab_file):
    model = _scrambled("classification")
    export, in_process = (ClassifierServing(model, label_names=["negative", "positive"],
                                            vocab_file=vocab_file, lower_case=True,
                                            seq_length=SEQ) for _ in range(2))
    in_process.portable = False  # what `predict --model_dir` serves
    assert not any(op.startswith("Bert") for op in _op_types(export))  # TensorFlow's ops
    assert {"BertPackRows", "BertLayerNorm"} <= _op_types(in_process)
    _assert_same_answers(_serve(in_process, {"text": TEXTS}), _serve(export, {"text": TEXTS}))


def test_a_module_traced_for_in_process_serving_is_not_saved(vocab_file, tmp_path):
    from bert_trainer.export.exporter import save  # noqa: PLC0415

    module = ClassifierServing(_scrambled("classification"), label_names=["n", "p"],
                               vocab_file=vocab_file, lower_case=True, seq_length=SEQ)
    module.portable = False
    with pytest.raises(ValueError, match="portable=False"):
        save(module, str(tmp_path / "export"))
    assert not (tmp_path / "export").exists()

