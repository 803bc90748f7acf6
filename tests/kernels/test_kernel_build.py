"""The fused kernels build wherever TensorFlow runs: the instruction-set choice, the compile
matrix over the CPUs we claim, the fallback, the remembered failure and its one warning.

The matrix compiles every source (`-fsyntax-only`) for each target in `targets.MATRIX` with
the flags a build on that CPU would use, through the entry point anyone can run
(`python -m bert_trainer.kernels.build --march=TARGET --check`). The build's own tests use a
fake compiler (a shell script that logs its calls), so they need no minute-long compile.
"""

import logging
import os
import pathlib
import re
import stat
import subprocess
import sys

import pytest
from conftest import REPO

from bert_trainer import kernels
from bert_trainer.kernels import build, targets

X86 = targets.machine() == "x86_64"
needs_x86 = pytest.mark.skipif(not X86, reason="x86-64 compiler flags")


def _gcc_macros(*flags: str) -> set[str]:
    done = subprocess.run(["g++", *flags, "-dM", "-E", "-x", "c++", "-"], input="",
                          capture_output=True, text=True, check=True)
    return {line.split()[1] for line in done.stdout.splitlines() if line.startswith("#define")}


# ------------------------------------------------------------------ the instruction set


@needs_x86
def test_native_flags_turn_off_avx512_fp16_and_nothing_else():
    flags = targets.native_flags("g++")
    assert flags == ["-march=native", "-mno-avx512fp16"]
    # The flag does what the build relies on: Eigen's FP16 path keys on this macro.
    assert "__AVX512FP16__" in _gcc_macros("-march=sapphirerapids")
    spr = _gcc_macros(*targets.target_flags("sapphirerapids", "g++"))
    assert "__AVX512FP16__" not in spr
    assert {"__AVX512F__", "__AVX512BF16__", "__AMX_BF16__"} <= spr  # the rest stays on


@needs_x86
def test_targets_the_compiler_does_not_know_use_what_native_would_expand_to():
    znver4 = targets.target_flags("znver4", "g++")
    macros = _gcc_macros(*znver4)
    assert {"__AVX512F__", "__AVX512BF16__", "__AVX512VNNI__", "__AVX2__"} <= macros
    assert "__AVX512FP16__" not in macros and znver4[-1] == "-mno-avx512fp16"
    granite = targets.target_flags("graniterapids", "g++")
    assert granite[0] in ("-march=graniterapids", "-march=sapphirerapids")
    assert "__AMX_BF16__" in _gcc_macros(*granite)
    with pytest.raises(targets.TargetError, match=r"--march=pentium9: g\+\+ knows no such "
                                                  r"target; choose one of x86-64-v2"):
        targets.target_flags("pentium9", "g++")


def test_the_fallback_level_follows_the_cpu_flags(monkeypatch):
    monkeypatch.delenv(build.MARCH_ENV, raising=False)
    v4 = set(targets._X86_V4)
    assert targets.x86_level(v4) == "x86-64-v4"
    assert targets.x86_level(v4 - {"avx512bw"}) == "x86-64-v3"
    assert targets.x86_level(set(targets._X86_V3) - {"fma"}) == "x86-64-v2"
    assert targets.x86_level({"sse2"}) is None
    if X86:
        assert targets.fallback_target() == targets.x86_level(targets.cpu_flags())
        assert build.build_targets() == ["native", targets.fallback_target()]


@needs_x86
def test_kernel_march_builds_for_one_level_this_cpu_has(monkeypatch):
    """BERT_TRAIN_KERNEL_MARCH=x86-64-v3 builds (and tests) the AVX2 library of a CPU without
    AVX-512 on one with it; a level the CPU lacks could not run, so it is refused."""
    monkeypatch.setattr(targets, "cpu_flags", lambda: set(targets._X86_V3))
    monkeypatch.setenv(build.MARCH_ENV, "x86-64-v3")
    assert build.build_targets() == ["x86-64-v3"]
    monkeypatch.setenv(build.MARCH_ENV, "x86-64-v4")
    with pytest.raises(build.BuildError, match=r"^BERT_TRAIN_KERNEL_MARCH=x86-64-v4: this CPU "
                                               r"lacks avx512bw, avx512cd, avx512dq, avx512f, "
                                               r"avx512vl, so a library built for it could not "
                                               r"run here; use x86-64-v3 or a lower level$"):
        build.build_targets()
    monkeypatch.setenv(build.MARCH_ENV, "znver4")
    with pytest.raises(build.BuildError, match=r"=znver4: choose one of native, x86-64-v4, "
                                               r"x86-64-v3, x86-64-v2$"):
        build.build_targets()


