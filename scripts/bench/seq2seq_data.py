"""Sentence pairs for the seq2seq benchmark: vocabulary, token ids and length-bucketed batches.

Every model of the benchmark (the plain-Keras baselines and bert-train's) trains on the same
token ids and the same batches: the parent process learns one joint, cased WordPiece vocabulary
from both sides of the training pairs (or takes a checkpoint's), tokenizes every pair once with
bert-train's `Tokenizer` and saves the ids; the workers load them (`load`).

Token convention (the translate family's): source `[CLS] src [SEP]`; decoder input
`[CLS] tgt`, target `tgt [SEP]`, both 0-padded (0 = no loss).
"""

import dataclasses
import os
import random

import numpy as np

from bert_trainer import features
from bert_trainer.data.tokenizer import Tokenizer
from bert_trainer.data.vocab import learn_vocab

BUCKET_MULTIPLE = 8  # Batch widths are rounded up to this: few distinct shapes to trace.


def read_pairs(path: str, limit: int = 0) -> list[tuple[str, str]]:
    """(english, spanish) pairs of a TSV with the header "english<TAB>spanish".

    Args:
      path: the file.
      limit: keep only the first `limit` pairs (0: all).

    Returns:
      list of (source, target) strings.
    """
    pairs = []
    with open(path, encoding="utf-8") as f:
        next(f)  # Header.
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if len(cols) >= 2 and cols[0] and cols[1]:
                pairs.append((cols[0], cols[1]))
            if limit and len(pairs) >= limit:
                break
    return pairs


def learn_joint_vocab(pairs, vocab_size: int, workdir: str) -> str:
    """Learns one cased WordPiece vocabulary from both sides of `pairs`; returns its path."""
    text = os.path.join(workdir, "vocab_input.txt")
    with open(text, "w", encoding="utf-8") as f:
        for source, target in pairs:
            f.write(f"{source}\n{target}\n")
    output = os.path.join(workdir, "vocab.txt")
    learn_vocab(text, vocab_size, output, lower_case=False, progress=None, overwrite=True)
    return output


@dataclasses.dataclass
class Encoded:
    """Token ids of a set of pairs (lists of int32 arrays, one per pair) and their texts."""

    sources: list
    decoder_inputs: list
    targets: list
    references: list  # Target texts, for BLEU.


def encode(tokenizer: Tokenizer, pairs, max_length: int) -> Encoded:
    """Tokenizes pairs; each side is cut to `max_length - 1` pieces (one slot for the marker).

    Args:
      tokenizer: bert-train's Tokenizer.
      pairs: (source, target) strings.
      max_length: longest source (with [CLS] and [SEP]) and decoder sequence.
    """
    cls, sep = np.int32(tokenizer.cls_id), np.int32(tokenizer.sep_id)
    sources, decoder_inputs, targets = [], [], []
    for start in range(0, len(pairs), 4096):  # Bounded tensors: ~100k pairs at once is slow.
        chunk = pairs[start:start + 4096]
        src = tokenizer.tokenize([s for s, _ in chunk]).to_list()
        tgt = tokenizer.tokenize([t for _, t in chunk]).to_list()
        for s, t in zip(src, tgt, strict=True):
            s, t = s[:max_length - 2], t[:max_length - 1]
            sources.append(np.array([cls, *s, sep], np.int32))
            decoder_inputs.append(np.array([cls, *t], np.int32))
            targets.append(np.array([*t, sep], np.int32))
    return Encoded(sources, decoder_inputs, targets, [t for _, t in pairs])


def save(path: str, encoded: Encoded) -> None:
    """Writes `encoded` as one .npz (ragged sides as flat values + lengths)."""
    arrays = {}
    for name in ("sources", "decoder_inputs", "targets"):
        seqs = getattr(encoded, name)
        arrays[name] = np.concatenate(seqs) if seqs else np.zeros([0], np.int32)
        arrays[name + "_lengths"] = np.array([len(s) for s in seqs], np.int64)
    arrays["references"] = np.array(encoded.references, dtype=object)
    with open(path + ".tmp", "wb") as f:
        np.savez(f, **arrays)
    os.replace(path + ".tmp", path)


def load(path: str) -> Encoded:
    """Reads what `save` wrote."""
    data = np.load(path, allow_pickle=True)
    sides = {}
    for name in ("sources", "decoder_inputs", "targets"):
        ends = np.cumsum(data[name + "_lengths"])
        sides[name] = np.split(data[name], ends[:-1]) if len(ends) else []
    return Encoded(references=list(data["references"]), **sides)


def _pad(seqs, width: int) -> np.ndarray:
    out = np.zeros([len(seqs), width], np.int32)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = s
    return out


def _width(seqs) -> int:
    longest = max(len(s) for s in seqs)
    return -(-longest // BUCKET_MULTIPLE) * BUCKET_MULTIPLE


def batch(encoded: Encoded, indices) -> dict:
    """One batch of the given pairs: the encoder inputs, decoder inputs and targets.

    Each side is padded to its longest sequence rounded up to `BUCKET_MULTIPLE`.
    """
    src = [encoded.sources[i] for i in indices]
    dec = [encoded.decoder_inputs[i] for i in indices]
    tgt = [encoded.targets[i] for i in indices]
    ids = _pad(src, _width(src))
    width = _width(dec)
    return {features.INPUT_WORD_IDS: ids,
            features.INPUT_MASK: (ids != 0).astype(np.int32),
            features.INPUT_TYPE_IDS: np.zeros_like(ids),
            features.DECODER_INPUT_IDS: _pad(dec, width),
            features.TARGET_IDS: _pad(tgt, width)}


def bucketed_order(encoded: Encoded, batch_size: int, seed: int) -> list[list[int]]:
    """One epoch of batches: shuffled, then sorted by length within windows of 50 batches.

    Pairs of similar length share a batch (short pairs do not pay for long ones); the batches
    are shuffled again so lengths do not drift through the epoch.
    """
    rng = random.Random(seed)
    order = list(range(len(encoded.sources)))
    rng.shuffle(order)
    window = 50 * batch_size
    batches = []
    for start in range(0, len(order), window):
        part = sorted(order[start:start + window],
                      key=lambda i: (len(encoded.targets[i]), len(encoded.sources[i])))
        batches += [part[i:i + batch_size] for i in range(0, len(part), batch_size)]
    rng.shuffle(batches)
    return [b for b in batches if len(b) == batch_size]  # Fixed batch: no extra shapes.


def batches_forever(encoded: Encoded, batch_size: int, seed: int = 0):
    """Yields training batches epoch after epoch (a new bucketed order each epoch)."""
    epoch = 0
    while True:
        order = bucketed_order(encoded, batch_size, seed + epoch)
        if not order:
            raise ValueError(f"fewer pairs ({len(encoded.sources)}) than one batch "
                             f"({batch_size})")
        for indices in order:
            yield batch(encoded, indices)
        epoch += 1
