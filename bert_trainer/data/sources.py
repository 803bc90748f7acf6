"""Readers for local fine-tuning files: TSV/CSV/JSONL tables, SQuAD JSON, CoNLL column files.

Readers are host-side Python generators that yield one record at a time with the 1-based line
number it came from, so callers can name `file:line` when a value turns out to be wrong (a
label outside the label set). Bad input raises `UserError` in one line naming the file and the
line; with `skip_bad_rows=True` a malformed row is skipped instead and counted in a
`ReadStats`. Files are read as bytes and decoded line by line, so a non-UTF-8 file is reported
with its byte offset, and memory stays bounded (SQuAD JSON is the exception: JSON is one
document, and `json` reads it whole).

Conventions:
  - TSV has no quoting (the GLUE convention: MRPC text holds bare `"`); CSV uses RFC 4180
    quoting through `csv`. A UTF-8 byte-order mark is ignored. Blank lines are ignored.
  - Column names refer to the header row; integers index columns (0-based) in files
    without a header.
"""

import csv
import dataclasses
import json
import os
from collections.abc import Iterator

from bert_trainer.errors import UserError

FORMATS = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "json", ".txt": "conll",
           ".conll": "conll"}
DOCSTART = "-DOCSTART-"
_MAX_LISTED_LINES = 5
_ROLES = ("text", "text_b", "label")


@dataclasses.dataclass
class ReadStats:
    """What a reader kept and skipped in one file.

    Attributes:
      path: the file read.
      examples: records yielded.
      skipped: malformed records skipped (only with `skip_bad_rows=True`).
      skipped_lines: line numbers of the first few skipped records.
    """

    path: str
    examples: int = 0
    skipped: int = 0
    skipped_lines: list = dataclasses.field(default_factory=list)

    def skip(self, line: int) -> None:
        self.skipped += 1
        if len(self.skipped_lines) < _MAX_LISTED_LINES:
            self.skipped_lines.append(line)

    def summary(self) -> str:
        text = f"{self.path}: {self.examples} examples"
        if self.skipped:
            text += f", skipped {self.skipped} bad rows (lines {self.skipped_lines}"
            text += ", ...)" if self.skipped > len(self.skipped_lines) else ")"
        return text


@dataclasses.dataclass(frozen=True)
class TextColumns:
    """Which columns of a table (TSV/CSV header names or 0-based indices; JSONL keys) hold what.

    Attributes:
      text: the first text.
      text_b: the second text of a pair, or None.
      label: the label, or None for unlabeled data.
    """

    text: str | int = "text"
    text_b: str | int | None = None
    label: str | int | None = "label"


@dataclasses.dataclass(frozen=True)
class TextRecord:
    """One row of a text-classification file; `label` is the raw string (mapped later)."""

    line: int
    text: str
    text_b: str | None
    label: str | None


def file_format(path: str, file_format_name: str | None = None) -> str:
    """Format of a local file: the given name, else from its extension.

    Returns:
      One of "tsv", "csv", "jsonl", "json", "conll".
    """
    if file_format_name:
        if file_format_name not in set(FORMATS.values()):
            raise UserError(f"unknown file format '{file_format_name}' for {path}; choose one of "
                            f"{sorted(set(FORMATS.values()))}")
        return file_format_name
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise UserError(f"cannot tell the format of {path} from its extension; name it "
                        f"{'/'.join(FORMATS)} or give the format explicitly")
    return FORMATS[ext]


def check_file(path: str) -> None:
    """Raises UserError unless `path` is an existing, non-empty file."""
    if os.path.isdir(path):
        raise UserError(f"input file {path} is a directory; give a file")
    if not os.path.isfile(path):
        raise UserError(f"input file {path} does not exist; check --train_file/--eval_file")
    if os.path.getsize(path) == 0:
        raise UserError(f"input file {path} is empty; it must hold examples")


def utf8_lines(path: str, keep_ends: bool = False) -> Iterator[tuple[int, str]]:
    """Lines of a UTF-8 file with their 1-based numbers, read in bounded memory.

    Args:
      path: the file.
      keep_ends: keep the line terminator (the `csv` module needs it for quoted newlines).

    Yields:
      (line_number, text) with a leading byte-order mark removed.

    Raises:
      UserError: the file is missing, empty, or not UTF-8 (naming the byte offset).
    """
    check_file(path)
    offset = 0
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UserError(f"{path}:{number}: not UTF-8 (byte 0x{raw[e.start]:02x} at byte "
                                f"offset {offset + e.start}); re-save the file as UTF-8") from None
            if number == 1:
                text = text.removeprefix("\ufeff")
            offset += len(raw)
            yield number, text if keep_ends else text.rstrip("\r\n")