# --------------------------------------------------------------------- the compile matrix


# (compiler, flags) -> the target whose check passed with them, in this session.
_PASSED: dict[tuple[str, ...], str] = {}


def _command_key(target: str) -> tuple[str, ...] | None:
    try:
        cxx = targets.target_compiler(target, build.compiler())
        return (cxx, *build.arch_flags(target, cxx))
    except (build.BuildError, targets.TargetError):
        return None


@pytest.mark.slow  # one -fsyntax-only compile of every source per target (~10 s each)
@pytest.mark.parametrize("target", targets.MATRIX)
def test_every_source_compiles_for(target, capsys):
    key = _command_key(target)
    if key in _PASSED:
        # A compiler too old to know this CPU (g++ 12: graniterapids) checks it with the flags
        # of the newest one it knows, those of a target that passed already: the same
        # compile of the same unit, not run twice.
        assert not targets.accepts(key[0], (f"-march={target}",)), (target, _PASSED[key])
        return
    code = build.main(["--march", target, "--check"])
    out, err = capsys.readouterr()
    if code == 2 and targets.is_arm(target) and "g++-aarch64-linux-gnu" in err:
        pytest.skip(err.strip())  # no Arm cross compiler here (CI installs it: .ci/run)
    assert code == 0, err
    assert out.startswith(f"{target}: ok: -march=")
    if key is not None:
        _PASSED[key] = target


