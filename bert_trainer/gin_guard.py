"""Configs are data: a .gin file or a `--gin_param` may bind and reference only registered
configurables (bert-train's, `configurables.py`, and those of a family module the user named)
and constants. Nothing in a config chooses code to import or call.

gin itself accepts `import some.module` (run at parse time) and, after
`from __gin__ import dynamic_registration`, references to any importable callable
(`@os.system()`): a shared recipe could run code. `check` parses the text with gin's own parser
first, follows its `include`s, and refuses those statements with one line before gin binds
(or imports) anything.
"""

import os

from gin import config as gin_config
from gin import config_parser

from bert_trainer.errors import UserError

_MAX_INCLUDE_DEPTH = 32  # deeper than any sane recipe; stops an include cycle


class _RecordingDelegate(config_parser.ParserDelegate):
    """Records the `@references` of the statement being parsed instead of resolving them."""

    def __init__(self):
        self.references: list[str] = []

    def configurable_reference(self, scoped_configurable_name, evaluate):
        self.references.append(scoped_configurable_name)
        return None

    def macro(self, macro_name):
        return None


def check_file(path: str, depth: int = 0, reader=None) -> None:
    """Refuses a .gin file (and what it includes) that imports code or references an
    unregistered callable.

    Args:
        path: the file.
        depth: the include depth (internal).
        reader: how gin opens it (one of its file readers); None: `open`.

    Raises:
        UserError: "FILE:LINE: ..." naming the statement and the fix.
        SyntaxError: gin's own parse error (callers translate it, see `runs.gin_config.gin_errors`).
    """
    if depth > _MAX_INCLUDE_DEPTH:
        raise UserError(f"{path}: includes nest deeper than {_MAX_INCLUDE_DEPTH} levels "
                        "(an include cycle?); remove the cycle")
    with (reader or open)(path) as f:
        _check_statements(f, str(path), depth)


def check_text(text: str, source: str) -> None:
    """As `check_file`, for binding text such as a `--gin_param` (named `source` in messages)."""
    _check_statements(text, source, 0)


def _check_statements(text_or_file, source: str, depth: int) -> None:
    delegate = _RecordingDelegate()
    for statement in config_parser.ConfigParser(text_or_file, delegate):
        where = f"{statement.location.filename or source}:{statement.location.line_num}"
        if isinstance(statement, config_parser.ImportStatement):
            raise UserError(f"{where}: '{statement.format()}' is refused: a config may not "
                            "import code (configs are data); remove the line, and name a "
                            "plugin task family with --family_module instead")
        for name in delegate.references:
            _require_registered(name, where)
        delegate.references.clear()
        if isinstance(statement, config_parser.IncludeStatement):
            found = _find_include(statement.filename)
            if found is not None:  # else gin reports the missing file itself
                check_file(found[1], depth + 1, reader=found[0])


def _require_registered(scoped_name: str, where: str) -> None:
    """Refuses `@name` unless it names a registered configurable (or gin's macro/constant)."""
    name = scoped_name.rsplit("/", 1)[-1]
    if not gin_config._REGISTRY.matching_selectors(name):  # noqa: SLF001 (gin has no public query)
        known = sorted({s.rsplit(".", 1)[-1] for s, _ in gin_config._REGISTRY.items()  # noqa: SLF001
                        if not s.startswith("gin.")})
        raise UserError(f"{where}: '@{name}' is not a registered configurable; a config may "
                        f"reference only bert-train's ({', '.join(known)}) and constants")


def _find_include(name: str):
    """(reader, path): how and where gin reads `include 'name'` (its own search paths and
    readers, the package-resource reader included, in gin's order), or None."""
    prefixes = [""] if os.path.isabs(name) else gin_config._LOCATION_PREFIXES  # noqa: SLF001
    for prefix in prefixes:
        path = os.path.join(prefix, name)
        for reader, exists in gin_config._FILE_READERS:  # noqa: SLF001
            if exists(path):
                return reader, path
    return None
