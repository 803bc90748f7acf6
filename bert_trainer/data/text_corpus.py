"""Reading pretraining text: input file lists, documents, sentences, Gutenberg headers.

Two input formats:

* `lines` - google-research/bert's format: one sentence per line, a blank line between
  documents (and every file ends a document).
* `prose` - ordinary text (books, speeches): hard-wrapped lines are joined into paragraphs
  (blank-line separated), paragraphs are split into sentences by `split_sentences`, and the
  paragraphs of a file form one document that is cut at heading-like lines ("CHAPTER IV",
  "Genesis 2", a short line with no sentence punctuation) and after `max_document_sentences`
  sentences, so one huge file never becomes one unbounded document.

`auto` picks per file from its first lines (see `detect_format`). Project Gutenberg licence
headers and footers are skipped in both formats. Everything streams line by line.
"""

import glob
import itertools
import os
import re
from collections.abc import Iterable, Iterator

from bert_trainer.errors import UserError

INPUT_FORMATS = ("auto", "lines", "prose")
ENCODING_ERRORS = ("strict", "replace", "skip")

# Abbreviations after which a period does not end a sentence (compared lower-cased, no dot).
_ABBREVIATIONS = frozenset("""
    mr mrs ms messrs mme mlle dr prof rev hon st sr jr gen col capt lt sgt maj gov sen rep pres
    supt esq fr mt ft ave blvd no nos vol vols fig figs pp ed eds cf viz vs etc al approx dept
    co corp inc ltd bros jan feb mar apr jun jul aug sep sept oct nov dec
""".split())
# Candidate boundary: terminal punctuation, optional closing quotes/brackets, whitespace, then
# something that can start a sentence (capital, digit, opening quote or bracket).
_BOUNDARY = re.compile(r"""([.!?]+)(["'\u201d\u2019)\]]*)\s+(?=["'\u201c\u2018(\[]*[A-Z0-9])""")
_WORD_BEFORE = re.compile(r"(\S+)$")
_INITIALS = re.compile(r"^(?:[A-Za-z]\.)*[A-Za-z]$")  # "U.S" or "J" (as in "J. R.").
_SENTENCE_END = re.compile(r"""[.!?]["'\u201d\u2019)\]]*$""")
_HEADING_WORDS = re.compile(
    r"^(chapter|book|part|volume|act|scene|canto|section|letter|stave)\b", re.IGNORECASE)
_GUTENBERG_START = re.compile(
    r"^\s*(\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG|\*END\*THE SMALL PRINT)", re.IGNORECASE)
_GUTENBERG_END = re.compile(
    r"^\s*(\*\*\*\s*)?END OF (THE |THIS )?PROJECT GUTENBERG", re.IGNORECASE)
_GUTENBERG_HEADER_SCAN = 1000  # Lines searched for a start marker before giving up.


def expand_inputs(spec, what: str = "--input") -> list[str]:
    """Expands comma-separated lists and globs into a sorted list of files.

    Args:
      spec: a string ("a.txt,dir/*.txt") or a list of such strings.
      what: the flag or argument name used in error messages.

    Returns:
      Sorted unique file paths.

    Raises:
      UserError: a pattern matches no file, or the result is empty.
    """
    parts = [spec] if isinstance(spec, str) else list(spec)
    patterns = [p.strip() for part in parts for p in str(part).split(",") if p.strip()]
    if not patterns:
        raise UserError(f"{what} is empty; pass text files (comma list or glob)")
    files = set()
    for pattern in patterns:
        if is_url(pattern):  # gs://, ram://: TensorFlow's file systems (no ** here).
            import tensorflow as tf  # noqa: PLC0415 (reading local text needs no TensorFlow)

            matches = [m for m in tf.io.gfile.glob(pattern) if not tf.io.gfile.isdir(m)]
        else:
            matches = [m for m in glob.glob(os.path.expanduser(pattern), recursive=True)
                       if os.path.isfile(m)]
        if not matches:
            raise UserError(f"{what}: '{pattern}' matches no file; check the path or glob")
        files.update(matches)
    return sorted(files)


