"""Compiles the kernels' C++ sources against the installed TensorFlow and loads them, once per
machine.

Every `*.cc` here (one per op family, sharing the `*.h` headers) is compiled to an object,
in parallel, with warnings on (`-Wall -Wextra`: a warning in these sources is a bug, and a
test keeps them at none; a compile stops at its first error, the one reported), then linked
into one shared library. TensorFlow's own compile and link flags (`tf.sysconfig`) are used,
its include directory as a system one (`-isystem`): the warnings its headers raise
themselves are TensorFlow's, not ours. The instruction set is
`targets.py`'s choice: this CPU's own (`-march=native` minus the extensions TensorFlow's
bundled Eigen cannot compile), else the CPU's x86-64 psABI level (or `armv8-a`).

The library is cached under `$BERT_TRAIN_KERNEL_CACHE` (default: the user cache's `kernels/`,
`user_cache.cache_dir`: `$XDG_CACHE_HOME/bert_train/kernels`, else
`~/.cache/bert_train/kernels`), named by a hash of
the sources and headers, the compile policy, the TensorFlow version and the CPU's feature
flags, so a change to any of them builds a new library and a cache shared between different
machines never loads code compiled for another CPU. Concurrent processes (parallel tests,
workers) wait on a file lock and build it once; the library appears atomically, after the
record of its digest, in a directory of mode 0700, and is loaded only if its bytes match that
record (`cache.py`): a damaged or foreign file is rebuilt, with one log line.
`$BERT_TRAIN_KERNEL_MARCH` builds for one named target instead (`x86-64-v3`: the AVX2 library
of a CPU without AVX-512, on one that has it).

A build that fails is remembered (`*.failed` beside where the library would be, named by the
compiler's version and the exact flags too): later processes report the same cause at once
instead of compiling again. Another compiler, other sources or another TensorFlow try afresh.

`python -m bert_trainer.kernels.build` builds it ahead of use (`make install` does);
`python -m bert_trainer.kernels.build --march=TARGET --check` checks that every source
compiles for a TARGET CPU (`targets.MATRIX`) with the flags a build there would use.
"""

import argparse
import concurrent.futures
import dataclasses
import functools
import hashlib
import os
import pathlib
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

from absl import logging

from bert_trainer import user_cache
from bert_trainer.kernels import cache, targets

KERNEL_DIR = pathlib.Path(__file__).parent
CACHE_ENV = "BERT_TRAIN_KERNEL_CACHE"
# Builds for one named target instead of this CPU's own (`targets.forced_target`): how a test
# gets the AVX2 (`x86-64-v3`) library of a CPU without AVX-512 on one that has it.
MARCH_ENV = "BERT_TRAIN_KERNEL_MARCH"
COMPILE_TIMEOUT_S = 900
WARNINGS = ("-Wall", "-Wextra")
# Stop at the first error: only it is reported (`first_error`), and a compile that fails in
# TensorFlow's headers (the bundled Eigen on a CPU it cannot target) then costs seconds, not
# the minutes of parsing everything after it.
FAIL_FAST = ("-Wfatal-errors",)
# No fused multiply-add unless a kernel asks for one: contracted, `a * b + c` rounds once in
# the code the compiler chose to fuse and twice elsewhere, so an element's bits would follow
# whether Eigen's vector loop or its scalar head and tail computed it (common.h). No errno
# from math functions (the kernels never read it): a loop of std::sqrt then vectorizes.
NUMERICS = ("-ffp-contract=off", "-fno-math-errno")
# Part of the cache key: bump when the flag policy changes in a way the key cannot see.
POLICY = "march-native-minus-broken/3"
OFF_HINT = "set BERT_TRAIN_FUSED_KERNELS=off to use TensorFlow's own ops"


class BuildError(RuntimeError):
    """The kernels cannot be built or loaded here; the message says why and what to do.

    `environmental` is True where the cause is the machine (no compiler, a compiler that
    cannot target this CPU, an unwritable cache), not the sources.
    """

    def __init__(self, message: str, environmental: bool = False):
        super().__init__(message)
        self.environmental = environmental


@dataclasses.dataclass(frozen=True)
class Build:
    """A built library: its path, the target it was built for ("native" or a fallback level),
    and why the native build was not used (None when it was)."""

    path: pathlib.Path
    target: str
    note: str | None = None


def sources() -> list[pathlib.Path]:
    """The C++ sources, one per op family, in name order."""
    return sorted(KERNEL_DIR.glob("*.cc"))