@pytest.mark.slow  # one -fsyntax-only compile (~10 s)
@needs_x86
def test_the_matrix_catches_the_bundled_eigen_failure_without_the_fix(monkeypatch, capsys):
    """The flags before this fix (`-march=sapphirerapids` alone) fail, naming Eigen's line."""
    monkeypatch.setattr(targets, "BROKEN_EXTENSIONS", ())
    assert build.main(["--march", "sapphirerapids", "--check"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "PacketMathFP16.h" in err and "error:" in err


def test_the_check_entry_point_exits_2_naming_an_unknown_target():
    done = subprocess.run([sys.executable, "-m", "bert_trainer.kernels.build",
                           "--march=pentium9", "--check"], capture_output=True, text=True,
                          cwd=REPO, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "pentium9: --march=pentium9: g++ knows no such target; choose one of "
        f"{', '.join(targets.MATRIX)} or a name `g++ -march=` accepts"]


# ------------------------------------------------------- fallback and remembered failures


def _fake_compiler(tmp_path, *, fail_when: str, version: str = "fakecc 1.0") -> pathlib.Path:
    """A compiler that logs each call, answers probes, and fails a compile whose arguments
    contain `fail_when` (else writes the object or library it was asked for)."""
    log = tmp_path / "calls.log"
    script = tmp_path / "fakecc"
    script.write_text(f"""#!/bin/sh
echo "$*" >> {log}
case "$*" in *--version*) echo "{version}"; exit 0;; esac
case "$*" in *fsyntax-only*) exit 0;; esac
case "$*" in *"{fail_when}"*) echo "kernel.cc:3:1: error: boom"; exit 1;; esac
while [ $# -gt 0 ]; do if [ "$1" = "-o" ]; then : > "$2"; fi; shift; done
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def _compiles(tmp_path) -> int:
    log = tmp_path / "calls.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return sum(line.startswith("-c ") for line in lines)


@pytest.fixture
def fake_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(build.MARCH_ENV, raising=False)  # native, then the fallback level
    targets.accepts.cache_clear()
    build.compiler_identity.cache_clear()
    yield tmp_path / "cache"
    targets.accepts.cache_clear()
    build.compiler_identity.cache_clear()


@needs_x86
def test_a_failing_native_build_falls_back_to_the_cpus_level_and_says_why(
        tmp_path, monkeypatch, fake_cache):
    monkeypatch.setenv("CXX", str(_fake_compiler(tmp_path, fail_when="march=native")))
    found = build.build()
    assert found.target == targets.fallback_target() and found.path.exists()
    assert found.note.startswith(f"built for -march={found.target} instead of this CPU's own "
                                 "instruction set: compiling ")
    assert "error: boom" in found.note
    assert build.warnings_path(found.path).read_text() == ""  # what the compilers printed
    assert build.cached() == found.__class__(found.path, found.target)  # next process: as is


def test_a_failed_build_is_remembered_per_compiler_and_flags(tmp_path, monkeypatch, fake_cache):
    monkeypatch.setenv("CXX", str(_fake_compiler(tmp_path, fail_when="-fPIC")))
    with pytest.raises(build.BuildError) as first:
        build.build()
    assert not first.value.environmental  # the sources failed: tests must not skip this
    message = str(first.value)
    assert message.startswith("compiling adamw.cc for -march=native") and "error: boom" in message
    tried = _compiles(tmp_path)
    assert tried >= len(build.sources())
    assert len(list(fake_cache.glob("*.failed"))) == len(build.build_targets())
    with pytest.raises(build.BuildError, match=r"error: boom .*\(remembered: delete .*\.failed "
                                               r"to try again\)"):
        build.build()
    assert _compiles(tmp_path) == tried  # no process pays for the same failure twice
    # Another compiler (version) tries afresh.
    monkeypatch.setenv("CXX", str(_fake_compiler(tmp_path, fail_when="-fPIC",
                                                 version="fakecc 2.0")))
    build.compiler_identity.cache_clear()
    with pytest.raises(build.BuildError):
        build.build()
    assert _compiles(tmp_path) > tried


def test_the_one_warning_names_cause_cost_and_fix(tmp_path, monkeypatch, fake_cache, caplog):
    monkeypatch.setenv("CXX", str(_fake_compiler(tmp_path, fail_when="-fPIC")))
    monkeypatch.setattr(kernels, "_library", None)
    monkeypatch.setattr(kernels, "_error", None)
    with caplog.at_level(logging.WARNING):
        assert kernels.library() is None
        assert kernels.library() is None  # asked again in the same process: no new line
    lines = [r.getMessage() for r in caplog.records if "Fused CPU kernels" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].startswith("Fused CPU kernels unavailable, using TensorFlow's ops: "
                               "compiling adamw.cc for -march=native")
    assert "error: boom" in lines[0] and kernels.COST_WITHOUT_KERNELS in lines[0]
    assert "bert-train doctor" in lines[0] and "BERT_TRAIN_FUSED_KERNELS=off" in lines[0]
    assert kernels.status()["error"] in lines[0] and not kernels.status()["loaded"]


def test_no_compiler_is_environmental(tmp_path, monkeypatch, fake_cache):
    monkeypatch.setenv("CXX", "")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(build.BuildError, match="no C.. compiler found") as e:
        build.build()
    assert e.value.environmental


# ------------------------------------------------------------------------------ doctor


@pytest.mark.slow  # one bert-train process (TensorFlow start-up)
def test_doctor_says_what_a_run_will_use(tmp_path):
    from bert_trainer import diagnostics

    env = dict(os.environ, PYTHONPATH=str(REPO), TF_NUM_INTRAOP_THREADS="3")
    done = subprocess.run([sys.executable, "-m", "bert_trainer.cli", "doctor"], env=env,
                          capture_output=True, text=True, cwd=REPO, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    rows = dict(re.fullmatch(r"(\S+(?: \S+)?) {2,}(.*)", line).groups()
                for line in done.stdout.splitlines())
    import tensorflow as tf

    assert rows["tensorflow"].startswith(tf.__version__)
    assert rows["fused kernels"].startswith("built for -march=")
    assert str(build.cached().path) in rows["fused kernels"]
    flags = targets.cpu_flags()
    assert ("AVX512_BF16 yes" in rows["cpu features"]) == ("avx512_bf16" in flags)
    assert ("AMX no" in rows["cpu features"]) == ("amx_tile" not in flags)
    assert rows["devices"].startswith("1 CPU")
    assert rows["cpu"].endswith(f"{os.cpu_count()} logical cores, 3 intra-op threads")
    # The advice follows a measurement (timing: its outcome is not asserted here, its form is;
    # the advice for each outcome is the next test's).
    if diagnostics.onednn_bfloat16_problem(flags) is not None:  # e.g. an AVX2 CPU
        assert rows["bfloat16"].startswith("unavailable: ")
    elif {"avx512_bf16", "amx_bf16", "bf16"} & flags:
        assert re.search(r"measured here, a bfloat16 matmul \(512x768x3072\) runs "
                         r"\d+\.\d\dx float32's", rows["bfloat16"]), rows["bfloat16"]
    else:
        assert rows["bfloat16"] == "emulated (no bfloat16 instructions): keep float32, the default"


def test_doctor_advises_bfloat16_only_where_the_cpu_has_it():
    from bert_trainer import diagnostics

    assert diagnostics.bfloat16_support({"amx_bf16", "amx_tile", "avx512_bf16"}).startswith(
        "native (AMX tiles): the better choice for training here: --gin_param='TrainerConfig."
        "mixed_precision=\"bfloat16\"'")
    assert diagnostics.bfloat16_support({"avx512_bf16"}).startswith("native (AVX512_BF16")
    assert "keep float32" in diagnostics.bfloat16_support({"avx2", "avx512f"})
    # A measurement decides on a CPU with the instructions: a gain below BF16_WORTH_IT keeps
    # float32 (a step gains less than its matmuls); an emulated CPU keeps it whatever it gains.
    fast = diagnostics.bfloat16_support({"avx512_bf16"}, speedup=2.5)
    assert "runs 2.50x float32's" in fast and "better choice" in fast
    slow = diagnostics.bfloat16_support({"amx_bf16", "amx_tile"}, speedup=1.1)
    assert slow.startswith("native (AMX tiles); measured here") and slow.endswith(
        "keep float32, the default")
    assert diagnostics.bfloat16_support({"avx2"}, speedup=0.2).endswith("keep float32, the default")
    # oneDNN below bfloat16 (an AVX2 CPU, or capped there): no measurement, which would abort.
    problem = diagnostics.onednn_bfloat16_problem({"avx2", "avx512_bf16"},
                                                  {"ONEDNN_MAX_CPU_ISA": "avx2"})
    assert problem == "ONEDNN_MAX_CPU_ISA=AVX2 holds TensorFlow's oneDNN below bfloat16"
    assert diagnostics.bfloat16_support({"avx512_bf16"}, problem=problem).startswith(
        "unavailable: ONEDNN_MAX_CPU_ISA=AVX2 holds")
    avx512 = {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"}
    assert "no AVX-512" in diagnostics.onednn_bfloat16_problem({"avx2", "fma"}, {})
    assert diagnostics.onednn_bfloat16_problem(avx512, {}) is None  # emulated by oneDNN
    assert diagnostics.onednn_bfloat16_problem(
        avx512, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}) is None
    assert diagnostics.onednn_bfloat16_problem(  # oneDNN off: TensorFlow's own kernels
        {"avx2"}, {"ONEDNN_MAX_CPU_ISA": "AVX2", "TF_ENABLE_ONEDNN_OPTS": "0"}) is None
    assert diagnostics.onednn_bfloat16_problem({"asimd", "bf16"}, {}) is None  # Arm


def test_the_bfloat16_measurement_times_both_dtypes_on_a_small_matmul():
    from bert_trainer import diagnostics
    from bert_trainer.kernels import targets

    flags = targets.cpu_flags()
    if diagnostics.onednn_bfloat16_problem(flags) is not None or not (
            {"avx512_bf16", "amx_bf16", "bf16"} & flags):
        # Where doctor does not measure: its line without a measurement is the test above's.
        pytest.skip("no bfloat16 matmul here (emulated, or oneDNN capped below it)")
    speedup = diagnostics.matmul_speedup(shape=(8, 16, 32), repeats=2)
    assert isinstance(speedup, float) and 0 < speedup < 1000
