"""Which instruction set the fused kernels are compiled for, on this CPU or a named one.

The kernels are plain C++ over Eigen (TensorFlow's bundled copy), so the instruction set is
only a compiler flag; choosing it is this module's one job.

**This CPU: `-march=native` minus what the bundled Eigen cannot compile.** The cache key holds
the CPU's feature flags (`build.library_path`), so a library is only ever loaded on the kind
of CPU it was built for, and `-march=native` gives Eigen every vector unit the CPU has:
AVX-512 and AVX512_BF16 where present, NEON on Arm. One extension must be turned off:
**AVX-512 FP16** (Intel Sapphire Rapids and later). With `__AVX512FP16__` defined, Eigen turns
on `EIGEN_VECTORIZE_AVX512FP16`, and the snapshot TensorFlow 2.21 bundles specialises a
function template its generic code never declares:

    Eigen/src/Core/arch/AVX512/PacketMathFP16.h:740: error: expected initializer before '<'
    token   (predux_half_dowto4<Packet32h>)

so every source failed on those CPUs and training silently fell back to TensorFlow's ops.
`-mno-avx512fp16` removes only that path (the kernels compute half precision in float32
anyway). `BROKEN_EXTENSIONS` lists such extensions; the compile matrix in the tests
(`python -m bert_trainer.kernels.build --march=TARGET --check`, for every target in
`MATRIX`) catches the next one before a user does.

Why not a fixed baseline plus runtime dispatch: the kernels' vector code is Eigen's, inlined
into each kernel, so dispatch would mean compiling every kernel once per ISA level and
choosing at load time, many times the compile cost for what `-march=native` already gives a
library that is built on, and only loaded on, one kind of CPU.

**A fallback that is still fast.** If the native flags fail anyway (a future extension, an
assembler older than the compiler), the build tries once more for the highest x86-64 psABI
level the CPU has (`x86-64-v4` = AVX-512, `-v3` = AVX2 + FMA, `-v2`), or `armv8-a` on Arm:
feature sets Eigen has long supported. The build says which it used and why.

**Named targets** for the matrix: `-march=TARGET` where this compiler knows the name; where it
does not (g++ 12 has no `graniterapids` or `znver4`), the same flags `-march=native` expands
to on that CPU with this compiler: its nearest known model plus the extensions the compiler
knows (`EQUIVALENTS`), as `g++ -march=native -E -v` shows on a Zen 4 machine.
"""

import functools
import platform
import shutil
import subprocess

# Extensions whose code in TensorFlow's bundled Eigen does not compile (see the docstring).
BROKEN_EXTENSIONS = ("avx512fp16",)

# x86-64 psABI levels, highest first, with the /proc/cpuinfo flags each needs.
_X86_V2 = ("cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3")
_X86_V3 = _X86_V2 + ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")
_X86_V4 = _X86_V3 + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
X86_LEVELS = (("x86-64-v4", _X86_V4), ("x86-64-v3", _X86_V3), ("x86-64-v2", _X86_V2))

# Targets a compiler may not know by name: (a model it knows, the extensions added to it).
_ZNVER4_EXTRA = ("avx512f", "avx512dq", "avx512ifma", "avx512cd", "avx512bw", "avx512vl",
                 "avx512bf16", "avx512vbmi", "avx512vbmi2", "gfni", "vpclmulqdq", "avx512vnni",
                 "avx512bitalg", "avx512vpopcntdq")
EQUIVALENTS = {
    "znver4": ("znver3", _ZNVER4_EXTRA),
    "znver5": ("znver3", _ZNVER4_EXTRA + ("avxvnni", "movdiri", "movdir64b", "avx512vp2intersect",
                                          "prefetchi")),
    "graniterapids": ("sapphirerapids", ("amx-fp16", "prefetchi")),
}

# The CPUs the kernels are claimed for: checked by the tests' compile matrix.
X86_MATRIX = ("x86-64-v2", "x86-64-v3", "x86-64-v4", "skylake-avx512", "icelake-server",
              "sapphirerapids", "graniterapids", "znver3", "znver4")
ARM_MATRIX = ("armv8-a", "armv8.2-a+fp16+bf16")
MATRIX = X86_MATRIX + ARM_MATRIX
ARM_CROSS_COMPILER = "aarch64-linux-gnu-g++"


class TargetError(RuntimeError):
    """The target cannot be compiled for here (an unknown name, no compiler for its
    architecture); the message says what to install or choose."""


def machine() -> str:
    """"x86_64", "aarch64", or what `platform.machine()` says."""
    name = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(name, name)


