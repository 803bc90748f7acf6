"""`bert-train predict`'s inputs: lines of text, TSV or JSONL parsed into the model's inputs.

text: one input per line (models with one text input only); tsv: tab-separated columns in the
model's input order, or in any order under a header row naming them (or a dataset's names for
them, `HEADER_ALIASES`); jsonl: one JSON object per line keyed by the input names. A line that
cannot be read comes back as its reason (`read_inputs`), for the caller to skip or stop on.
"""

import json
import os
from collections.abc import Iterable, Iterator

from bert_trainer.errors import UserError

FORMATS = ("text", "tsv", "jsonl")


def detect_format(path: str, fmt: str | None) -> str:
    """`fmt`, or the format implied by the file extension (text for '-' and others)."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise UserError(f"--format={fmt} is unknown; use one of {', '.join(FORMATS)}")
        return fmt
    ext = os.path.splitext(path)[1].lower()
    return {".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}.get(ext, "text")


class BadLine(ValueError):
    """A line that cannot be read; the message says why."""


# Header names that datasets give the inputs (GLUE/SST-2/QQP/MNLI/QNLI/MRPC TSVs), tried in
# order after the inputs' own names, so a task's train/dev file can be predicted as it is.
HEADER_ALIASES = {
    ("text",): (("text_a",), ("sentence",), ("review",), ("#1 String",)),
    ("text", "text_b"): (("text_a", "text_b"), ("sentence1", "sentence2"),
                         ("question1", "question2"), ("premise", "hypothesis"),
                         ("question", "sentence"), ("#1 String", "#2 String")),
    ("question", "context"): (("question", "passage"),),
    ("input",): (("source",), ("english",)),  # a translation pair file (spa_eng's header)
}


def _tsv_header(fields: list[str], names) -> dict[str, int] | None:
    """{input name: column} when `fields` is a header naming every input, else None.

    The header may use the inputs' own names or a dataset's names for them (HEADER_ALIASES),
    e.g. SST-2's `sentence<TAB>label` for a one-text classifier; other columns are ignored.
    """
    fields = [f.strip() for f in fields]
    for columns in (tuple(names), *HEADER_ALIASES.get(tuple(names), ())):
        if set(columns) <= set(fields):
            return {name: fields.index(col) for name, col in zip(names, columns, strict=True)}
    return None


def parse_line(text: str, fmt: str, names, header: dict | None) -> dict[str, str]:
    """The inputs of one decoded line; BadLine says what is wrong."""
    if fmt == "text":
        return {names[0]: text}
    if fmt == "tsv":
        fields = text.split("\t")
        if header is not None:
            if len(fields) <= max(header.values()):
                raise BadLine(f"has {len(fields)} columns, the header has "
                              f"{max(header.values()) + 1}")
            return {name: fields[col] for name, col in header.items()}
        if len(fields) != len(names):
            raise BadLine(f"has {len(fields)} tab-separated columns, expected {len(names)} "
                          f"({', '.join(names)})")
        return dict(zip(names, fields, strict=True))
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadLine(f"is not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise BadLine(f"is a JSON {type(obj).__name__}, expected an object with "
                      f"{', '.join(names)}")
    missing = [n for n in names if not isinstance(obj.get(n), str)]
    if missing:
        raise BadLine(f"lacks the string field(s) {', '.join(missing)}")
    return {n: obj[n] for n in names}


def read_inputs(lines: Iterable[bytes], fmt: str, names) -> Iterator[tuple[int, dict | str]]:
    """Parses raw lines.

    Args:
      lines: raw lines (bytes, with or without line endings), line 1 first.
      fmt: "text", "tsv" or "jsonl".
      names: the predictor's input names in column order.

    Yields:
      (line number, inputs dict) for each input, or (line number, reason str) for a bad line.
    """
    if fmt == "text" and len(names) != 1:
        raise UserError(f"--format=text gives one text a line, but the model reads "
                        f"{', '.join(names)}; use --format=tsv or --format=jsonl")
    header, first = None, True
    for number, raw in enumerate(lines, start=1):
        try:
            text = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as e:
            yield number, f"is not UTF-8 (byte {e.start}: {raw[e.start:e.start + 1]!r})"
            continue
        if not text.strip():
            continue
        if fmt == "tsv" and first:
            first = False
            header = _tsv_header(text.split("\t"), names)
            if header is not None:
                continue
        try:
            yield number, parse_line(text, fmt, names, header)
        except BadLine as e:
            yield number, str(e)