def _bad(path: str, where: int | str, reason: str, skip: bool, stats: ReadStats) -> None:
    """Counts a malformed record when skipping, else raises the one-line error.

    `where` is a line number, or a JSON location for SQuAD files (JSON values carry no line).
    """
    if not skip:
        place = f"{path}:{where}" if isinstance(where, int) else f"{path} {where}"
        raise UserError(f"{place}: {reason}; fix it or pass --skip_bad_rows")
    stats.skip(where)


def _finish(stats: ReadStats) -> None:
    if stats.examples == 0:
        detail = f" (all {stats.skipped} rows were bad)" if stats.skipped else ""
        raise UserError(f"{stats.path} holds no examples{detail}; check the file and its format")


def _table_rows(path: str, delimiter: str) -> Iterator[tuple[int, list[str]]]:
    """(line, fields) of a TSV (no quoting) or CSV (RFC 4180 quoting) file; blank lines dropped."""
    if delimiter == "\t":
        for number, text in utf8_lines(path):
            if text.strip():
                yield number, text.split("\t")
        return
    lines = utf8_lines(path, keep_ends=True)
    numbers = {}

    def texts():
        for number, text in lines:
            numbers["last"] = number
            yield text

    reader = csv.reader(texts(), delimiter=delimiter, strict=True)
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as e:  # Broken quoting cannot be skipped: the row's end is unknown.
            raise UserError(f"{path}:{numbers.get('last', 1)}: bad CSV quoting ({e}); "
                            "fix the quotes") from None
        if any(f.strip() for f in fields):
            yield numbers["last"], fields


def _column_indices(path: str, header: list[str] | None, columns: TextColumns) -> dict:
    """Maps text/text_b/label to column indices, resolving header names."""
    indices = {}
    for role in _ROLES:
        column = getattr(columns, role)
        if column is None or isinstance(column, int):
            indices[role] = column
        elif header is None:
            raise UserError(f"{path}: column '{column}' is named but the file is read without a "
                            "header; give column indices instead")
        elif column not in header:
            raise UserError(f"{path}:1: header has no column '{column}' (it has {header}); "
                            "fix the column mapping")
        else:
            indices[role] = header.index(column)
    return indices


def read_table(path: str, columns: TextColumns, *, delimiter: str, has_header: bool = True,
               skip_bad_rows: bool = False, stats: ReadStats | None = None
               ) -> Iterator[TextRecord]:
    """Rows of a TSV or CSV file as `TextRecord`s.

    Args:
      path: the file.
      columns: which columns hold text, text_b and label.
      delimiter: "\\t" (TSV, no quoting) or "," (CSV).
      has_header: the first non-blank row names the columns.
      skip_bad_rows: skip and count rows with too few fields instead of raising.
      stats: filled with counts; a fresh one is used when None.

    Yields:
      `TextRecord` per good row.
    """
    stats = stats if stats is not None else ReadStats(path)
    rows = _table_rows(path, delimiter)
    header = None
    if has_header:
        first = next(rows, None)
        header = [h.strip() for h in first[1]] if first else None
    indices = _column_indices(path, header, columns)
    needed = 1 + max(i for i in indices.values() if i is not None)
    for line, fields in rows:
        if len(fields) < needed:
            _bad(path, line, f"expected at least {needed} columns, found {len(fields)}",
                 skip_bad_rows, stats)
            continue
        text, text_b, label = (None if indices[r] is None else fields[indices[r]] for r in _ROLES)
        stats.examples += 1
        yield TextRecord(line, text, text_b, label)
    _finish(stats)


def read_jsonl(path: str, columns: TextColumns, *, skip_bad_rows: bool = False,
               stats: ReadStats | None = None) -> Iterator[TextRecord]:
    """Objects of a JSON-lines file as `TextRecord`s (labels turned into strings).

    Args:
      path: the file, one JSON object a line.
      columns: the keys of text, text_b and label.
      skip_bad_rows: skip and count lines that are not objects with those keys.
      stats: filled with counts; a fresh one is used when None.

    Yields:
      `TextRecord` per good line.
    """
    stats = stats if stats is not None else ReadStats(path)
    keys = {r: getattr(columns, r) for r in _ROLES}
    for line, text in utf8_lines(path):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            _bad(path, line, f"invalid JSON ({e.msg} at column {e.colno})", skip_bad_rows, stats)
            continue
        missing = [k for k in keys.values() if k is not None and
                   not (isinstance(row, dict) and k in row)]
        if missing:
            _bad(path, line, f"object lacks the keys {missing}", skip_bad_rows, stats)
            continue
        text, text_b, label = (None if keys[r] is None else row[keys[r]] for r in _ROLES)
        if not isinstance(text, str) or not isinstance(text_b, str | None):
            _bad(path, line, "text values must be strings", skip_bad_rows, stats)
            continue
        stats.examples += 1
        yield TextRecord(line, str(text), None if text_b is None else str(text_b),
                         None if label is None else str(label))
    _finish(stats)


