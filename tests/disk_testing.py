"""A small file system to fill up: disk-full (ENOSPC) tests run on a tmpfs of a few MB.

Mounting needs root (or CAP_SYS_ADMIN); where the machine does not allow it, the fixture skips
with the reason. Tests write what the command writes, then fill the rest of the disk (or
give it a size that cannot hold the output), and check the one-line error and the files left.
"""

import contextlib
import os
import subprocess
import tempfile

import pytest


@contextlib.contextmanager
def small_disk(size_kb: int):
    """Mounts a tmpfs of `size_kb` KiB at a fresh directory; unmounts it afterwards.

    Skips the calling test (pytest.skip) when tmpfs cannot be mounted here.
    """
    mount_point = tempfile.mkdtemp(prefix="bert_train_small_disk_")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs",
                           mount_point], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        os.rmdir(mount_point)
        pytest.skip(f"cannot mount a tmpfs for the disk-full case here "
                    f"({(done.stderr or done.stdout).strip() or 'mount failed'}); "
                    "it needs root or CAP_SYS_ADMIN")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", mount_point], capture_output=True, check=False)
        with contextlib.suppress(OSError):
            os.rmdir(mount_point)


def fill_disk(directory: str, leave_bytes: int = 0) -> str:
    """Writes a filler file in `directory` until at most `leave_bytes` are free; returns it."""
    path = os.path.join(directory, "filler.bin")
    free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
    chunk = b"\0" * 65536
    with open(path, "wb") as f:
        remaining = max(0, free - leave_bytes)
        try:
            while remaining > 0:
                n = min(len(chunk), remaining)
                f.write(chunk[:n])
                remaining -= n
            f.flush()
        except OSError:
            pass  # the disk is full: what we wanted
    return path
