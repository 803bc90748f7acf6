"""google-research/bert's character normalization as a `FastBertNormalizer` model.

BERT's `BasicTokenizer` cleans the text (deletes NUL, U+FFFD and every "C*" character - control,
format, private-use, unassigned - except tab/newline/return; turns whitespace into spaces),
lower-cases it (Python's `str.lower`), applies NFD and drops the non-spacing marks (Mn).
Hugging Face's `BertNormalizer` does the same. tensorflow-text's built-in
`lower_case_nfd_strip_accents` instead applies ICU's NFKC_Casefold before NFD, a
*compatibility* mapping: `½` becomes `1⁄2`, `´` a space and an accent, `ﬁ` `fi`, `²` `2`, `ß`
`ss`; and it keeps private-use characters, which BERT deletes.

All of these are per-character mappings, so they fit `FastBertNormalizer`'s model: a darts-clone
trie from a character's UTF-8 bytes to its normalized string. This module computes the table
from Python's `unicodedata` (BERT's own definition) and writes it in that format, so the fast
kernel - offsets included - normalizes exactly as BERT does. Two choices where the references
differ, both as Hugging Face's `tokenizers` does:
- The one context-dependent rule of `str.lower` (a final capital sigma becomes `ς`) is not per
  character; `tokenizers` lower-cases character by character, and the table maps `Σ` to `σ`.
- Characters unassigned in Python's Unicode tables (category Cn) are kept, not deleted: they
  are mostly characters of newer Unicode versions (e.g. emoji of 2022 for Python 3.11's Unicode
  14), which `tokenizers` and google-research/bert on a newer Python keep.

The private-use planes 15-16 (deleted) would make the trie 10x larger; `PRIVATE_USE_PLANES` is a
regex class the tokenizer first rewrites to `DELETE_MARK` (the same UTF-8 length, so offsets do
not move; deleted by the table).

Computing a table walks a quarter of a million characters in Python (about a CPU second), which
every process that builds a tokenizer would pay; `normalizer_model` keeps each table in the
user cache (`user_cache`, `normalizer/`), named by the casing, Python's Unicode version and a
digest of this file, so a change to any of them computes a new one.
"""

import functools
import hashlib
import itertools
import pathlib
import unicodedata

import flatbuffers
import numpy as np

from bert_trainer import user_cache

PRIVATE_USE_PLANES = r"[\x{f0000}-\x{ffffd}\x{100000}-\x{10fffd}]"  # Not the noncharacters.
DELETE_MARK = "\U000e0001"  # LANGUAGE TAG (Cf, 4 UTF-8 bytes, like the plane 15-16 ones).

# FastBertNormalizer's value encoding (tensorflow_text fast_bert_normalizer.h): bit 30 marks a
# character that changes; bits 6-29 the offset of its normalized string in the pool; bits 0-5
# its UTF-8 length.
_CHANGED = 1 << 30
_LENGTH_BITS = 6
_MAX_LENGTH = (1 << _LENGTH_BITS) - 1
_MAX_OFFSET = (1 << (30 - _LENGTH_BITS)) - 1

# Darts-clone unit layout (tensorflow_text darts_clone_trie_wrapper.h): bits 0-7 the label of
# the edge into the node, bit 8 "has a leaf child", bits 10-31 the XOR offset to the children;
# a leaf unit holds its value with bit 31 set (so it never matches a label).
_HAS_LEAF = 1 << 8
_LEAF = 1 << 31
_MAX_PLAIN_OFFSET = 1 << 21
_BLOCK = 256  # Children of a node share one aligned block: labels are bytes.
_WINDOW = 16 * _BLOCK


def is_deleted(char: str) -> bool:
    """BERT's `_clean_text` drops NUL, U+FFFD and control, format and private-use characters
    (and surrogates); unassigned ones are kept (see the module docstring)."""
    if char in "\t\n\r":
        return False
    return char in "\x00\ufffd" or unicodedata.category(char) in ("Cc", "Cf", "Co", "Cs")


def is_whitespace(char: str) -> bool:
    """Characters that separate words: BERT's `_is_whitespace` (space, \\t \\n \\r, Zs) plus the
    line and paragraph separators, which BERT keeps but then splits on (`str.split`)."""
    return char in " \t\n\r\u2028\u2029" or unicodedata.category(char) == "Zs"


def normalize_char(char: str, lower_case: bool) -> str:
    """One character as BERT's BasicTokenizer normalizes it.

    Args:
      char: a single character.
      lower_case: uncased BERT: lower-case, NFD, drop Mn; cased BERT keeps the character.

    Returns:
      "" (deleted), " " (whitespace) or the normalized string.
    """
    if is_deleted(char):
        return ""
    if is_whitespace(char):
        return " "
    if not lower_case:
        return char
    lower = char.lower()
    if lower == char and unicodedata.is_normalized("NFD", char):  # Most characters: fast.
        return "" if unicodedata.category(char) == "Mn" else char
    decomposed = unicodedata.normalize("NFD", lower)
    return "".join(c for c in decomposed if unicodedata.category(c) != "Mn")


def _changes(lower_case: bool) -> dict[int, str]:
    """{codepoint: normalized string} for every character the table holds: those that change,
    except the private-use planes (a regex deletes them)."""
    changes = {}
    # Planes 4-13 are unassigned (kept as they are), 15-16 private use (PRIVATE_USE_PLANES).
    for cp in itertools.chain(range(0xD800), range(0xE000, 0x40000), range(0xE0000, 0xF0000)):
        char = chr(cp)
        normalized = normalize_char(char, lower_case)
        if normalized != char:
            changes[cp] = normalized
    return changes


