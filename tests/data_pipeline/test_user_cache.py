"""The user cache: whole entries or none, and the tokenizer's normalization table kept in it."""

import os
import stat

import pytest

from bert_trainer import user_cache
from bert_trainer.data import bert_normalizer
from bert_trainer.kernels import build


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv(user_cache.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(build.CACHE_ENV, raising=False)
    bert_normalizer.normalizer_model.cache_clear()
    yield tmp_path / "cache"
    bert_normalizer.normalizer_model.cache_clear()


def test_the_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(user_cache.CACHE_ENV, raising=False)
    monkeypatch.delenv(build.CACHE_ENV, raising=False)  # a run may set it (an AVX2 build's)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache.cache_dir("normalizer") == tmp_path / "xdg" / "bert_train" / "normalizer"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_cache.cache_dir("kernels") == tmp_path / "home" / ".cache" / "bert_train" / \
        "kernels"
    monkeypatch.setenv(user_cache.CACHE_ENV, str(tmp_path / "mine"))
    assert build.cache_dir() == tmp_path / "mine" / "kernels"  # the kernels' default too
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path / "kernels_only"))
    assert build.cache_dir() == tmp_path / "kernels_only"


def test_an_entry_reads_back_whole_and_an_altered_one_reads_as_none(cache_root):
    path = cache_root / "kind" / "entry.bin"
    assert user_cache.read(path) is None
    assert user_cache.write(path, b"\x00table bytes\xff")
    assert user_cache.read(path) == b"\x00table bytes\xff"
    assert os.listdir(path.parent) == ["entry.bin"]  # nothing left aside
    stored = path.read_bytes()
    path.write_bytes(stored[:-1])  # cut short
    assert user_cache.read(path) is None
    path.write_bytes(stored[:3] + b"X" + stored[4:])  # one byte changed
    assert user_cache.read(path) is None
    path.write_bytes(b"")
    assert user_cache.read(path) is None


def test_an_unwritable_cache_is_only_a_recomputation(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(user_cache.CACHE_ENV, str(blocker))
    bert_normalizer.normalizer_model.cache_clear()
    try:
        assert not user_cache.write(user_cache.cache_dir("x") / "e", b"data")
        model = bert_normalizer.normalizer_model(False)  # computed, not stored
    finally:
        bert_normalizer.normalizer_model.cache_clear()
    assert model == bert_normalizer.build_normalizer_model(False)
    assert blocker.read_text() == "not a directory"


def test_the_normalizer_table_is_computed_once_then_read(cache_root, monkeypatch):
    built = bert_normalizer.build_normalizer_model(True)
    assert bert_normalizer.normalizer_model(True) == built  # computed and stored
    path = bert_normalizer.cache_path(True)
    assert path.parent == cache_root / "normalizer" and path.name.startswith("bert-uncased-")
    assert bert_normalizer.cache_path(False) != path
    mode = stat.S_IMODE(path.stat().st_mode)
    assert mode & 0o044 == 0o044  # readable by the other users of a shared cache

    def no_computing(lower_case):
        raise AssertionError("the table was computed again")

    with monkeypatch.context() as patched:
        patched.setattr(bert_normalizer, "_changes", no_computing)
        bert_normalizer.normalizer_model.cache_clear()  # as a new process
        assert bert_normalizer.normalizer_model(True) == built

    # A damaged entry is computed again (and replaced), never handed to the tokenizer.
    path.write_bytes(path.read_bytes()[:-10])
    bert_normalizer.normalizer_model.cache_clear()
    assert bert_normalizer.normalizer_model(True) == built
    assert user_cache.read(path) == built
