"""Helpers shared by the translate tests that run commands: the spa_eng pairs of ../shared,
a slice of them, and `bert-train` in this process."""

import pathlib
import subprocess

import gin
from conftest import SHARED

SPA_ENG = SHARED / "data" / "spa_eng"


def run_cli(capsys, *args) -> subprocess.CompletedProcess:
    """`bert-train ARGS` through the CLI's own entry point (`cli.main`: flag parsing, exit code,
    printed lines), in this process from a clean gin state: seven subprocesses would import
    TensorFlow and trace the model seven times (test_translate_cli.py's serving check stays a
    fresh process, as that is what it tests)."""
    from bert_trainer import cli  # noqa: PLC0415

    gin.clear_config()
    capsys.readouterr()
    rc = cli.main(["bert-train", *map(str, args)])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, rc, out, err)


def take(path: pathlib.Path, out: pathlib.Path, count: int) -> list[str]:
    """The header and the first `count` pairs of a spa_eng file, written to `out`."""
    lines = path.read_text(encoding="utf-8").splitlines()[:count + 1]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return lines[1:]
