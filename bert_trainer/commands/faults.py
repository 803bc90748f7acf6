"""Errors a command did not raise as `UserError` but the user still acts on, in one line.

    a lost peer worker   tf.distribute's all-reduce fails when another worker died: the message
                         names the worker (from the error text, a TensorFlow thread's error, or
                         TF_CONFIG) and says that restarting every worker resumes
    a storage fault      a full disk or a refused write that no write site caught itself

`describe(error)` gives the runner (`commands.run_command`) the message and exit code, or None
for an error that is a bug (its traceback is shown). `quiet_peer_loss` is the runner's
`threading.excepthook`.
"""

import re
import sys
import threading

from absl import flags

from bert_trainer.errors import (
    EXIT_PEER_LOST,
    EXIT_USER_ERROR,
    UserError,
    first_line,
    storage_fault,
)


def describe(error: Exception) -> tuple[str, int] | None:
    """(one-line message, exit code) for a lost peer or a storage fault; None otherwise."""
    if _is_peer_lost(error):
        return (f"lost contact with {_lost_peer(error)} ({type(error).__name__}: "
                f"{first_line(error)[:200]}). The last checkpoint is intact: restart every worker "
                "with the same command to resume from it.", EXIT_PEER_LOST)
    fault = _storage_fault(error)
    return None if fault is None else (str(fault), EXIT_USER_ERROR)


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


# Which peer a TensorFlow thread reported lost (see quiet_peer_loss): "worker 0".
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


def quiet_peer_loss(args) -> None:
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
