"""What a killed run leaves in a model_dir, removed when the next run takes the directory.

SIGKILL, an OOM kill or a power loss mid-save can leave TensorFlow's `ckpt-N_temp/` (a
checkpoint being written: TensorFlow renames its shards out of it when the save completes)
and write-aside files `.NAME.tmp-PID` (`outputs.temporary_sibling`). Nothing ever reads them;
they only take space. `remove_stale` runs once the run lock is held (`run_lock.acquire`), so
no other run can be writing them; a `.NAME.tmp-PID` whose process still lives (an `evaluate`
writing its results) is kept. `.NAME.old-PID` is a previous output set aside and is kept.
"""

import os
import re
import shutil

from absl import logging

_CHECKPOINT_TEMP = re.compile(r"^ckpt-\d+_temp$")
_WRITE_ASIDE = re.compile(r"^\..+\.tmp-(\d+)$")
_SUBDIRECTORIES = ("best",)  # where the run also saves checkpoints


def remove_stale(model_dir: str) -> list[str]:
    """Removes the leftovers of dead processes from `model_dir` (and its `best/`); logs them.

    Returns:
        The paths removed.
    """
    removed = []
    for directory in (model_dir, *(os.path.join(model_dir, d) for d in _SUBDIRECTORIES)):
        try:
            names = sorted(os.listdir(directory))
        except OSError:  # absent (a new run) or unreadable: nothing to clean
            continue
        for name in names:
            path = os.path.join(directory, name)
            found = _WRITE_ASIDE.match(name)
            if _CHECKPOINT_TEMP.match(name) or (found and not _alive(int(found.group(1)))):
                _remove(path)
                removed.append(path)
    if removed:
        logging.warning("Removed what an interrupted run left in %s: %s", model_dir,
                        ", ".join(os.path.relpath(p, model_dir) for p in removed))
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.remove(path)
        except OSError:
            pass
