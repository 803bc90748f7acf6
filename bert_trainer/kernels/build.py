"""Compiles `cpu_kernels.cc` against the installed TensorFlow and loads it, once per machine.

The shared library is cached under `$BERT_TRAIN_KERNEL_CACHE` (default
`$XDG_CACHE_HOME/bert_train/kernels`, else `~/.cache/bert_train/kernels`), named by a hash of
the source, the compiler command, the TensorFlow version and the CPU's feature flags, so a
change to any of them builds a new library and a cache shared between different machines
never loads code compiled for another CPU. Concurrent processes (parallel tests, workers)
wait on a file lock and build it once; the library appears atomically.

`python -m bert_trainer.kernels.build` builds it ahead of use (`make install` does).
"""

import hashlib
import os
import pathlib
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile

SOURCE = pathlib.Path(__file__).with_name("cpu_kernels.cc")
CACHE_ENV = "BERT_TRAIN_KERNEL_CACHE"
COMPILE_TIMEOUT_S = 900


class BuildError(RuntimeError):
    """The kernels cannot be built or loaded here; the message says why and what to do."""


def cache_dir() -> pathlib.Path:
    if os.environ.get(CACHE_ENV):
        return pathlib.Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "bert_train" / "kernels"


def compiler() -> str:
    """$CXX, else g++ or c++ on PATH."""
    for candidate in (os.environ.get("CXX"), "g++", "c++"):
        if candidate and shutil.which(candidate):
            return candidate
    raise BuildError("no C++ compiler found (tried $CXX, g++, c++): install g++, or set "
                     "BERT_TRAIN_FUSED_KERNELS=off to use TensorFlow's own ops")


def compile_command(source: pathlib.Path, output: pathlib.Path,
                    cxx: str | None = None) -> list[str]:
    """The compiler command; `cxx` defaults to `compiler()` (which must exist)."""
    import tensorflow as tf  # noqa: PLC0415 - only when building

    return [cxx or compiler(), "-shared", "-fPIC", "-O3", "-march=native", "-w",
            str(source), "-o", str(output),
            *tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]


def _cpu_fingerprint() -> str:
    """The CPU's model and feature flags (Linux x86 and Arm), else what `platform` says."""
    fields = ("flags", "model name", "Features", "CPU implementer", "CPU part")
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            lines = [line for line in f if line.startswith(fields)]
        return platform.machine() + "".join(sorted(set(lines)))
    except OSError:
        return platform.machine() + platform.processor()


def library_path() -> pathlib.Path:
    """Where the library for this source, TensorFlow and CPU is cached. Needs no compiler,
    so a library built ahead of time (`make install`) loads where none is installed."""
    import tensorflow as tf  # noqa: PLC0415 - only when building

    cxx = os.environ.get("CXX") or "default-c++"
    command = compile_command(pathlib.Path("SOURCE"), pathlib.Path("OUTPUT"), cxx=cxx)
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), shlex.join(command).encode(), tf.__version__.encode(),
                 _cpu_fingerprint().encode()):
        key.update(part)
        key.update(b"\0")
    return cache_dir() / f"bert_kernels_{key.hexdigest()[:16]}.so"


def build() -> pathlib.Path:
    """The cached library's path, compiling it first if no process has yet."""
    path = library_path()
    if path.exists():
        return path
    try:
        import fcntl  # noqa: PLC0415 - POSIX only

        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not path.exists():  # else another process built it while this one waited
                _compile(path)
    except (OSError, ImportError) as e:
        raise BuildError(f"cannot build in the kernel cache {path.parent} ({e}): set "
                         f"{CACHE_ENV} to a writable local directory") from None
    return path


def _compile(path: pathlib.Path) -> None:
    """Compiles into a staging file beside `path`, then renames it into place: a library
    appears whole or not at all."""
    fd, staging = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        command = compile_command(SOURCE, pathlib.Path(staging))
        try:
            done = subprocess.run(command, capture_output=True, text=True,
                                  timeout=COMPILE_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BuildError(f"compiling {SOURCE.name} failed ({e})") from None
        if done.returncode != 0:
            log = path.with_suffix(".log")
            log.write_text(shlex.join(command) + "\n\n" + done.stderr, encoding="utf-8")
            raise BuildError(f"compiling {SOURCE.name} failed (exit {done.returncode}; the "
                             f"compiler's output is in {log}): set BERT_TRAIN_FUSED_KERNELS=off "
                             "to use TensorFlow's own ops")
        os.chmod(staging, 0o755)  # mkstemp's 0600 would lock other users of the cache out
        os.replace(staging, path)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)


def load():
    """Builds if needed and loads the ops (`tf.load_op_library`)."""
    import tensorflow as tf  # noqa: PLC0415

    path = build()
    try:
        return tf.load_op_library(str(path))
    except tf.errors.OpError as e:  # e.g. built against another TensorFlow, or unreadable
        raise BuildError(f"loading {path} failed ({e.message.splitlines()[0]}): delete it "
                         "to rebuild") from None


def main() -> int:
    try:
        module = load()
    except BuildError as e:
        print(f"bert-train fused CPU kernels: {e}", file=sys.stderr)
        return 1
    names = [n for n in dir(module) if n.startswith("bert_") and "fallback" not in n]
    print(f"bert-train fused CPU kernels: {build()} ({len(names)} ops)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