def headers() -> list[pathlib.Path]:
    return sorted(KERNEL_DIR.glob("*.h"))


def cache_dir() -> pathlib.Path:
    if os.environ.get(CACHE_ENV):
        return pathlib.Path(os.environ[CACHE_ENV])
    return user_cache.cache_dir("kernels")


def compiler() -> str:
    """$CXX, else g++ or c++ on PATH."""
    for candidate in (os.environ.get("CXX"), "g++", "c++"):
        if candidate and shutil.which(candidate):
            return candidate
    raise BuildError(f"no C++ compiler found (tried $CXX, g++, c++): install g++, or "
                     f"{OFF_HINT}", environmental=True)


@functools.cache
def compiler_identity(cxx: str) -> str:
    """The first line of `cxx --version` (what a remembered failure is tied to)."""
    try:
        done = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60,
                              check=False)
        return (done.stdout.splitlines() or [""])[0].strip() or cxx
    except (OSError, subprocess.TimeoutExpired):
        return cxx


def _tf_compile_flags() -> list[str]:
    """TensorFlow's compile flags, its include directory as a system one (`-isystem`): the
    warnings its headers raise are TensorFlow's own, and would bury ours."""
    import tensorflow as tf  # noqa: PLC0415 - only when building

    flags = []
    for flag in tf.sysconfig.get_compile_flags():
        flags += ["-isystem", flag[2:]] if flag.startswith("-I") else [flag]
    return flags


def arch_flags(target: str = "native", cxx: str | None = None) -> list[str]:
    """The instruction-set flags for `target` ("native": this CPU) with compiler `cxx`.

    Raises:
      BuildError: the compiler cannot target it (environmental).
    """
    cxx = cxx or compiler()
    try:
        return targets.target_flags(target, cxx)
    except targets.TargetError as e:
        raise BuildError(str(e), environmental=True) from None


def compile_command(source: pathlib.Path, output: pathlib.Path, cxx: str | None = None,
                    target: str = "native") -> list[str]:
    """The command compiling `source` to the object `output` for `target`; `cxx` defaults to
    `compiler()` (which must exist)."""
    cxx = cxx or compiler()
    return [cxx, "-c", "-fPIC", "-O3", *NUMERICS, *arch_flags(target, cxx), *WARNINGS, *FAIL_FAST,
            str(source), "-o", str(output), *_tf_compile_flags()]


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


def library_path(target: str = "native") -> pathlib.Path:
    """Where the library for these sources, TensorFlow, CPU and `target` is cached. Needs no
    compiler, so a library built ahead of time (`make install`) loads where none is
    installed: the key names the target, not the flags a compiler expands it to."""
    import tensorflow as tf  # noqa: PLC0415 - only when building

    key = hashlib.sha256()
    parts = [f"{p.name}\0".encode() + p.read_bytes() for p in sources() + headers()]
    parts += [shlex.join([os.environ.get("CXX") or "default-c++", "-O3", *NUMERICS, *WARNINGS,
                          *FAIL_FAST,
                          POLICY, *targets.BROKEN_EXTENSIONS, target, *_tf_compile_flags(),
                          *tf.sysconfig.get_link_flags()]).encode()]
    for part in (*parts, tf.__version__.encode(), _cpu_fingerprint().encode()):
        key.update(part)
        key.update(b"\0")
    return cache_dir() / f"bert_kernels_{key.hexdigest()[:16]}.so"


def failure_path(library: pathlib.Path, cxx: str, flags: list[str]) -> pathlib.Path:
    """Where a failed build of `library` with this compiler and these flags is remembered."""
    tag = hashlib.sha256(shlex.join([compiler_identity(cxx), *flags]).encode()).hexdigest()
    return library.with_name(f"{library.stem}.{tag[:8]}.failed")


def build_targets() -> list[str]:
    """The targets a build tries, in order: "native", then the CPU's fallback level; only
    `$BERT_TRAIN_KERNEL_MARCH` where it is set.

    Raises:
      BuildError: `$BERT_TRAIN_KERNEL_MARCH` names a target this CPU cannot run.
    """
    if os.environ.get(MARCH_ENV):
        try:
            return [targets.forced_target(os.environ[MARCH_ENV])]
        except targets.TargetError as e:
            raise BuildError(str(e), environmental=True) from None
    fallback = targets.fallback_target()
    return ["native"] + ([fallback] if fallback else [])


