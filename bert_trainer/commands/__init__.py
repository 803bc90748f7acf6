"""Subcommand runner: absl flag parsing and one-line errors for every `bert-train` command.

A command module defines absl flags at import time and `main(argv) -> int | None`; flags that
several commands take are defined once in `shared_flags` and given their meaning for the command
by its `SHARED_FLAGS`. `UserError`s (and flag errors) print as one line
`bert-train NAME: error: ...` and exit non-zero; `--verbose` adds the traceback. Errors that
are not `UserError`s but still the user's to act on (a lost peer worker, a full disk) are
told apart by `faults`.
"""

import contextlib
import os
import signal
import sys
import textwrap
import threading
import traceback

from absl import flags

from bert_trainer.commands import faults, shared_flags
from bert_trainer.errors import EXIT_PREEMPTED, EXIT_USER_ERROR, Preempted, UserError

shared_flags.declare(__name__, verbose=shared_flags.Flag(
    "boolean", False, "Show full tracebacks and TensorFlow logs."))


def require_flags(*names: str) -> None:
    """Raises a one-line UserError naming the flags in `names` that have no value.

    Commands call this in `main` rather than `flags.mark_flags_as_required`, whose validators
    are process-global: once one command module is imported they would reject every other
    command parsed in the same process (tests, notebooks).
    """
    missing = [f"--{n}" for n in names if flags.FLAGS[n].value in (None, "")]
    if missing:
        raise UserError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                        "required (see --help)")


def _help(module, prog: str) -> str:
    doc = (module.__doc__ or "").strip()
    usages = getattr(module, "SHARED_FLAGS", {})
    key_flags = sorted(flags.FLAGS.get_key_flags_for_module(module), key=lambda f: f.name)
    own = "\n".join(_describe(flag, usages.get(flag.name)) for flag in key_flags)
    return (f"usage: {prog} [--flags]\n\n{doc}\n\nflags:\n{own or '  (no flags of its own)'}\n"
            "  --[no]verbose: show tracebacks")


def _describe(flag, usage: shared_flags.Usage | None) -> str:
    """One flag's `--help` entry, laid out as absl's, with the command's help for a shared flag.

    Args:
        flag: the absl Flag.
        usage: what the flag means for this command when it is a shared flag, else None.

    Returns:
        The entry: "  --name: help", then "(default: ...)" and the value syntax when known.
    """
    if usage is None:
        text, default = flag.help, flag.default_as_str
    else:
        choices = getattr(flag.parser, "enum_values", None)  # absl puts them before the help
        text = f"<{'|'.join(choices)}>: {usage.help}" if choices else usage.help
        default = _default_as_str(usage.default)
    name = f"--[no]{flag.name}" if flag.boolean else f"--{flag.name}"
    lines = [f"{name}: {text}"]
    if default:
        lines.append(f"(default: {default})")
    if flag.parser.syntactic_help:
        lines.append(f"({flag.parser.syntactic_help})")
    # absl's wrapper splits "bert-train" and paths at hyphens; this one never does. Whitespace
    # is collapsed first: absl embeds "\n    " in the help of repeatable flags.
    return "\n".join(
        textwrap.fill(" ".join(line.split()), width=80, initial_indent="    " if i else "  ",
                      subsequent_indent="    ", break_on_hyphens=False, break_long_words=False)
        for i, line in enumerate(lines))


def _default_as_str(value) -> str | None:
    """A default written as absl writes it: 'true'/'false' for booleans, quoted otherwise."""
    if value is None:
        return None
    if isinstance(value, bool):
        return repr("true" if value else "false")
    return repr(str(value))


def _flags_of_other_commands(module) -> list[str]:
    """Names given on the command line that are flags of other bert-train commands only.

    absl keeps every imported command's flags (and all shared flags) in one registry, so it
    parses them for any command; they would be silently ignored. Flags defined outside
    bert_trainer (absl's --verbosity, ...) and the runner's own (--verbose) are always allowed.
    """
    given = {flags.FLAGS[name].name for name in flags.FLAGS if flags.FLAGS[name].present}
    ours = [name for name in given
            if flags.FLAGS.find_module_defining_flag(name, "").startswith("bert_trainer.")
            and flags.FLAGS.find_module_defining_flag(name) != __name__]
    if not ours:
        return []
    own = {flag.name for flag in flags.FLAGS.get_key_flags_for_module(module)}
    return sorted(set(ours) - own)


def run_command(module, argv) -> int:
    prog = argv[0]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if any(a in ("--help", "-h", "--helpshort", "--helpfull") for a in argv[1:]):
        print(_help(module, prog))
        return 0
    # Start from the defaults: a second in-process call (tests) must not see the first's values.
    flags.FLAGS.unparse_flags()
    try:
        rest = flags.FLAGS(argv, known_only=False)
    except flags.Error as e:
        print(f"{prog}: error: {e} (see '{prog} --help')", file=sys.stderr)
        return EXIT_USER_ERROR
    foreign = _flags_of_other_commands(module)
    if foreign:
        print(f"{prog}: error: Unknown command line flag '{foreign[0]}' (see '{prog} --help')",
              file=sys.stderr)
        return EXIT_USER_ERROR
    if len(rest) > 1:
        print(f"{prog}: error: unexpected arguments {rest[1:]}; flags take the form --name=value",
              file=sys.stderr)
        return EXIT_USER_ERROR
    # Shared flags left off the command line take this command's defaults (see shared_flags).
    shared_flags.apply_defaults(getattr(module, "SHARED_FLAGS", {}))
    threading.excepthook = faults.quiet_peer_loss  # kept: the threads may outlive main
    try:
        with _sigterm_interrupts():
            rc = module.main(rest)
        return int(rc or 0)
    except UserError as e:
        if flags.FLAGS.verbose:
            traceback.print_exc()
        print(f"{prog}: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Preempted as e:  # a clean stop: checkpoint written, rerun to resume
        print(f"{prog}: {e}", file=sys.stderr)
        return EXIT_PREEMPTED
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (_sigterm_interrupts): same clean-up
        print(f"{prog}: interrupted", file=sys.stderr)
        return 128 + e.signum if isinstance(e, Terminated) else 130
    except Exception as e:  # noqa: BLE001 (a lost peer and a storage fault are translated)
        described = faults.describe(e)
        if described is None:
            raise
        if flags.FLAGS.verbose:
            traceback.print_exc()
        message, code = described
        print(f"{prog}: error: {message}", file=sys.stderr)
        return code


class Terminated(KeyboardInterrupt):
    """SIGTERM (what `timeout`, docker, Kubernetes and systemd send) or SIGHUP (a closed
    terminal), raised as Ctrl-C is."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


@contextlib.contextmanager
def _sigterm_interrupts():
    """Makes SIGTERM and SIGHUP interrupt the command as SIGINT does, for its duration.

    Python's default for SIGTERM is to die at once, skipping every `finally`: an output
    written aside (`outputs`) would leave its `.NAME.tmp-PID` behind. Raised as an
    exception, it runs the same clean-up as Ctrl-C. SIGHUP is left alone when it is ignored
    (`nohup`). Training installs its own handler for these signals while it trains (a
    checkpoint first: `training/preemption.py`).
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set in the main thread
        return

    def interrupt(signum, frame):
        raise Terminated(signum)

    caught = [s for s in (signal.SIGTERM, signal.SIGHUP)
              if s == signal.SIGTERM or signal.getsignal(s) != signal.SIG_IGN]
    previous = {s: signal.signal(s, interrupt) for s in caught}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
