"""Tiny fine-tuned-looking model directories for the export and predict tests.

`make_model_dir` writes what `bert-train finetune` writes (bert_train.json with a task entry,
vocab.txt, a trainer-style `ckpt-N`) for a tiny encoder whose weights are drawn with a large
scale, so outputs differ clearly between inputs and a tagger predicts entities.
"""

import keras
import numpy as np
import tensorflow as tf

from bert_trainer import features
from bert_trainer.checkpoints import model_dir
from bert_trainer.encoders import BertEncoder
from bert_trainer.models import BertClassifier, BertSpanLabeler, BertTokenClassifier

WORDS = ("the a an of on in at to is was who where what which does did live lives lived "
         "city capital country john mary smith paris london france england new york river "
         "cat dog sat mat good great nice fine bad awful poor terrible film movie was very "
         "not cafe resume naive eleve and or but it this that he she they").split()
PUNCT = list(".,;:!?'\"()-")
LETTERS = list("abcdefghijklmnopqrstuvwxyz0123456789")
VOCAB = list(dict.fromkeys(list(features.SPECIAL_TOKENS) + WORDS + PUNCT + LETTERS
                           + ["##" + c for c in LETTERS] + ["##ed", "##ing"]))
TAGS = ("O", "B-LOC", "I-LOC", "B-PER", "I-PER")
ENCODER = dict(hidden_size=32, num_layers=1, num_attention_heads=2, inner_dim=64,
               max_sequence_length=64)


def write_vocab(path) -> str:
    path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return str(path)


def build_model(family: str, num_classes: int = 2):
    encoder = BertEncoder(vocab_size=len(VOCAB), **ENCODER)
    if family == "squad":
        return BertSpanLabeler(encoder, name="bert_span_labeler")
    if family == "tagging":
        return BertTokenClassifier(encoder, num_classes=num_classes)
    return BertClassifier(encoder, num_classes=1 if family == "regression" else num_classes)


def scramble(model, seed: int = 0, scale: float = 0.3) -> None:
    """Replaces every weight with N(0, scale): decisive, input-dependent outputs."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign(rng.normal(scale=scale, size=v.shape).astype(np.float32))


def save_checkpoint(model, directory: str, step: int = 7) -> str:
    """A trainer-style checkpoint: root(model=..., step=...) as directory/ckpt-<step>."""
    root = tf.train.Checkpoint(model=model, step=tf.Variable(step, dtype=tf.int64))
    manager = tf.train.CheckpointManager(root, directory, max_to_keep=2,
                                         checkpoint_name=model_dir.CHECKPOINT_NAME)
    return manager.save(checkpoint_number=step)


def make_model_dir(path, family: str, *, label_names=None, pair: bool = False,
                   seq_length: int = 32, seed: int = 0, task_extra=None, model=None):
    """Writes a fine-tuned-style model directory; returns (path, model)."""
    path.mkdir(parents=True, exist_ok=True)
    if label_names is None and family in ("classification", "tagging"):
        label_names = list(TAGS) if family == "tagging" else ["negative", "positive"]
    if model is None:
        model = build_model(family, len(label_names or ()) or 2)
        scramble(model, seed)
    text_keys = ["question", "context"] if family == "squad" else (
        ["text", "text_b"] if pair else ["text"])
    task = {"name": f"toy_{family}", "family": family, "label_names": label_names,
            "seq_length": seq_length, "text_keys": text_keys, **(task_extra or {})}
    vocab = write_vocab(path.parent / f"{path.name}_vocab.txt")
    model_dir.write_model_info(str(path), model.encoder, vocab_file=vocab, lower_case=True,
                               task=task)
    save_checkpoint(model, str(path))
    return path, model


def encoder_inputs(ids, seq_length: int) -> dict:
    """Packs lists of ids (already with [CLS]/[SEP]) into padded int32 encoder inputs."""
    word_ids = np.zeros((len(ids), seq_length), np.int32)
    for i, row in enumerate(ids):
        word_ids[i, :len(row)] = row
    return {features.INPUT_WORD_IDS: word_ids,
            features.INPUT_MASK: (word_ids > 0).astype(np.int32),
            features.INPUT_TYPE_IDS: np.zeros_like(word_ids)}


def outputs_numpy(outputs: dict) -> dict:
    return {k: keras.ops.convert_to_numpy(v) for k, v in outputs.items()}


def best_span_score(window, start, end, n_best=20, max_answer_length=30) -> float:
    """Brute force: the best start + end logit of a valid span of one SQuAD window."""
    best = -np.inf
    for s in np.argsort(-start)[:n_best]:
        for e in np.argsort(-end)[:n_best]:
            if (window.char_spans[s, 0] >= 0 and window.is_max_context[s]
                    and window.char_spans[e, 0] >= 0 and s <= e < s + max_answer_length):
                best = max(best, start[s] + end[e])
    return best