def is_arm(target: str) -> bool:
    return target.startswith(("armv", "aarch64"))


@functools.cache
def accepts(cxx: str, flags: tuple[str, ...]) -> bool:
    """Whether `cxx` compiles an empty C++ file with `flags` (it knows them)."""
    try:
        done = subprocess.run([cxx, *flags, "-x", "c++", "-fsyntax-only", "-"], input="",
                              capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def disabled(cxx: str) -> list[str]:
    """`-mno-X` for each broken extension `cxx` knows (one it does not know, it never
    enables). x86 compilers only."""
    return [f"-mno-{x}" for x in BROKEN_EXTENSIONS if accepts(cxx, (f"-mno-{x}",))]


def cpu_flags() -> set[str]:
    """This CPU's feature flags from /proc/cpuinfo (Linux; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def x86_level(flags: set[str]) -> str | None:
    """The highest x86-64 psABI level whose features are all in `flags`."""
    for level, needed in X86_LEVELS:
        if set(needed) <= flags:
            return level
    return None


def native_flags(cxx: str) -> list[str]:
    """The flags for a build on this CPU: `-march=native` minus the broken extensions."""
    arch = machine()
    if arch == "x86_64":
        return ["-march=native", *disabled(cxx)]
    if arch == "aarch64":
        return ["-march=native"] if accepts(cxx, ("-march=native",)) else []
    return []  # other architectures: the compiler's default target


def fallback_target() -> str | None:
    """A second choice for this CPU if the native flags fail (its x86-64 psABI level, or
    `armv8-a`), or None. Read from the CPU alone: no compiler needed."""
    arch = machine()
    if arch == "x86_64":
        return x86_level(cpu_flags())
    if arch == "aarch64":
        return "armv8-a"
    return None


def forced_target(name: str) -> str:
    """`name` (from `BERT_TRAIN_KERNEL_MARCH`) as the one target a build here uses: "native",
    an x86-64 psABI level this CPU has (`x86-64-v3` on an AVX-512 machine builds the AVX2
    library a CPU without AVX-512 would get), or `armv8-a` on Arm.

    Raises:
      TargetError: another name, or a level this CPU lacks (its library could not run here).
    """
    levels = dict(X86_LEVELS)
    if name == "native" or (name == "armv8-a" and machine() == "aarch64"):
        return name
    if name in levels and machine() == "x86_64":
        lacking = sorted(set(levels[name]) - cpu_flags())
        if not lacking:
            return name
        raise TargetError(f"BERT_TRAIN_KERNEL_MARCH={name}: this CPU lacks "
                          f"{', '.join(lacking)}, so a library built for it could not run "
                          f"here; use {x86_level(cpu_flags()) or 'native'} or a lower level")
    choices = ["native", *(levels if machine() == "x86_64" else ["armv8-a"])]
    raise TargetError(f"BERT_TRAIN_KERNEL_MARCH={name}: choose one of {', '.join(choices)}")


def target_compiler(target: str, host_cxx: str) -> str:
    """The compiler for `target`: the host's for the host's architecture, else the Debian
    cross compiler (`g++-aarch64-linux-gnu`) for Arm targets on x86.

    Raises:
      TargetError: no compiler for the target's architecture.
    """
    if is_arm(target) == (machine() == "aarch64"):
        return host_cxx
    if is_arm(target):
        found = shutil.which(ARM_CROSS_COMPILER)
        if found:
            return found
        raise TargetError(f"--march={target}: no Arm compiler here ({ARM_CROSS_COMPILER} not "
                          "on PATH): install Debian's g++-aarch64-linux-gnu")
    raise TargetError(f"--march={target}: an x86 target needs an x86-64 host or cross "
                      "compiler; set CXX to one")


def target_flags(target: str, cxx: str) -> list[str]:
    """The flags a build on a `target` CPU would use with this compiler (see the docstring).

    Raises:
      TargetError: the compiler knows neither the name nor an equivalent.
    """
    if target == "native":
        return native_flags(cxx)
    arm = is_arm(target)
    tail = [] if arm else disabled(cxx)
    if accepts(cxx, (f"-march={target}",)):
        return [f"-march={target}", *tail]
    if target in EQUIVALENTS and accepts(cxx, (f"-march={EQUIVALENTS[target][0]}",)):
        base, extra = EQUIVALENTS[target]
        known = [f"-m{x}" for x in extra if accepts(cxx, (f"-m{x}",))]
        return [f"-march={base}", *known, *tail]
    raise TargetError(f"--march={target}: {cxx} knows no such target; choose one of "
                      f"{', '.join(MATRIX)} or a name `{cxx} -march=` accepts")