def check_not_outputs(files: list[str], spec, own: dict[str, str], what: str = "--input",
                      recognize=None) -> None:
    """Refuses input files that are outputs, not text: this run's own (`own`), or a TFRecord
    file of any name (its first bytes are a record header). Read as text with
    `--encoding_errors=replace`, either would become examples of binary junk; and a run whose
    --input glob matches its own --output would read the files it is about to replace.

    Args:
      files: the expanded inputs (`expand_inputs`).
      spec: the --input value, named in the message.
      own: path of each file this run writes (a pattern with `*` for a shard set) -> what it
        is, e.g. "the vocabulary this run writes (--output=...)".
      what: the flag named in the message.
      recognize: optional fn(file) -> what output it is (e.g. "the summary of ..."), or None
        for a file that may be text.

    Raises:
      UserError: one line naming the file and the fix.
    """
    spec = spec if isinstance(spec, str) else ",".join(map(str, spec))
    fix = f"narrow {what} to the text files, e.g. {what}='DIR/*.txt'"
    patterns = {_canonical(path): description for path, description in own.items()}
    for file in files:
        path = _canonical(file)
        for pattern, description in patterns.items():
            if _matches(path, pattern):
                raise UserError(f"{what}={spec} matches {file}, {description}; {fix}")
        if is_tfrecord(file):
            raise UserError(f"{what}={spec} matches {file}, a TFRecord file (binary records, "
                            f"not text); {fix}")
        output = recognize(file) if recognize is not None else None
        if output:
            raise UserError(f"{what}={spec} matches {file}, {output}; {fix}")


def _matches(path: str, pattern: str) -> bool:
    """Whether `path` is `pattern`, or (a `*` in its file name) one of the files it names."""
    directory, name = os.path.split(pattern)
    if "*" not in name:
        return path == pattern
    prefix, _, suffix = name.partition("*")
    base = os.path.basename(path)
    return (os.path.dirname(path) == directory and len(base) >= len(prefix) + len(suffix)
            and base.startswith(prefix) and base.endswith(suffix))


def _canonical(path: str) -> str:
    """A path as two names of one local file compare equal (URLs as given)."""
    return path if is_url(path) else os.path.realpath(os.path.expanduser(path))


def is_tfrecord(path: str) -> bool:
    """Whether a local file starts as a TFRecord file does: an 8-byte length and its masked
    CRC-32C. A text file matches by chance with odds of 2^-32."""
    if is_url(path):
        return False  # Not read twice over the network: its text is checked as it is read.
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError:
        return False
    return len(head) == 12 and int.from_bytes(head[8:], "little") == _masked_crc32c(head[:8])


def _masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C (Castagnoli) of a few bytes (bitwise: 8 bytes, once a file)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def split_sentences(text: str) -> list[str]:
    """Splits a paragraph into sentences with a regex that knows common abbreviations.

    A boundary is `.`, `!` or `?` (plus closing quotes) followed by whitespace and a capital,
    digit or opening quote - unless the word before a `.` is an abbreviation ("Mr.", "etc.")
    or initials ("J.", "U.S.").

    Args:
      text: one paragraph; internal newlines are treated as spaces.

    Returns:
      Non-empty, whitespace-normalized sentences.
    """
    text = " ".join(text.split())
    sentences, start = [], 0
    for match in _BOUNDARY.finditer(text):
        if match.group(1) == ".":
            word = _WORD_BEFORE.search(text, start, match.start())
            stem = word.group(1).lstrip("\"'(\u201c\u2018[") if word else ""
            if stem.lower() in _ABBREVIATIONS or _INITIALS.match(stem):
                continue
        sentences.append(text[start:match.end(2)])
        start = match.end()
    if start < len(text):
        sentences.append(text[start:])
    return [s for s in sentences if s]


def is_url(path: str) -> bool:
    """Whether `path` names a file on a file system of TensorFlow's (gs://, ram://, ...)."""
    return "://" in str(path)


def open_binary(path: str):
    """`path` open for reading bytes: a local file, or through `tf.io.gfile` for a URL."""
    if is_url(path):
        import tensorflow as tf  # noqa: PLC0415 (reading local text needs no TensorFlow)

        return tf.io.gfile.GFile(path, "rb")
    return open(path, "rb")  # noqa: SIM115 (the caller closes it)


def _open_lines(path: str, encoding_errors: str, stats) -> Iterator[str]:
    """Yields the lines of a UTF-8 file without newline, handling undecodable lines.

    Args:
      path: the file.
      encoding_errors: "strict" (UserError naming file and line), "replace" (U+FFFD, which
        the tokenizer drops) or "skip" (drop the line).
      stats: optional Counter; "bad_utf8_lines" counts the lines replaced or skipped.
    """
    with open_binary(path) as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                if encoding_errors == "strict":
                    raise UserError(
                        f"{path}: line {number} is not UTF-8 ({e.reason} at byte {e.start}); "
                        "convert the file to UTF-8 or pass --encoding_errors=replace|skip"
                    ) from None
                if stats is not None:
                    stats["bad_utf8_lines"] += 1
                if encoding_errors == "skip":
                    continue
                line = raw.decode("utf-8", errors="replace")
            yield line.rstrip("\r\n")


