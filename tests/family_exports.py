"""Every family's real export, tiny: what `bert-train export` writes for each kind of model.

`export_every_family(root)` writes one SavedModel per family with the exporter's own
`build_serving_module` and `save`, and returns {name: export path}: classification of one text
and of pairs, regression, tagging, SQuAD (v1 and v2), the transformer translator (beam search,
and greedy with sinusoidal positions) and both GRU translators, the causal LM (the recipe's
gelu_new), a pretrained encoder, and an ALBERT classifier with the encoder options a .gin file
may change (relu, sinusoidal positions, pre-LayerNorm); the long-text modes (windows with mean
or max pooling, truncate, head_tail) are spread over them. The graph check's tests use them:
every op they hold must be in `bert_trainer/export/allowed_ops.txt`, so an export that starts
using a new op fails there, not at a user's `predict`.
"""

import dataclasses

import numpy as np
import tensorflow as tf
from causal_testing import MODEL, make_causal_model_dir
from export_testing import ENCODER, VOCAB, make_model_dir, scramble, write_vocab

from bert_trainer import features
from bert_trainer.checkpoints import model_dir
from bert_trainer.checkpoints.layout import model_trackable
from bert_trainer.encoders import AlbertEncoder, BertEncoder
from bert_trainer.encoders.builder import build_encoder
from bert_trainer.export import build_serving_module
from bert_trainer.export.exporter import save
from bert_trainer.models import BertClassifier
from bert_trainer.models.causal_lm import CausalLM
from bert_trainer.tasks.translate.task import TranslateConfig, build_model

SQUAD = {"doc_stride": 6, "max_query_length": 8, "max_answer_length": 10, "n_best": 10}
# name: (architecture, beam_size, the decoder's position_encoding)
TRANSLATORS = {"transformer": ("transformer", 2, "learned"),
               "transformer_greedy": ("transformer", 1, "sinusoidal"),
               "gru": ("gru", 1, "learned"), "gru_attention": ("gru_attention", 2, "learned")}
FAMILIES = ("classification", "pairs", "regression", "tagging", "squad", "squad_v2",
            *TRANSLATORS, "causal_lm", "pretraining", "albert")
# The long-text modes of FinetuneConfig (data/windows.py), one per text family.
WINDOWS = {"classification": {"long_texts": "truncate"},
           "pairs": {"long_texts": "windows", "window_pooling": "max"},
           "regression": {"long_texts": "head_tail"},
           "tagging": {"long_texts": "windows", "doc_stride": 5}}


def _translate_dir(path, name: str):
    architecture, beam_size, positions = TRANSLATORS[name]
    config = TranslateConfig(architecture=architecture, max_target_length=12,
                             max_decode_length=8, beam_size=beam_size,
                             position_encoding=positions)
    if architecture == "transformer":
        encoder = BertEncoder(vocab_size=len(VOCAB), **ENCODER)
    else:
        encoder = build_encoder(kind="gru", vocab_size=len(VOCAB), embedding_width=8,
                                hidden_size=12, max_sequence_length=32)
    model = build_model(encoder, config)
    ids = np.array([[2, 7, 8, 3, 0]], np.int32)  # built by a call: its decoder too
    model({features.INPUT_WORD_IDS: ids, features.INPUT_MASK: (ids > 0).astype(np.int32),
           features.INPUT_TYPE_IDS: np.zeros_like(ids), features.DECODER_INPUT_IDS: ids[:, :4]})
    scramble(model, seed=4, scale=0.1)
    path.mkdir(parents=True)
    task = {"name": f"toy_{name}", "family": "translate", "seq_length": 16,
            "text_keys": ["source", "target"], "translate": dataclasses.asdict(config)}
    model_dir.write_model_info(str(path), encoder, vocab_file=write_vocab(
        path.parent / f"{path.name}_vocab.txt"), lower_case=True, task=task)
    root = tf.train.Checkpoint(model=model_trackable(model), step=tf.Variable(7, tf.int64))
    tf.train.CheckpointManager(root, str(path), max_to_keep=1,
                               checkpoint_name=model_dir.CHECKPOINT_NAME).save(7)
    return path


def _pretraining_dir(path):
    encoder = BertEncoder(vocab_size=len(VOCAB), **ENCODER)
    scramble(encoder, seed=5)
    vocab = write_vocab(path.parent / "pretraining_vocab.txt")
    model_dir.write_pretrained(str(path), encoder=encoder, vocab_file=vocab,
                               task={"name": "pretraining", "family": "pretraining",
                                     "seq_length": 32})
    return path


def _albert_classifier():
    encoder = AlbertEncoder(vocab_size=len(VOCAB), **{**ENCODER, "embedding_width": 16},
                            inner_activation="relu", position_embedding_type="sinusoidal",
                            norm_first=True)
    model = BertClassifier(encoder, num_classes=3)
    scramble(model, seed=6)
    return model


def _model_dir(root, name: str):
    path = root / f"{name}_run"
    if name in TRANSLATORS:
        return _translate_dir(path, name)
    if name == "causal_lm":
        model = CausalLM(vocab_size=len(VOCAB), **{**MODEL, "inner_activation": "gelu_new"})
        scramble(model, seed=7, scale=0.2)
        return make_causal_model_dir(path, model=model)[0]
    if name == "pretraining":
        return _pretraining_dir(path)
    if name == "albert":
        return make_model_dir(path, "classification", model=_albert_classifier(),
                              label_names=["a", "b", "c"])[0]
    if name.startswith("squad"):
        squad = {"squad": SQUAD, "version_2": name == "squad_v2"}
        return make_model_dir(path, "squad", seed=3, task_extra=squad)[0]
    family = "classification" if name == "pairs" else name
    return make_model_dir(path, family, pair=name == "pairs", seed=2,
                          task_extra={"windows": WINDOWS[name]})[0]


def export_every_family(root, families=FAMILIES) -> dict:
    """Exports a tiny model of each of `families` under `root`; returns {name: export dir}."""
    exports = {}
    for name in families:
        module = build_serving_module(str(_model_dir(root, name)))
        exports[name] = save(module, str(root / f"{name}_export"))
    return exports
