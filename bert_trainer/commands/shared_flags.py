"""Flags that several `bert-train` commands take (`--input`, `--output`, `--model_dir`, ...).

absl keeps one flag registry per process, so a name defined by two command modules raises
DuplicateFlagError as soon as both are imported (tests, notebooks, a program calling
`run_command` twice). Each such flag is therefore defined here, once, with the neutral default
None. A command gives the flags it takes their meaning there with `declare`:

    SHARED_FLAGS = shared_flags.declare(
        __name__, output=shared_flags.Usage("-", "Output JSON lines file, or - for stdout."))

which makes them key flags of the command (listed by its `--help` with that help line and
default), and `run_command` gives every shared flag left off the command line the command's
default before `main` runs, so `main` reads `FLAGS.output` as if the command had defined it.

A command's own flags are declared in the same call, as `Flag`s, so that every flag of a
command is declared one way, in one place:

    SHARED_FLAGS = shared_flags.declare(
        __name__, output=shared_flags.Usage("-", "Output JSON lines file, or - for stdout."),
        top_k=Flag("integer", 0, "Sample among the k most likely pieces only (0: all).",
                   lower_bound=0))

A float `Flag` refuses NaN and infinities while the command line is parsed.
`check_input_files` names the flag of a directory given for a file.
"""

import dataclasses
import math
import os
from typing import Any

from absl import flags

from bert_trainer.data import text_corpus
from bert_trainer.errors import UserError

FLAGS = flags.FLAGS

# Help lines are generic on purpose: each command's `Usage` says what the flag means for it.
flags.DEFINE_string("input", None, "Input path(s) of the command.")
flags.DEFINE_string("output", None, "Output path of the command.")
flags.DEFINE_boolean("overwrite", None, "Replace existing output.")
flags.DEFINE_string("model_dir", None, "A bert-train model directory.")
flags.DEFINE_string("checkpoint", None, "Which checkpoint of --model_dir to use.")
flags.DEFINE_integer("seq_length", None, "Packed sequence length.", lower_bound=3)
flags.DEFINE_integer("batch_size", None, "Examples per batch.", lower_bound=1)
flags.DEFINE_boolean("lower_case", None, "Lower-case text and strip accents.")
flags.DEFINE_enum("encoding_errors", None, text_corpus.ENCODING_ERRORS,
                  "What to do with lines that are not UTF-8.")
flags.DEFINE_string("vocab_file", None, "A WordPiece vocab.txt.")
flags.DEFINE_string("init_checkpoint", None, "A pretrained model to start from.")
flags.DEFINE_string("task", None, "A task name.")
flags.DEFINE_string("eval_file", None, "A local evaluation file.")
flags.DEFINE_string("data_dir", None, "TFDS data directory holding the prepared dataset.")
flags.DEFINE_integer("max_eval_examples", None, "Evaluate on the first N examples only.")
flags.DEFINE_boolean("skip_bad_rows", None, "Skip and count malformed rows instead of failing.")
flags.DEFINE_string("family_module", None, "Modules registering task families of your own.")
flags.DEFINE_string("saved_model", None, "A directory written by 'bert-train export'.")
flags.DEFINE_boolean("trust_saved_model", None, "Load a SavedModel whose graph holds ops "
                     "bert-train's exports never use.")
flags.DEFINE_integer("seed", None, "Random seed.")

NAMES = ("input", "output", "overwrite", "model_dir", "checkpoint", "seq_length", "batch_size",
         "lower_case", "encoding_errors", "vocab_file", "init_checkpoint", "task", "eval_file",
         "data_dir", "max_eval_examples", "skip_bad_rows", "family_module", "saved_model",
         "trust_saved_model", "seed")


@dataclasses.dataclass(frozen=True)
class Usage:
    """What a shared flag means for one command.

    Attributes:
        default: the value the command runs with when the flag is not given.
        help: the flag's help line in the command's `--help`.
    """

    default: Any
    help: str