def content_lines(path: str, encoding_errors: str = "strict", stats=None) -> Iterator[str]:
    """Lines of a text file without a Project Gutenberg licence header or footer.

    A file whose first non-blank line mentions Project Gutenberg is skipped up to its start
    marker ("*** START OF THE PROJECT GUTENBERG ..." or the old "*END*THE SMALL PRINT!") and
    stops at "End of the Project Gutenberg ...". If no start marker turns up within the first
    1000 lines, nothing is skipped. `encoding_errors` and `stats` are as in `read_documents`.
    """
    lines = _open_lines(path, encoding_errors, stats)
    head = []
    for line in lines:
        head.append(line)
        if line.strip():
            break
    if "gutenberg" in "".join(head).lower():
        scanned = head + list(itertools.islice(lines, _GUTENBERG_HEADER_SCAN))
        marker = next((i for i, s in enumerate(scanned) if _GUTENBERG_START.match(s)), None)
        head = scanned if marker is None else scanned[marker + 1:]
    for line in itertools.chain(head, lines):
        if _GUTENBERG_END.match(line):
            return
        yield line


def detect_format(path: str, sample_lines: int = 400, encoding_errors: str = "strict") -> str:
    """Guesses `lines` (one sentence per line) or `prose` from the start of a file.

    `lines` when at least 80% of the sampled non-blank lines end with sentence punctuation and
    they average at most 1.5 sentences each; hard-wrapped prose fails the first test, files
    with one paragraph per line (speeches) fail the second.
    """
    sample = [s.strip() for s in itertools.islice(
        content_lines(path, encoding_errors), sample_lines)]
    sample = [s for s in sample if s]
    if not sample:
        return "lines"
    ended = sum(bool(_SENTENCE_END.search(s)) for s in sample) / len(sample)
    per_line = sum(len(split_sentences(s)) for s in sample) / len(sample)
    return "lines" if ended >= 0.8 and per_line <= 1.5 else "prose"


def _is_heading(paragraph: list[str]) -> bool:
    """A one-line paragraph that is a section title rather than prose."""
    if len(paragraph) != 1:
        return False
    line = paragraph[0].strip()
    if _HEADING_WORDS.match(line) and len(line) <= 80:
        return True
    return len(line) <= 60 and not _SENTENCE_END.search(line)


def _paragraphs(lines: Iterable[str]) -> Iterator[list[str]]:
    """Groups lines into blank-line separated paragraphs (lists of stripped lines)."""
    paragraph = []
    for line in lines:
        line = line.strip()
        if line:
            paragraph.append(line)
        elif paragraph:
            yield paragraph
            paragraph = []
    if paragraph:
        yield paragraph


def _prose_documents(lines: Iterable[str], max_document_sentences: int) -> Iterator[list[str]]:
    document = []
    for paragraph in _paragraphs(lines):
        if _is_heading(paragraph):
            if document:
                yield document
            document = []
            continue
        document.extend(split_sentences(" ".join(paragraph)))
        while len(document) >= max_document_sentences:
            yield document[:max_document_sentences]
            document = document[max_document_sentences:]
    if document:
        yield document


def _line_documents(lines: Iterable[str], max_document_sentences: int) -> Iterator[list[str]]:
    for paragraph in _paragraphs(lines):
        for i in range(0, len(paragraph), max_document_sentences):
            yield paragraph[i:i + max_document_sentences]


def check_encoding_errors(encoding_errors: str) -> None:
    """Refuses an `encoding_errors` policy this module does not know."""
    if encoding_errors not in ENCODING_ERRORS:
        raise UserError(f"encoding_errors='{encoding_errors}' is unknown; "
                        f"use one of {ENCODING_ERRORS}")


def check_reading(input_format: str, encoding_errors: str) -> None:
    """Refuses an `input_format` or `encoding_errors` `read_documents` does not know."""
    if input_format not in INPUT_FORMATS:
        raise UserError(f"input_format='{input_format}' is unknown; use one of {INPUT_FORMATS}")
    check_encoding_errors(encoding_errors)


def read_documents(paths: Iterable[str], input_format: str = "auto",
                   max_document_sentences: int = 2000, encoding_errors: str = "strict",
                   stats=None) -> Iterator[list[str]]:
    """Streams documents (lists of sentence strings) from text files, in file order.

    Args:
      paths: text files (see `expand_inputs`).
      input_format: "lines", "prose" or "auto" (detected per file).
      max_document_sentences: longer documents are cut into pieces of this many sentences;
        bounds memory on files that have no document breaks.
      encoding_errors: a line that is not UTF-8 raises UserError ("strict"), has its bad
        bytes replaced ("replace") or is dropped ("skip").
      stats: optional `collections.Counter`; "bad_utf8_lines" counts non-UTF-8 lines.

    Yields:
      list[str]: the sentences of one document, each non-empty.
    """
    check_reading(input_format, encoding_errors)
    for path in paths:
        fmt = input_format
        if fmt == "auto":
            fmt = detect_format(path, encoding_errors=encoding_errors)
        reader = _line_documents if fmt == "lines" else _prose_documents
        yield from reader(content_lines(path, encoding_errors, stats), max_document_sentences)
