"""Gin, read as a run reads it: the config files and bindings parsed once, with every error
one line that names the file and line ("configs/smoke.gin:7: ..."), and the configurables
called with a binding that is missing or refused named the same way.

`parse_gin` checks every file and binding as data first (`gin_guard`): a config never runs or
imports code. TensorFlow and gin are imported inside the functions, so a command's `--help`
stays fast.
"""

import contextlib
import os
import re
import tokenize

from bert_trainer import config_files
from bert_trainer.errors import UserError, first_line

_GIN_LOCATION = re.compile(r'In file "(?P<file>[^"]+)", line (?P<line>\d+)')
_GIN_BINDING_LINE = re.compile(r"In bindings string line (?P<line>\d+)")
_added_search_paths: set[str] = set()


def resolve_gin_file(path: str) -> str:
    """Finds a --gin_file: as given, then among the shipped configs (`config_files.find`)."""
    found = config_files.find(path)
    if found is not None:
        return str(found)
    shipped = config_files.shipped()
    raise UserError(f"--gin_file={path} does not exist; give a .gin file, e.g. one of: "
                    f"{', '.join(shipped) or '(none shipped)'}")


def parse_gin(gin_files, gin_params=(), extra_bindings=()) -> None:
    """Parses gin files, then `--gin_param` bindings, then bindings made from other flags.

    Registers bert-train's configurables first. `include` statements resolve against the
    working directory, the shipped configs (`include 'configs/base.gin'`) and each file's own
    directory.

    Args:
        gin_files: paths (see `resolve_gin_file`).
        gin_params: binding strings from --gin_param.
        extra_bindings: binding strings derived from command flags (e.g. --train_data),
            applied last so they win and appear in the operative config.

    Raises:
        UserError: a missing file or a gin error, as "FILE:LINE: message".
    """
    paths = [resolve_gin_file(f) for f in gin_files]  # fails fast, before TensorFlow loads
    import gin  # noqa: PLC0415 (keeps --help free of TensorFlow)

    from bert_trainer import configurables, gin_guard  # noqa: PLC0415

    configurables.add_config_search_path()
    bindings = [(f"{source} {b!r}", b) for source, given in [("--gin_param", gin_params),
                                                              ("flag", extra_bindings)]
                for b in given]
    with _quiet_gin_path_search():
        for path in paths:  # configs are data: all checked before gin binds or imports any
            _add_search_path(gin, os.path.dirname(path))
            with gin_errors(path):
                gin_guard.check_file(path)
        for source, binding in bindings:
            with gin_errors(source):
                gin_guard.check_text(binding, source)
        for path in paths:
            with gin_errors(path):
                gin.parse_config_file(path)
        for source, binding in bindings:
            with gin_errors(source):
                gin.parse_config(binding)


@contextlib.contextmanager
def _quiet_gin_path_search():
    """Hides gin's "Path not found" log lines while it tries each search path for an include.

    gin logs an ERROR for every search-path prefix that does not hold an included file (e.g.
    the working directory, when run outside the repository) even when a later one does. A
    file found nowhere still fails, with gin's own exception naming the file.
    """
    import logging as std_logging  # noqa: PLC0415

    def keep(record):
        return not record.getMessage().startswith("Path not found:")

    root = std_logging.getLogger()
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)


def _add_search_path(gin, directory: str) -> None:
    if directory not in _added_search_paths:
        gin.add_config_file_search_path(directory)
        _added_search_paths.add(directory)


def gin_is_bound(name: str) -> bool:
    """Whether the parsed gin config binds `name` ("Configurable.parameter")."""
    import gin  # noqa: PLC0415

    try:
        gin.query_parameter(name)
    except ValueError:
        return False
    return True


def gin_binding(name: str, value) -> str:
    """A gin binding string for a Python literal, e.g. "PretrainingConfig.seq_length = 128"."""
    return f"{name} = {value!r}"


@contextlib.contextmanager
def gin_errors(source: str):
    """Re-raises gin parse errors as one-line UserErrors that start with "FILE:LINE:".

    Args:
        source: the file being parsed (or a description of a binding string), used when the
            error itself carries no location.
    """
    try:
        yield
    except UserError as e:
        raise UserError(first_line(e)) from None
    except SyntaxError as e:  # gin's own parser: carries the file and line
        raise UserError(f"{e.filename or source}:{e.lineno}: {first_line(e.msg)}") from None
    except tokenize.TokenError as e:  # e.g. an unclosed bracket, found at the end of the file
        raise UserError(f"{source}:{e.args[1][0]}: {e.args[0]} (an unclosed bracket?)") from None
    except (ValueError, TypeError, LookupError, ImportError, OSError) as e:
        text = str(e)
        found = _GIN_LOCATION.search(text)  # the innermost (first) location: the failing line
        if found:
            raise UserError(f"{found['file']}:{found['line']}: {first_line(text)}") from None
        found = _GIN_BINDING_LINE.search(text)
        where = f"{source} (line {found['line']})" if found else source
        raise UserError(f"{where}: {first_line(text)}") from None


def build_configured(configurable, what: str):
    """Calls a gin configurable with no arguments and reports bad or missing bindings.

    Args:
        configurable: e.g. `configurables.TrainerConfig`.
        what: its name as written in .gin files, e.g. "TrainerConfig".

    Returns:
        The built object.

    Raises:
        UserError: a required parameter is not bound, or the object rejected a value.
    """
    try:
        return configurable()
    except UserError as e:
        raise UserError(f"{what}: {first_line(e)}") from None
    except TypeError as e:
        missing = re.search(r"arguments: \[([^\]]*)\]", str(e))
        if missing:
            name = missing.group(1).split(",")[0].strip(" '\"")
            raise UserError(f"{what}.{name} is not set; bind it in a .gin file or with "
                            f"--gin_param='{what}.{name} = ...'") from None
        raise UserError(f"{what}: {first_line(e)}") from None
