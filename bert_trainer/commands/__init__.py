"""Subcommand runner: absl flag parsing and one-line errors for every `bert-train` command.

A command module defines absl flags at import time and `main(argv) -> int | None`.
`UserError`s (and flag errors) print as one line `bert-train NAME: error: ...` and exit
non-zero; `--verbose` adds the traceback.
"""

import os
import sys
import traceback

from absl import flags

from bert_trainer.errors import (
    EXIT_PEER_LOST,
    EXIT_PREEMPTED,
    EXIT_USER_ERROR,
    Preempted,
    UserError,
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
    own = flags.FLAGS.module_help(module.__name__) or "  (no flags of its own)"
    return f"usage: {prog} [--flags]\n\n{doc}\n\nflags:\n{own}\n  --[no]verbose: show tracebacks"


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
    if len(rest) > 1:
        print(f"{prog}: error: unexpected arguments {rest[1:]}; flags take the form --name=value",
              file=sys.stderr)
        return EXIT_USER_ERROR
    try:
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
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 (only a lost peer is translated; the rest re-raise)
        if not _is_peer_lost(e):
            raise
        if flags.FLAGS.verbose:
            traceback.print_exc()
        print(f"{prog}: error: lost contact with another worker ({type(e).__name__}: "
              f"{_first_line(e)}). The last checkpoint is intact: restart every worker with the "
              "same command to resume from it.", file=sys.stderr)
        return EXIT_PEER_LOST


def _is_peer_lost(error: Exception) -> bool:
    """Whether `error` is TensorFlow reporting that a collective's peer task went away.

    When one MultiWorkerMirrored worker dies, the survivors' all-reduce fails with
    UnavailableError (or AbortedError once the collective executor is aborted). TensorFlow is
    already imported whenever such an error can exist, so `sys.modules` is checked, not imported.
    """
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(error, (tf.errors.UnavailableError,
                                                  tf.errors.AbortedError))


def _first_line(error: Exception) -> str:
    text = getattr(error, "message", None) or str(error)
    return (text.strip().splitlines() or [""])[0][:200]