def cached() -> Build | None:
    """A library already built for this machine (no compiler needed), or None: the first of
    `build_targets()` whose library exists, if its bytes match its digest record and its
    directory is the user's alone (`cache.py`); None if not (`build()` then rebuilds it)."""
    for target in build_targets():
        path = library_path(target)
        if path.exists():
            trusted = not cache.not_private(path.parent) and not cache.untrusted(path)
            return Build(path, target) if trusted else None
    return None


def build() -> Build:
    """The cached library, compiling it first if no process has yet: for this CPU's own
    instruction set, else (that failing) for its fallback level.

    Raises:
      BuildError: neither could be built; the message is the native build's cause.
    """
    found = cached()
    if found:
        return found
    cxx = compiler()
    causes: list[tuple[str, BuildError]] = []
    for target in build_targets():
        try:
            path = _build_target(target, cxx)
        except BuildError as e:
            causes.append((target, e))
            continue
        note = None
        if causes:
            note = (f"built for -march={target} instead of this CPU's own instruction set: "
                    f"{causes[0][1]}")
        return Build(path, target, note)
    message = str(causes[0][1])
    for target, e in causes[1:]:
        message += (f"; the fallback -march={target} failed too: {e}" if not e.environmental
                    else "")
    raise BuildError(message, environmental=causes[0][1].environmental)


def _build_target(target: str, cxx: str) -> pathlib.Path:
    path = library_path(target)
    flags = arch_flags(target, cxx)
    failed = failure_path(path, cxx, flags)
    try:
        import fcntl  # noqa: PLC0415 - POSIX only

        opened = path.parent.exists() and cache.not_private(path.parent)
        cache.make_private(path.parent)
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if path.exists():
                # Anyone could have written library and record alike while others could write.
                reason = f"lay in a directory that {opened}" if opened else cache.untrusted(path)
                if reason is None:  # another process built it while this one waited
                    return path
                logging.warning("Fused CPU kernels: %s %s; rebuilding it", path, reason)
                path.unlink()  # never loaded, and should the build fail, not found again
            if failed.exists():
                raise BuildError(failed.read_text(encoding="utf-8").splitlines()[0] +
                                 f" (remembered: delete {failed} to try again)")
            _compile(path, target, cxx, failed)
    except cache.CacheError as e:
        raise BuildError(f"{e}: set {CACHE_ENV} to a directory of your own",
                         environmental=True) from None
    except (OSError, ImportError) as e:
        raise BuildError(f"cannot build in the kernel cache {path.parent} ({e}): set "
                         f"{CACHE_ENV} to a writable local directory",
                         environmental=True) from None
    return path


def first_error(text: str) -> str:
    """The compiler's first error line (`file:line:col: error: ...`), else its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for pattern in (r"\berror:", r"\b(error|Error)\b"):
        for line in lines:
            if re.search(pattern, line):
                return line
    return lines[-1] if lines else "no output"


def compile_library(output: pathlib.Path, log: pathlib.Path | None = None,
                    target: str = "native") -> str:
    """Compiles every source (in parallel) for `target` and links them into `output`.

    Args:
      output: the shared library to write.
      log: where a failure's commands and compiler output go (default: beside `output`).
      target: "native" or a fallback level (`targets.py`).

    Returns:
      What the compilers printed (their warnings): empty for a clean build.

    Raises:
      BuildError: a compiler could not run or failed; the message names the source, the
        flags and the compiler's first error.
    """
    log = log or output.with_suffix(".log")
    with tempfile.TemporaryDirectory(dir=output.parent) as scratch:
        objects = [pathlib.Path(scratch) / f"{s.stem}.o" for s in sources()]
        steps = [(f"compiling {s.name}", compile_command(s, o, target=target))
                 for s, o in zip(sources(), objects, strict=True)]
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            results = list(pool.map(_run, [command for _, command in steps]))
        steps.append((f"linking {output.name}", link_command(objects, output)))
        if all(code == 0 for code, _ in results):
            results.append(_run(steps[-1][1]))
        for (what, _), (code, text) in zip(steps, results, strict=False):
            if code is None:
                raise BuildError(f"{what} failed ({text})", environmental=True)
            if code != 0:
                log.write_text("\n\n".join(f"{shlex.join(command)}\n{text}" for (_, command), (
                    _, text) in zip(steps, results, strict=False)), encoding="utf-8")
                flags = " ".join(arch_flags(target))
                raise BuildError(f"{what} for {flags or 'the default target'} failed: "
                                 f"{first_error(text)} (the compiler's output is in {log})")
    return "".join(text for _, text in results)


def _run(command: list[str]) -> tuple[int | None, str]:
    """(the exit code, or None where the command could not run; its output)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True,
                              timeout=COMPILE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    return done.returncode, done.stdout + done.stderr


