"""The kernel cache loads a library only when its bytes match the digest record its build
wrote (`bert_trainer/kernels/cache.py`): a truncated library (which killed every command,
`doctor` too, with SIGBUS), a foreign file under the name this machine loads, a missing or
another record are rebuilt, with one log line; the directory is the user's alone.

A fake compiler stands in for g++: its "link" copies a real library (the one the kernel
tests load), so a rebuild takes no minute-long compile and its result really loads.
"""

import logging
import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys

import pytest
from conftest import REPO, fused_kernels_unavailable

from bert_trainer.kernels import build, cache


def _fake_compiler(tmp_path, library: pathlib.Path | None) -> pathlib.Path:
    """A compiler whose link step writes a copy of `library` (an empty file when None) and
    whose compile steps write empty objects."""
    script = tmp_path / "fakecc"
    source = f'cp "{library}"' if library else ": >"
    script.write_text(f"""#!/bin/sh
case "$*" in *--version*) echo "fakecc 1.0"; exit 0;; esac
case "$*" in *fsyntax-only*) exit 0;; esac
shared=no; case "$*" in *-shared*) shared=yes;; esac
while [ $# -gt 0 ]; do
  if [ "$1" = "-o" ]; then if [ $shared = yes ]; then {source} "$2"; else : > "$2"; fi; fi
  shift
done
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


@pytest.fixture
def fake_cache(tmp_path, monkeypatch):
    """A cache of this test's own, built by the fake compiler (whose library is empty)."""
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(_fake_compiler(tmp_path, None)))
    monkeypatch.delenv(build.MARCH_ENV, raising=False)
    build.compiler_identity.cache_clear()
    yield tmp_path / "cache"
    build.compiler_identity.cache_clear()


def _rebuilt_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "rebuilding it" in r.getMessage()]


def test_a_build_records_its_digest_in_a_directory_of_the_users_alone(fake_cache):
    found = build.build()
    record = cache.record_path(found.path)
    assert record.read_text() == f"{cache.digest(found.path)}  {found.path.name}\n"
    assert stat.S_IMODE(fake_cache.stat().st_mode) == 0o700
    assert stat.S_IMODE(found.path.stat().st_mode) == 0o500  # no one writes it in place
    assert build.cached() == found


@pytest.mark.parametrize("damage, reason", [
    (lambda lib, rec: lib.write_bytes(lib.read_bytes() + b"\x7fELF planted"),
     "does not match its digest record"),
    (lambda lib, rec: rec.unlink(), "has no digest record"),
    (lambda lib, rec: (rec.chmod(0o600), rec.write_text(f"{'0' * 64}  {lib.name}\n")),
     "does not match its digest record"),
    (lambda lib, rec: (rec.chmod(0o600), rec.write_text("garbage\n")),
     "has a malformed digest record"),
])
def test_a_library_that_does_not_match_its_record_is_rebuilt_with_one_line(
        fake_cache, caplog, damage, reason):
    found = build.build()
    good = cache.digest(found.path)
    found.path.chmod(0o600)
    damage(found.path, cache.record_path(found.path))
    assert build.cached() is None  # never loaded as it is
    with caplog.at_level(logging.WARNING):
        assert build.build() == found
    lines = _rebuilt_lines(caplog)
    assert len(lines) == 1 and lines[0].startswith(f"Fused CPU kernels: {found.path} {reason}")
    assert cache.digest(found.path) == good and cache.untrusted(found.path) is None


def test_a_damaged_library_whose_rebuild_fails_is_removed_not_loaded(fake_cache, tmp_path,
                                                                     caplog):
    found = build.build()
    found.path.chmod(0o600)
    found.path.write_bytes(b"\x7fELF cut short")
    # The same compiler (the cache key holds $CXX), now failing every compile.
    (tmp_path / "fakecc").write_text('#!/bin/sh\ncase "$*" in *--version*) echo "fakecc 2"; '
                                     'exit 0;; esac\ncase "$*" in *fsyntax-only*) exit 0;; '
                                     'esac\necho "k.cc:1:1: error: boom"; exit 1\n')
    build.compiler_identity.cache_clear()
    with caplog.at_level(logging.WARNING):
        with pytest.raises(build.BuildError, match="error: boom"):
            build.build()
        with pytest.raises(build.BuildError, match="remembered"):  # the next process
            build.build()
    assert not found.path.exists() and len(_rebuilt_lines(caplog)) == 1