class Flag:
    """A flag only one command takes: its kind ("string", "integer", "float", "boolean",
    "enum", "list" or "multi_string"), default, help line and absl's options for that kind
    (`lower_bound=1`, `enum_values=[...]`)."""

    KINDS = ("string", "integer", "float", "boolean", "enum", "list", "multi_string")

    def __init__(self, kind: str, default: Any, help: str,  # noqa: A002 (absl's name)
                 **options: Any):
        if kind not in self.KINDS:
            raise ValueError(f"Flag kind {kind!r} is not one of {self.KINDS}")
        self.kind, self.default, self.help, self.options = kind, default, help, options

    def define(self, module_name: str, name: str) -> None:
        if self.kind == "float":  # finite: NaN and infinities refused while parsing
            _define_float(module_name, name, self.default, self.help)
            return
        define = getattr(flags, f"DEFINE_{self.kind}")
        define(name, self.default, help=self.help, module_name=module_name, **self.options)


def declare(module_name: str, **usages: Usage | Flag) -> dict[str, Usage]:
    """Declares a command module's flags: its own (`Flag`: defined here, for this module) and
    the shared ones it takes (`Usage`: made its key flags); `--help` lists both.

    Args:
        module_name: the command module's `__name__`.
        **usages: flag name -> a `Flag` of this command's own, or what a shared flag (one of
            `NAMES`) means for this command.

    Returns:
        The shared flags' `Usage`s, for the module to keep as `SHARED_FLAGS` (read by
        `run_command`).

    Raises:
        ValueError: a `Usage` of a name that is not a shared flag, or a `Flag` of one that is
            (programming errors, found at import).
    """
    shared = {name: usage for name, usage in usages.items() if isinstance(usage, Usage)}
    unknown = sorted(set(shared) - set(NAMES))
    if unknown:
        raise ValueError(f"{module_name}: {unknown} are not shared flags; declare them as a "
                         "Flag of this command, or add them to shared_flags")
    taken = sorted(name for name, usage in usages.items()
                   if isinstance(usage, Flag) and name in NAMES)
    if taken:
        raise ValueError(f"{module_name}: {taken} are shared flags; give them a Usage")
    for name, usage in usages.items():
        if isinstance(usage, Flag):
            usage.define(module_name, name)
        else:
            FLAGS.register_key_flag_for_module(module_name, FLAGS[name])
    return shared


def apply_defaults(usages: dict[str, Usage]) -> None:
    """Gives each shared flag in `usages` that was not on the command line its command default.

    Assigning through `FLAGS` runs the flag's validators, so a bad default fails loudly here.
    """
    for name, usage in usages.items():
        if not FLAGS[name].present:
            setattr(FLAGS, name, usage.default)


class FiniteFloatParser(flags.FloatParser):
    """absl's float parser, refusing NaN and infinities (which `float()` accepts).

    A refused value fails while the command line is parsed, as one line naming the flag:
    "flag --learning_rate=nan: must be a finite number".
    """

    def convert(self, argument) -> float:
        value = super().convert(argument)
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


def _define_float(module_name: str, name: str, default: float | None,
                 help: str):  # noqa: A002 (absl's name)
    """`flags.DEFINE_float` for a value that must be finite (every float `Flag`).

    Args:
        module_name: the defining command module's `__name__` (its `--help` lists the flag).
        name, default, help: as for `flags.DEFINE_float`.

    Returns:
        The flag holder, as `flags.DEFINE_float` returns it.
    """
    return flags.DEFINE(FiniteFloatParser(), name, default, help,
                        serializer=flags.ArgumentSerializer(), module_name=module_name)


def check_input_files(**paths: str | None) -> None:
    """Refuses a directory given where a file is expected, naming the flag.

    Args:
        **paths: flag name -> its value (None: not given). Missing files are left to the
            readers, which name the file and what reads it.

    Raises:
        UserError: a path is a directory.
    """
    for flag, path in paths.items():
        if path and os.path.isdir(os.path.expanduser(path)):
            raise UserError(f"--{flag}={path} is a directory; give a file")
