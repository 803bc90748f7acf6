"""Where the shipped .gin configs live, and how a `--gin_file` name finds one.

The configs ship inside the package (`bert_trainer/configs/`, installed as package data), so an
installed bert-train finds them from any working directory; the repository's top-level
`configs/` is a link to the same folder. Shipped files include each other by their
`configs/...` name (`include 'configs/encoders/base.gin'`), which resolves against
`INCLUDE_ROOT`, the package directory. No gin here: `--help` stays free of it.
"""

import pathlib

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
CONFIGS_DIR = PACKAGE_DIR / "configs"
# The gin search path on which 'configs/encoders/base.gin' names a shipped file.
INCLUDE_ROOT = PACKAGE_DIR


def find(path: str) -> pathlib.Path | None:
    """Finds a .gin file: as given (cwd), then as a `configs/...` name, then inside configs/.

    Args:
        path: e.g. "my.gin", "configs/base.gin", "base.gin" or "encoders/tiny.gin".

    Returns:
        The resolved path of the first existing file, or None if there is none.
    """
    for candidate in (pathlib.Path(path), INCLUDE_ROOT / path, CONFIGS_DIR / path):
        if candidate.is_file():
            return candidate.resolve()
    return None


def shipped(pattern: str = "*.gin") -> list[str]:
    """The shipped configs matching `pattern`, as `configs/...` names, sorted.

    Args:
        pattern: a glob relative to configs/, e.g. "*.gin" (the pretraining recipes) or
            "encoders/*.gin" (the encoder sizes).

    Returns:
        Names such as "configs/base.gin", valid as `--gin_file` and in `include` lines.
    """
    return sorted(str(p.relative_to(INCLUDE_ROOT)) for p in CONFIGS_DIR.glob(pattern))
