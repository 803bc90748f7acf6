"""Subcommand runner: absl flag parsing and one-line errors for every `bert-train` command.

A command module defines absl flags at import time and `main(argv) -> int | None`; flags that
several commands take are defined once in `shared_flags` and given their meaning for the command
by its `SHARED_FLAGS`. `UserError`s (and flag errors) print as one line
`bert-train NAME: error: ...` and exit non-zero; `--verbose` adds the traceback.
"""

import contextlib
import os
import re
import signal
import sys
import textwrap
import threading
import traceback

from absl import flags

from bert_trainer.commands import shared_flags
from bert_trainer.errors import (
    EXIT_PEER_LOST,
    EXIT_PREEMPTED,
    EXIT_USER_ERROR,
    Preempted,
    UserError,
    first_line,
    storage_fault,
)

flags.DEFINE_boolean("verbose", False, "Show full tracebacks and TensorFlow logs.")


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
    threading.excepthook = _quiet_peer_loss  # kept to the end: the threads may outlive main
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
        return 128 + signal.SIGTERM if isinstance(e, Terminated) else 130
    except Exception as e:  # noqa: BLE001 (a lost peer and a storage fault are translated)
        fault = None if _is_peer_lost(e) else _storage_fault(e)
        if fault is None and not _is_peer_lost(e):
            raise
        if flags.FLAGS.verbose:
            traceback.print_exc()
        if fault is not None:
            print(f"{prog}: error: {fault}", file=sys.stderr)
            return EXIT_USER_ERROR
        print(f"{prog}: error: lost contact with {_lost_peer(e)} ({type(e).__name__}: "
              f"{_first_line(e)}). The last checkpoint is intact: restart every worker with the "
              "same command to resume from it.", file=sys.stderr)
        return EXIT_PEER_LOST


class Terminated(KeyboardInterrupt):
    """SIGTERM (what `timeout`, docker, Kubernetes and systemd send), raised as Ctrl-C is."""


@contextlib.contextmanager
def _sigterm_interrupts():
    """Makes SIGTERM interrupt the command as SIGINT does, for the command's duration.

    Python's default for SIGTERM is to die at once, skipping every `finally`: an output
    written aside (`outputs`) would leave its `.NAME.tmp-PID` behind. Raised as an
    exception, it runs the same clean-up as Ctrl-C. Training installs its own handler for
    both signals while it trains (a checkpoint first: `training/preemption.py`).
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set in the main thread
        return

    def interrupt(signum, frame):
        raise Terminated(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _storage_fault(error: Exception) -> UserError | None:
    """A last resort for a full disk or a refused write that no write site caught itself.

    The path is the one the error names (TensorFlow's file errors start with it), else
    --model_dir.
    """
    text = getattr(error, "message", None) or str(error)
    named = getattr(error, "filename", None) or next(iter(re.findall(r"(/[^\s;:'\"]+)", text)),
                                                     None)
    path = named or getattr(flags.FLAGS, "model_dir", None) or "the output"
    return storage_fault(error, writing="files", path=path)


# Which peer a TensorFlow thread reported lost (see _quiet_peer_loss): "worker 0".
_peers_lost: list[str] = []
_REMOTE_TASK = re.compile(r"remote target /job:(\w+)/replica:\d+/task:(\d+)")


def _lost_peer(error: Exception) -> str:
    """The lost worker as "worker 1 (host:port)", from the error text or TF_CONFIG.

    gRPC errors name the remote task ("remote target /job:worker/replica:0/task:1"); a
    collective's abort names only the local one, so a peer named by a TensorFlow thread's
    error is used next, and then, in a cluster of two, the other task.
    """
    text = getattr(error, "message", None) or str(error)
    found = _REMOTE_TASK.search(text)
    from bert_trainer.training.strategies import tf_config  # noqa: PLC0415 (imports TF)

    cluster, me = tf_config()
    tasks = [(kind, i) for kind, addresses in cluster.items() for i in range(len(addresses))]
    if found:
        peer = (found.group(1), int(found.group(2)))
    elif _peers_lost:
        kind, _, index = _peers_lost[0].partition(" ")
        peer = (kind, int(index))
    else:
        others = [t for t in tasks if t != (me.get("type"), me.get("index"))]
        if len(others) != 1:
            return "another worker"
        peer = others[0]
    address = (cluster.get(peer[0]) or [])[peer[1]:peer[1] + 1]
    return f"{peer[0]} {peer[1]}" + (f" ({address[0]})" if address else "")


def _quiet_peer_loss(args) -> None:
    """A `threading.excepthook` that records a lost peer instead of printing a traceback.

    tf.distribute's preemption watcher threads poll the coordination service; when the
    worker holding it dies they die with UnavailableError and a traceback, printed before the
    main thread's one-line message. Other thread errors go to the default hook.
    """
    if _is_peer_lost(args.exc_value):
        found = _REMOTE_TASK.search(getattr(args.exc_value, "message", None)
                                    or str(args.exc_value))
        if found:
            _peers_lost.append(f"{found.group(1)} {found.group(2)}")
        return
    threading.__excepthook__(args)


def _is_peer_lost(error: Exception) -> bool:
    """Whether `error` is TensorFlow reporting that a collective's peer task went away.

    When one MultiWorkerMirrored worker dies, the survivors' all-reduce fails with
    UnavailableError (or AbortedError once the collective executor is aborted). TensorFlow is
    already imported whenever such an error can exist, so `sys.modules` is checked, not imported.
    """
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(error, (tf.errors.UnavailableError,
                                                  tf.errors.AbortedError))


# Lines of a TensorFlow error that say where, not what (a graph error embeds a Python stack).
def _first_line(error: Exception) -> str:
    """`errors.first_line`, at most 200 characters."""
    return first_line(error)[:200]
