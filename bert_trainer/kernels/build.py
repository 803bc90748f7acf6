"""Compiles the kernels' C++ sources against the installed TensorFlow and loads them, once per
machine.

Every `*.cc` here (one per op family, sharing the `*.h` headers) is compiled to an object,
in parallel, with warnings on (`-Wall -Wextra`: a warning in these sources is a bug, and a
test keeps them at none), then linked into one shared library. TensorFlow's headers are
included as system headers (`-isystem`): the warnings they raise themselves (unused
parameters, their own deprecations) are TensorFlow's, not ours.

The library is cached under `$BERT_TRAIN_KERNEL_CACHE` (default
`$XDG_CACHE_HOME/bert_train/kernels`, else `~/.cache/bert_train/kernels`), named by a hash of
the sources and headers, the compiler commands, the TensorFlow version and the CPU's feature
flags, so a change to any of them builds a new library and a cache shared between different
machines never loads code compiled for another CPU. Concurrent processes (parallel tests,
workers) wait on a file lock and build it once; the library appears atomically.

`python -m bert_trainer.kernels.build` builds it ahead of use (`make install` does).
"""

import concurrent.futures
import hashlib
import os
import pathlib
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile

KERNEL_DIR = pathlib.Path(__file__).parent
CACHE_ENV = "BERT_TRAIN_KERNEL_CACHE"
COMPILE_TIMEOUT_S = 900
WARNINGS = ("-Wall", "-Wextra")


class BuildError(RuntimeError):
    """The kernels cannot be built or loaded here; the message says why and what to do."""


def sources() -> list[pathlib.Path]:
    """The C++ sources, one per op family, in name order."""
    return sorted(KERNEL_DIR.glob("*.cc"))


def headers() -> list[pathlib.Path]:
    return sorted(KERNEL_DIR.glob("*.h"))


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


def _tf_compile_flags() -> list[str]:
    """TensorFlow's compile flags, its include directory as a system one (`-isystem`): the
    warnings its headers raise are TensorFlow's own, and would bury ours."""
    import tensorflow as tf  # noqa: PLC0415 - only when building

    flags = []
    for flag in tf.sysconfig.get_compile_flags():
        flags += ["-isystem", flag[2:]] if flag.startswith("-I") else [flag]
    return flags


def compile_command(source: pathlib.Path, output: pathlib.Path,
                    cxx: str | None = None) -> list[str]:
    """The command compiling `source` to the object `output`; `cxx` defaults to
    `compiler()` (which must exist)."""
    return [cxx or compiler(), "-c", "-fPIC", "-O3", "-march=native", *WARNINGS, str(source),
            "-o", str(output), *_tf_compile_flags()]


def link_command(objects: list[pathlib.Path], output: pathlib.Path,
                 cxx: str | None = None) -> list[str]:
    """The command linking `objects` into the shared library `output`."""
    import tensorflow as tf  # noqa: PLC0415 - only when building

    return [cxx or compiler(), "-shared", *map(str, objects), "-o", str(output),
            *tf.sysconfig.get_link_flags()]


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
    """Where the library for these sources, TensorFlow and CPU is cached. Needs no compiler,
    so a library built ahead of time (`make install`) loads where none is installed."""
    import tensorflow as tf  # noqa: PLC0415 - only when building

    cxx = os.environ.get("CXX") or "default-c++"
    commands = [compile_command(pathlib.Path("SOURCE"), pathlib.Path("OBJECT"), cxx=cxx),
                link_command([pathlib.Path("OBJECT")], pathlib.Path("OUTPUT"), cxx=cxx)]
    key = hashlib.sha256()
    parts = [f"{p.name}\0".encode() + p.read_bytes() for p in sources() + headers()]
    parts += [shlex.join(c).encode() for c in commands]
    for part in (*parts, tf.__version__.encode(), _cpu_fingerprint().encode()):
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


def compile_library(output: pathlib.Path, log: pathlib.Path | None = None) -> str:
    """Compiles every source (in parallel) and links them into `output`.

    Args:
      output: the shared library to write.
      log: where a failure's commands and compiler output go (default: beside `output`).

    Returns:
      What the compilers printed (their warnings): empty for a clean build.

    Raises:
      BuildError: a compiler could not run or failed; the message names the source.
    """
    log = log or output.with_suffix(".log")
    with tempfile.TemporaryDirectory(dir=output.parent) as scratch:
        objects = [pathlib.Path(scratch) / f"{s.stem}.o" for s in sources()]
        steps = [(f"compiling {s.name}", compile_command(s, o))
                 for s, o in zip(sources(), objects, strict=True)]
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            results = list(pool.map(_run, [command for _, command in steps]))
        steps.append((f"linking {output.name}", link_command(objects, output)))
        if all(code == 0 for code, _ in results):
            results.append(_run(steps[-1][1]))
        for (what, _), (code, text) in zip(steps, results, strict=False):
            if code is None:
                raise BuildError(f"{what} failed ({text})")
            if code != 0:
                log.write_text("\n\n".join(f"{shlex.join(command)}\n{text}" for (_, command), (
                    _, text) in zip(steps, results, strict=False)), encoding="utf-8")
                raise BuildError(f"{what} failed (exit {code}; the compiler's output is in "
                                 f"{log}): set BERT_TRAIN_FUSED_KERNELS=off to use "
                                 "TensorFlow's own ops")
    return "".join(text for _, text in results)


def _run(command: list[str]) -> tuple[int | None, str]:
    """(the exit code, or None where the command could not run; its output)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True,
                              timeout=COMPILE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    return done.returncode, done.stdout + done.stderr


def _compile(path: pathlib.Path) -> None:
    """Builds into a staging file beside `path`, then renames it into place: a library
    appears whole or not at all."""
    fd, staging = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        compile_library(pathlib.Path(staging), log=path.with_suffix(".log"))
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
