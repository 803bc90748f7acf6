"""A small pure-Python BERT tokenizer, written from google-research/bert's published algorithm.

It is a second, independent reference for the golden ids (the first is Hugging Face's
`tokenizers`), so that a character both get wrong the same way is unlikely. The algorithm:

1. Clean: drop NUL, U+FFFD and control characters (Unicode category C*, except tab, newline
   and carriage return, which count as whitespace); turn whitespace (space, \\t \\n \\r, Zs)
   into a space.
2. Put spaces around CJK ideographs (the CJK Unified Ideographs blocks and their extensions and
   compatibility blocks).
3. Split on whitespace (`str.split`). For each word: if uncased, `str.lower()`, NFD, drop the
   non-spacing marks (Mn); then split off every punctuation character (category P*, or an ASCII
   symbol: ! to /, : to @, [ to `, { to ~) as a word of its own.
4. WordPiece each word: a word of more than 100 characters is `[UNK]`; else take the longest
   vocabulary prefix, then the longest `##`-prefixed entry for the rest, and so on; if some rest
   has no match the whole word is `[UNK]`.
"""

import unicodedata

MAX_WORD_CHARS = 100
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
_ASCII_SYMBOLS = ((33, 47), (58, 64), (91, 96), (123, 126))


def _whitespace(char: str) -> bool:
    return char in " \t\n\r" or unicodedata.category(char) == "Zs"


def _control(char: str) -> bool:
    return char not in "\t\n\r" and unicodedata.category(char).startswith("C")


def _punctuation(char: str) -> bool:
    cp = ord(char)
    return (any(lo <= cp <= hi for lo, hi in _ASCII_SYMBOLS)
            or unicodedata.category(char).startswith("P"))


def _cjk(char: str) -> bool:
    cp = ord(char)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def basic_tokenize(text: str, lower_case: bool = True) -> list[str]:
    """Steps 1-3: the words (punctuation split off) of `text`."""
    kept = []
    for char in text:
        if char in "\x00\ufffd" or _control(char):
            continue
        kept.append(" " if _whitespace(char) else f" {char} " if _cjk(char) else char)
    words = []
    for word in "".join(kept).split():
        if lower_case:
            word = unicodedata.normalize("NFD", word.lower())
            word = "".join(c for c in word if unicodedata.category(c) != "Mn")
        current = ""
        for char in word:
            if _punctuation(char):
                words.extend([current, char] if current else [char])
                current = ""
            else:
                current += char
        if current:
            words.append(current)
    return words


def wordpiece(word: str, vocab: dict[str, int], unk: str = "[UNK]") -> list[str]:
    """Step 4: greedy longest-match-first pieces of one word."""
    if len(word) > MAX_WORD_CHARS:
        return [unk]
    pieces = []
    start = 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                break
        else:
            return [unk]
        pieces.append(piece)
        start = end
    return pieces


class ReferenceTokenizer:
    """google-research/bert's `FullTokenizer` (uncased unless `lower_case=False`)."""

    def __init__(self, vocab_file: str, lower_case: bool = True):
        with open(vocab_file, encoding="utf-8") as f:
            self.vocab = {line.rstrip("\n"): i for i, line in enumerate(f)}
        self.lower_case = lower_case

    def tokenize(self, text: str) -> list[str]:
        return [piece for word in basic_tokenize(text, self.lower_case)
                for piece in wordpiece(word, self.vocab)]

    def encode(self, text: str) -> list[int]:
        """Ids with `[CLS]` and `[SEP]`, no truncation."""
        pieces = ["[CLS]"] + self.tokenize(text) + ["[SEP]"]
        return [self.vocab[piece] for piece in pieces]