def _compile(path: pathlib.Path, target: str, cxx: str, failed: pathlib.Path) -> None:
    """Builds into a staging file beside `path`, then renames it into place: a library
    appears whole or not at all, after its digest record (`cache.py`), with what its
    compilers printed beside it (`warnings_path`: empty for a clean build). A failure of the
    sources (not of the machine) is written to `failed`, so that later processes do not pay
    for it again."""
    fd, staging = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        printed = compile_library(pathlib.Path(staging), log=path.with_suffix(".log"),
                                  target=target)
        _write_aside(warnings_path(path), printed)
        os.chmod(staging, 0o500)  # the cache is the user's alone; read-only guards the bytes
        cache.write_record(pathlib.Path(staging), path)
        os.replace(staging, path)
    except BuildError as e:
        if not e.environmental:
            _write_aside(failed, f"{e}\n")
        raise
    finally:
        if os.path.exists(staging):
            os.unlink(staging)


def warnings_path(library: pathlib.Path) -> pathlib.Path:
    """What the compilers printed while building `library` (-Wall -Wextra on its sources)."""
    return library.with_suffix(".warnings")


def _write_aside(path: pathlib.Path, text: str) -> None:
    staging = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    staging.write_text(text, encoding="utf-8")
    os.replace(staging, path)


def load(found: Build | None = None):
    """Builds if needed and loads the ops (`tf.load_op_library`)."""
    import tensorflow as tf  # noqa: PLC0415

    path = (found or build()).path
    try:
        return tf.load_op_library(str(path))
    except tf.errors.OpError as e:  # e.g. built against another TensorFlow, or unreadable
        raise BuildError(f"loading {path} failed ({e.message.splitlines()[0]}): delete it "
                         "to rebuild") from None


def check(target: str = "native") -> tuple[int, str]:
    """Whether every source compiles for a `target` CPU with the flags a build there would use
    (`-fsyntax-only`, all sources in one translation unit: the headers are parsed once; the
    real build compiles each source alone).

    Returns:
      (0, the flags) when they compile, (1, the compiler's first error) when not, (2, why)
      when this machine cannot check the target (no compiler for it, an unknown name).
    """
    try:
        cxx = targets.target_compiler(target, compiler())
        flags = arch_flags(target, cxx)
    except (BuildError, targets.TargetError) as e:
        return 2, str(e)
    with tempfile.TemporaryDirectory() as scratch:
        unity = pathlib.Path(scratch) / "all_kernels.cc"
        unity.write_text("".join(f'#include "{s}"\n' for s in sources()), encoding="utf-8")
        code, text = _run([cxx, "-fsyntax-only", *NUMERICS, *flags, *WARNINGS, *FAIL_FAST, "-I",
                           str(KERNEL_DIR), str(unity), *_tf_compile_flags()])
    if code is None:
        return 2, f"{cxx} could not run ({text})"
    return (0, " ".join(flags)) if code == 0 else (1, first_error(text))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bert_trainer.kernels.build",
                                     description="Build (or --check) bert-train's fused CPU "
                                                 "kernels.")
    parser.add_argument("--march", default="native",
                        help="target CPU for --check: native, or one of "
                             f"{', '.join(targets.MATRIX)} (or a name -march= accepts)")
    parser.add_argument("--check", action="store_true",
                        help="only check that every source compiles for --march; exit 0 if "
                             "so, 1 with the compiler's first error if not, 2 if this machine "
                             "cannot check that target")
    args = parser.parse_args(argv)
    if args.check:
        code, message = check(args.march)
        print(f"{args.march}: {'ok: ' if code == 0 else ''}{message}",
              file=sys.stdout if code == 0 else sys.stderr)
        return code
    if args.march != "native":
        parser.error("--march other than native goes with --check (a library is built for "
                     "the CPU it runs on)")
    try:
        found = build()
        module = load(found)
    except BuildError as e:
        print(f"bert-train fused CPU kernels: {e}", file=sys.stderr)
        return 1
    names = [n for n in dir(module) if n.startswith("bert_") and "fallback" not in n]
    note = f"; {found.note}" if found.note else ""
    print(f"bert-train fused CPU kernels: {found.path} ({len(names)} ops, -march "
          f"{found.target}{note})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
