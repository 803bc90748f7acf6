"""A real English pretraining corpus from text every Python installation carries.

Sources, in a fixed order: the Python language reference help topics that `pydoc` shows
(`pydoc_data.topics`, one document per topic), then the docstrings and block comments of the
pure-Python standard library (one document per source file, paragraphs in source order).
Sources are parsed with `ast` and `tokenize`, never imported, so nothing runs. About 1.2 MB,
14k sentences, 190k words on Python 3.11.

Cleaning keeps prose and drops code: reST roles and literals are unwrapped (":func:`len`" ->
"len"), indented blocks, doctest lines, directives, field lists, tables and signature lines
go, and a paragraph survives only if it reads like sentences (mostly letters, ends with
punctuation). Identical paragraphs are kept once. The output is google-research/bert's
format: one sentence per line, a blank line between documents. The same Python version gives
byte-identical output.
"""

import ast
import importlib.util
import io
import os
import re
import sys
import tokenize
from collections.abc import Iterator

from bert_trainer.data.text_corpus import split_sentences

# Packages whose docstrings are tests, demos or GUI plumbing rather than prose.
_SKIP_PACKAGES = frozenset({"test", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip",
                            "pydoc_data", "antigravity", "this"})
_SKIP_DIRS = frozenset({"test", "tests", "idle_test", "__pycache__"})
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`~?!?([^`<]*?)(?:\s*<[^>]*>)?`")  # :func:`x` -> x
_LINK = re.compile(r"`([^`<]+?)\s*<[^>]+>`_{1,2}")  # `text <url>`_ -> text
_LITERAL = re.compile(r"``([^`]+)``|`([^`]+)`_{0,2}")
_EMPHASIS = re.compile(r"\*\*([^*]+)\*\*|\*([^*\s][^*]*)\*")
_CODEISH_LINE = re.compile(
    r"^\s*(>>>|\.\.\.|\.\. |:[\w ]+:|[-=~^*+#]{3,}|\+-|\|)|::\s*$|->|^\s*[\w.]+\(.*\)\s*$")
_SENTENCE_END = re.compile(r"""[.!?]["')\]]*$""")
MIN_WORDS_PER_SENTENCE = 3


def clean_inline_markup(text: str) -> str:
    """Unwraps reST roles, links, literals and emphasis, keeping their text."""
    text = _ROLE.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    text = _LITERAL.sub(lambda m: m.group(1) or m.group(2), text)
    return _EMPHASIS.sub(lambda m: m.group(1) or m.group(2), text)


def _is_prose(paragraph: str) -> bool:
    words = paragraph.split()
    if len(words) < 5 or not _SENTENCE_END.search(paragraph):
        return False
    letters = sum(c.isalpha() or c.isspace() for c in paragraph)
    return letters / len(paragraph) >= 0.85 and paragraph[0].isupper()


def prose_paragraphs(doc: str) -> list[str]:
    """The prose paragraphs of a docstring or help topic, markup removed.

    Args:
      doc: raw text; indentation marks code blocks (as in reST and pydoc topics).

    Returns:
      Paragraphs as single-line strings.
    """
    out, block = [], []
    for line in doc.expandtabs().splitlines() + [""]:
        indented = line[:1].isspace()
        if line.strip() and not indented and not _CODEISH_LINE.search(line):
            block.append(line.strip())
            continue
        # A blank, indented (code / quoted) or code-like line ends the paragraph.
        if block:
            text = clean_inline_markup(" ".join(block))
            if _is_prose(text):
                out.append(text)
        block = []
    return out


def _comment_paragraphs(source: str) -> list[tuple[int, str]]:
    """(line, text) of each run of consecutive whole-line `#` comments (an empty `#` splits)."""
    out, block, last = [], [], -2
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return []
    for tok in tokens:
        if tok.type != tokenize.COMMENT or not tok.line.lstrip().startswith("#"):
            continue
        text = tok.string.lstrip("#").strip()
        if (tok.start[0] != last + 1 or not text) and block:
            out.append((block[0][0], " ".join(t for _, t in block)))
            block = []
        if text:
            block.append((tok.start[0], text))
        last = tok.start[0]
    if block:
        out.append((block[0][0], " ".join(t for _, t in block)))
    return out


def _file_paragraphs(path: str) -> list[str]:
    """Prose paragraphs of a Python file's docstrings and comments, in source order."""
    try:
        with tokenize.open(path) as f:
            source = f.read()
        tree = ast.parse(source, filename=path)
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
        return []  # A file this Python cannot parse contributes nothing.
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(
        n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)]
    located = [(getattr(n, "lineno", 0), p) for n in nodes
               for p in prose_paragraphs(ast.get_docstring(n) or "")]
    located += [(line, clean_inline_markup(text)) for line, text in _comment_paragraphs(source)
                if _is_prose(clean_inline_markup(text))]
    return [p for _, p in sorted(located, key=lambda item: item[0])]


def _module_files(name: str) -> list[str]:
    """Source files of a standard-library module or package, sorted; [] if none."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None or not (spec.origin or "").endswith(".py"):
        return []  # Built-in or C extension: no source to read.
    if not spec.submodule_search_locations:
        return [spec.origin]
    files = []
    for root in spec.submodule_search_locations:
        for directory, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
            files += [os.path.join(directory, n) for n in sorted(names) if n.endswith(".py")]
    return files


def _sentences(paragraphs: list[str], seen: set) -> list[str]:
    sentences = []
    for paragraph in paragraphs:
        if paragraph in seen:
            continue
        seen.add(paragraph)
        sentences += [s for s in split_sentences(paragraph)
                      if len(s.split()) >= MIN_WORDS_PER_SENTENCE]
    return sentences


def iter_documents() -> Iterator[list[str]]:
    """Yields documents (lists of sentences): pydoc help topics, then stdlib modules."""
    seen = set()
    try:
        from pydoc_data.topics import topics  # noqa: PLC0415 (optional on some distributions)
    except ImportError:
        topics = {}
    for key in sorted(topics):
        sentences = _sentences(prose_paragraphs(topics[key]), seen)
        if len(sentences) >= 2:
            yield sentences
    names = sorted(n for n in sys.stdlib_module_names
                   if not n.startswith("_") and n not in _SKIP_PACKAGES)
    for name in names:
        for path in _module_files(name):
            sentences = _sentences(_file_paragraphs(path), seen)
            if len(sentences) >= 2:
                yield sentences


def build_demo_corpus(output: str, max_bytes: int | None = None) -> dict:
    """Writes the demo corpus in google-research/bert's format.

    Args:
      output: path of the text file to write (its directory is created).
      max_bytes: stop after the document that crosses this size; None writes everything.

    Returns:
      dict with documents, sentences, words, bytes, output, python (version it came from).
    """
    if os.path.dirname(output):
        os.makedirs(os.path.dirname(output), exist_ok=True)
    stats = {"documents": 0, "sentences": 0, "words": 0, "bytes": 0}
    with open(output, "w", encoding="utf-8", newline="\n") as f:
        for document in iter_documents():
            text = "\n".join(document) + "\n\n"
            f.write(text)
            stats["documents"] += 1
            stats["sentences"] += len(document)
            stats["words"] += sum(len(s.split()) for s in document)
            stats["bytes"] += len(text.encode("utf-8"))
            if max_bytes is not None and stats["bytes"] >= max_bytes:
                break
    stats.update(output=output, python=sys.version.split()[0])
    return stats