def test_a_directory_others_could_write_is_tightened_and_its_library_rebuilt(fake_cache,
                                                                              caplog):
    found = build.build()
    fake_cache.chmod(0o777)
    assert build.cached() is None
    with caplog.at_level(logging.WARNING):
        build.build()
    assert "lay in a directory that is writable by others (mode 777)" in _rebuilt_lines(
        caplog)[0]
    assert stat.S_IMODE(fake_cache.stat().st_mode) == 0o700 and build.cached() == found


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="needs chown")
def test_another_users_directory_is_refused_in_one_line(fake_cache):
    fake_cache.mkdir()
    os.chown(fake_cache, 12345, -1)
    with pytest.raises(build.BuildError, match=rf"^the kernel cache {fake_cache} belongs to "
                                               rf"user id 12345, not to you \(0\): set "
                                               rf"{build.CACHE_ENV} to a directory of your own$"):
        build.build()


def _bert_train(tmp_path, *args) -> subprocess.CompletedProcess:
    real = build.cached()
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3",
               BERT_TRAIN_FUSED_KERNELS="auto", CXX=str(_fake_compiler(tmp_path, real.path)),
               **{build.CACHE_ENV: str(tmp_path / "cache")})
    env.pop(build.MARCH_ENV, None)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300, check=False)


@pytest.mark.slow  # three processes start TensorFlow
def test_a_truncated_or_foreign_library_is_rebuilt_by_any_command_doctor_too(tmp_path):
    """The probe's case: the cached library cut to 1,000 bytes made every later command die
    with SIGBUS (exit 135); a library planted under the name this machine loads ran its
    constructor in `doctor`."""
    reason = fused_kernels_unavailable()
    if reason or build.cached() is None:
        pytest.skip(reason or "no built library to copy")
    first = _bert_train(tmp_path, "-m", "bert_trainer.kernels.build")
    assert first.returncode == 0, first.stderr[-2000:]
    library = pathlib.Path(first.stdout.split(": ", 1)[1].split(" (", 1)[0])
    assert library.parent == tmp_path / "cache"
    library.chmod(0o600)
    with open(library, "r+b") as f:
        f.truncate(1000)
    again = _bert_train(tmp_path, "-m", "bert_trainer.kernels.build")
    assert again.returncode == 0, again.stderr[-2000:]  # was -7 (SIGBUS)
    lines = [line for line in again.stderr.splitlines() if "rebuilding it" in line]
    assert len(lines) == 1 and f"{library} does not match its digest record (1000 bytes" in (
        lines[0])
    assert again.stdout == first.stdout and cache.untrusted(library) is None
    # A foreign library whose constructor would leave a mark, planted under the same name.
    if shutil.which("gcc") is None:
        pytest.skip("no gcc to build a foreign library")
    mark = tmp_path / "CODE_RAN"
    (tmp_path / "evil.c").write_text(
        '#include <stdio.h>\n__attribute__((constructor)) static void p(void) '
        f'{{ FILE* f = fopen("{mark}", "w"); if (f) fclose(f); }}\n')
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "evil.so"),
                    str(tmp_path / "evil.c")], check=True)
    library.chmod(0o600)
    shutil.copyfile(tmp_path / "evil.so", library)
    doctor = _bert_train(tmp_path, "-m", "bert_trainer.cli", "doctor")
    assert doctor.returncode == 0, doctor.stderr[-2000:]
    assert not mark.exists()
    assert re.search(r"^fused kernels {2,}built for ", doctor.stdout, re.MULTILINE)
    assert sum("rebuilding it" in line for line in doctor.stderr.splitlines()) == 1
    assert cache.untrusted(library) is None