def _build_trie(values: dict[bytes, int]) -> np.ndarray:
    """A darts-clone double-array trie mapping each key to its value.

    Args:
      values: {key: value}; keys non-empty and free of NUL bytes, values in [0, 2**31).

    Returns:
      uint32 array of units; a node's children sit at `node ^ offset ^ label`, its leaf (the
      value) at `node ^ offset`.
    """
    root: dict = {}
    for key, value in values.items():
        node = root
        for byte in key:
            node = node.setdefault(byte, {})
        node[0] = value  # Label 0: the leaf.
    used = bytearray(_BLOCK)  # used[i]: unit i is taken; grows by whole blocks.
    used[0] = 1
    units = [0] * _BLOCK
    bases: set[int] = set()
    stack = [(root, 0)]
    while stack:
        node, position = stack.pop()
        labels = sorted(node)
        base = _free_base(used, bases, labels)
        if len(units) < len(used):
            units.extend([0] * (len(used) - len(units)))
        offset = base ^ position
        if offset >= _MAX_PLAIN_OFFSET:
            raise ValueError("trie too large for darts-clone's plain offsets")
        units[position] |= offset << 10 | (_HAS_LEAF if 0 in node else 0)
        for label in labels:
            child = base ^ label
            used[child] = 1
            if label == 0:
                units[child] = _LEAF | node[0]
            else:
                units[child] = label
                stack.append((node[label], child))
    while units[-1] == 0:  # Reads past the end fail like a missing label.
        units.pop()
    return np.asarray(units, np.uint32)


def _free_base(used: bytearray, bases: set[int], labels: list[int]) -> int:
    """A new base whose children `base ^ label` are all free (marks it used).

    Only the last `_WINDOW` units are searched (as darts-clone does), else a fresh block is
    added; a base is never reused, or two nodes would share their children.
    """
    start = max(1, len(used) - _WINDOW)
    while (free := used.find(0, start)) != -1:
        base = free ^ labels[0]  # Same 256-unit block as `free`, so inside `used`.
        if base not in bases and not any(used[base ^ label] for label in labels[1:]):
            break
        start = free + 1
    else:
        base = len(used)
        used.extend(bytes(_BLOCK))
    bases.add(base)
    return base


def _encode(changes: dict[int, str]) -> tuple[dict[bytes, int], int, bytes]:
    """Trie values, the value of NUL (kept out of the trie) and the string pool."""
    pool = bytearray()
    offsets: dict[bytes, int] = {}
    values = {}
    for cp, normalized in changes.items():
        data = _CHANGED
        if normalized:
            encoded = normalized.encode("utf-8")
            if encoded not in offsets:
                offsets[encoded] = len(pool)
                pool += encoded
            if len(encoded) > _MAX_LENGTH or offsets[encoded] > _MAX_OFFSET:
                raise ValueError(f"normalized form of U+{cp:04X} does not fit the model")
            data |= offsets[encoded] << _LENGTH_BITS | len(encoded)
        values[chr(cp).encode("utf-8")] = data
    zero = values.pop(b"\x00", 0)
    return values, zero, bytes(pool)


@functools.cache
def normalizer_model(lower_case: bool) -> bytes:
    """BERT's normalization as a `FastBertNormalizerModel` flatbuffer.

    Args:
      lower_case: uncased (lower-case, NFD, drop Mn) or cased (clean-up only) BERT.

    Returns:
      Bytes for `FastBertTokenizer(fast_bert_normalizer_model_buffer=...)`; the text must
      first have `PRIVATE_USE_PLANES` replaced by `DELETE_MARK`.
    """
    path = cache_path(lower_case)
    model = user_cache.read(path)
    if model is None:
        model = build_normalizer_model(lower_case)
        user_cache.write(path, model)
    return model


def cache_path(lower_case: bool) -> pathlib.Path:
    """Where `normalizer_model` keeps the table: named by all it depends on."""
    source = hashlib.sha256(pathlib.Path(__file__).read_bytes()).hexdigest()[:16]
    casing = "uncased" if lower_case else "cased"
    return (user_cache.cache_dir("normalizer")
            / f"bert-{casing}-unicode{unicodedata.unidata_version}-{source}.fb")


def build_normalizer_model(lower_case: bool) -> bytes:
    """`normalizer_model`'s table, computed (no cache)."""
    values, zero, pool = _encode(_changes(lower_case))
    trie = _build_trie(values)
    builder = flatbuffers.Builder(4 * len(trie) + len(pool) + 64)
    pool_vector = builder.CreateNumpyVector(np.frombuffer(pool, np.uint8))
    trie_vector = builder.CreateNumpyVector(trie)
    # Table FastBertNormalizerModel (fast_bert_normalizer_model.fbs), fields in slot order.
    builder.StartObject(4)
    builder.PrependBoolSlot(0, lower_case, False)
    builder.PrependUOffsetTRelativeSlot(1, trie_vector, 0)
    builder.PrependInt32Slot(2, zero, 0)
    builder.PrependUOffsetTRelativeSlot(3, pool_vector, 0)
    builder.Finish(builder.EndObject())
    return bytes(builder.Output())


def mark_deleted(texts):
    """Rewrites the private-use planes (deleted; left out of the table) to `DELETE_MARK`, a
    deleted character of the same UTF-8 length, so byte offsets stay those of the input.

    Args:
      texts: string tensor (or list) of any shape.

    Returns:
      string tensor of the same shape, to normalize with `normalizer_model`'s table.
    """
    import tensorflow as tf  # noqa: PLC0415 (the table itself needs no TensorFlow)

    return tf.strings.regex_replace(tf.convert_to_tensor(texts, tf.string), PRIVATE_USE_PLANES,
                                    DELETE_MARK)