def read_conll(path: str, *, tag_column: int = -1, skip_bad_rows: bool = False,
               stats: ReadStats | None = None) -> Iterator[tuple[int, list[str], list[str]]]:
    """Sentences of a CoNLL column file (word first, tag in `tag_column`, blank line between).

    `-DOCSTART-` lines are document markers, not words: they end a sentence and are dropped.

    Args:
      path: the file; columns separated by spaces or tabs.
      tag_column: column of the tag (default: the last one).
      skip_bad_rows: skip and count sentences holding a line with too few columns.
      stats: filled with counts; a fresh one is used when None.

    Yields:
      (first_line, words, tags); the word `i` is on line `first_line + i`.
    """
    stats = stats if stats is not None else ReadStats(path)
    needed = tag_column + 1 if tag_column >= 0 else -tag_column + 1
    words, tags, first, bad = [], [], 0, False
    for line, text in utf8_lines(path):
        fields = text.split()
        if fields and fields[0] != DOCSTART:
            if len(fields) < needed:
                _bad(path, line, f"expected a word and a tag (>= {needed} columns), found "
                     f"{len(fields)}", skip_bad_rows, stats)
                bad = True
            words.append(fields[0])
            tags.append(fields[tag_column] if len(fields) >= needed else "")
            first = first or line
            continue
        if words and not bad:
            stats.examples += 1
            yield first, words, tags
        words, tags, first, bad = [], [], 0, False
    if words and not bad:
        stats.examples += 1
        yield first, words, tags
    _finish(stats)


def _load_json(path: str):
    """The whole JSON document of `path`, with one-line errors for encoding and syntax."""
    check_file(path)
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise UserError(f"{path}:{line}: not UTF-8 (byte 0x{raw[e.start]:02x} at byte offset "
                        f"{e.start}); re-save the file as UTF-8") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: invalid JSON ({e.msg} at column {e.colno}); "
                        "fix the file") from None


def _squad_answers(qa: dict, context: str) -> tuple[list, list, str | None]:
    """(texts, starts, problem) of one SQuAD question; `problem` is None when all is well."""
    texts, starts = [], []
    for answer in qa.get("answers") or []:
        text, start = answer.get("text"), answer.get("answer_start")
        if not isinstance(text, str) or not isinstance(start, int):
            return texts, starts, "answer lacks 'text' or an integer 'answer_start'"
        if context[start:start + len(text)] != text:
            return texts, starts, f"answer {text!r} is not in the context at {start}"
        texts.append(text)
        starts.append(start)
    return texts, starts, None


def read_squad_json(path: str, *, skip_bad_rows: bool = False,
                    stats: ReadStats | None = None) -> list[dict]:
    """Questions of a SQuAD v1.1 / v2.0 JSON file, in file order.

    Args:
      path: a file with SQuAD's layout: {"data": [{"paragraphs": [{"context", "qas": [...]}]}]}.
      skip_bad_rows: skip and count malformed questions (missing fields, an answer whose text is
        not at its `answer_start` in the context) instead of raising.
      stats: filled with counts; a fresh one is used when None.

    Returns:
      dicts {"id", "question", "context", "answers": {"text": [...], "answer_start": [...]},
      "is_impossible"}, TFDS's `squad` layout; `is_impossible` is False for v1.1 files.
    """
    stats = stats if stats is not None else ReadStats(path)
    doc = _load_json(path)
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise UserError(f"{path}: no top-level 'data' list; is it a SQuAD-format JSON file?")
    examples = []
    for ai, article in enumerate(data):
        for pi, paragraph in enumerate(article.get("paragraphs") or []):
            context = paragraph.get("context")
            for qi, qa in enumerate(paragraph.get("qas") or []):
                where = f"data[{ai}].paragraphs[{pi}].qas[{qi}]"
                if not isinstance(context, str) or not isinstance(qa.get("question"), str):
                    _bad(path, where, "question without 'question' or 'context' text",
                         skip_bad_rows, stats)
                    continue
                texts, starts, problem = _squad_answers(qa, context)
                if problem:
                    _bad(path, where, f"question {qa.get('id')}: {problem}", skip_bad_rows, stats)
                    continue
                examples.append({
                    "id": str(qa.get("id", where)), "question": qa["question"],
                    "context": context, "answers": {"text": texts, "answer_start": starts},
                    "is_impossible": bool(qa.get("is_impossible", False))})
                stats.examples += 1
    _finish(stats)
    return examples
