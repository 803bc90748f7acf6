"""bert_trainer.outputs: outputs appear whole or not at all, and --overwrite replaces only ours."""

import errno
import json
import os

import pytest
from disk_testing import fill_disk, small_disk
from robust_testing import tree_digest

from bert_trainer import outputs
from bert_trainer.errors import UserError

FILE_KIND = outputs.Kind("demo", "a demo file", directory=False,
                         recognizes=lambda p: open(p).read().startswith("demo"))
DIR_KIND = outputs.Kind("demo", "a demo directory", directory=True,
                        recognizes=lambda p: sorted(os.listdir(p)) == ["result.txt"])


def leftovers(directory) -> list[str]:
    """Hidden temporaries of `outputs` left in `directory`."""
    return [n for n in os.listdir(directory) if ".tmp-" in n or ".old-" in n]


def test_new_file_replaces_only_when_the_block_completes(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError), outputs.new_file(str(path), writing="demo") as f:
        f.write("new, half")
        raise RuntimeError("the model failed")
    assert path.read_text() == "old" and not leftovers(tmp_path)
    with pytest.raises(KeyboardInterrupt), outputs.new_file(str(path), writing="demo") as f:
        f.write("new, half")
        raise KeyboardInterrupt
    assert path.read_text() == "old" and not leftovers(tmp_path)
    with outputs.new_file(str(path), writing="demo") as f:
        f.write("new")
        assert path.read_text() == "old"  # not yet: the new file is written aside
    assert path.read_text() == "new" and not leftovers(tmp_path)


def test_new_file_removes_the_directories_it_made_when_it_fails(tmp_path):
    path = tmp_path / "a" / "b" / "out.txt"
    with pytest.raises(ValueError), outputs.new_file(str(path), writing="demo"):
        raise ValueError
    assert os.listdir(tmp_path) == []


def test_a_refused_write_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    path = tmp_path / "out.txt"
    path.write_text("old")

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / ".x"))

    with pytest.raises(UserError) as e, outputs.new_file(str(path), writing="demo",
                                                         needed_bytes=2_000_000) as f:
        f.write("new")
        monkeypatch.setattr(os, "fsync", refuse)  # the write fails at the end
    message = str(e.value)
    assert message.startswith(f"writing demo to {path} failed: permission denied (needs about "
                              "2.0 MB, ")
    assert "\n" not in message and "make it writable" in message
    assert path.read_text() == "old" and not leftovers(tmp_path)


def test_a_full_disk_is_one_line_and_leaves_nothing():
    with small_disk(256) as disk:
        path = os.path.join(disk, "out.bin")
        with open(path, "wb") as f:
            f.write(b"old")
        fill_disk(disk, leave_bytes=8192)
        with pytest.raises(UserError) as e, outputs.new_file(
                path, writing="demo", needed_bytes=1 << 20, binary=True) as f:
            for _ in range(64):
                f.write(b"\1" * 16384)
        assert str(e.value).startswith(f"writing demo to {path} failed: no space left on the "
                                       "device (needs about 1.0 MB, ")
        assert "free some space and run again" in str(e.value)
        assert open(path, "rb").read() == b"old"
        assert sorted(os.listdir(disk)) == ["filler.bin", "out.bin"]


def test_new_directory_swaps_whole_and_marks_it_ours(tmp_path):
    path = tmp_path / "out"
    with outputs.new_directory(str(path), DIR_KIND, writing="demo") as staging:
        (tmp_path / staging / "result.txt").write_text("1")
        assert not path.exists()
    assert sorted(os.listdir(path)) == [outputs.MARKER, "result.txt"]
    marker = json.loads((path / outputs.MARKER).read_text())
    assert marker == {"command": "demo", "kind": "a demo directory", "entries": ["result.txt"]}
    before = tree_digest(path)
    with pytest.raises(KeyboardInterrupt), outputs.new_directory(
            str(path), DIR_KIND, writing="demo") as staging:
        (tmp_path / staging / "result.txt").write_text("2")
        raise KeyboardInterrupt
    assert tree_digest(path) == before and not leftovers(tmp_path)
    with outputs.new_directory(str(path), DIR_KIND, writing="demo") as staging:
        (tmp_path / staging / "result.txt").write_text("3")
    assert (path / "result.txt").read_text() == "3" and not leftovers(tmp_path)


@pytest.mark.parametrize("failing_rename", [1, 2, 3])
def test_replace_files_puts_the_old_set_back_when_interrupted(tmp_path, monkeypatch,
                                                               failing_rename):
    old = [tmp_path / "summary.json", tmp_path / "s-0", tmp_path / "s-1"]
    for i, p in enumerate(old):
        p.write_text(f"old {i}")
    staged = tmp_path / "staging"
    staged.mkdir()
    for name in ("s-0", "summary.json"):
        (staged / name).write_text("new")
    before = tree_digest(tmp_path)
    real_rename, calls = os.rename, []

    def rename(src, dst):
        calls.append(src)
        if len(calls) == len(old) + failing_rename:  # old set aside, then the n-th new one
            raise KeyboardInterrupt
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    new = [(str(staged / "s-0"), str(tmp_path / "s-0")),
           (str(staged / "summary.json"), str(tmp_path / "summary.json"))]
    if failing_rename > len(new):
        outputs.replace_files(new, [str(p) for p in old])
        assert sorted(os.listdir(tmp_path)) == ["s-0", "staging", "summary.json"]
        assert (tmp_path / "summary.json").read_text() == "new"
        return
    with pytest.raises(KeyboardInterrupt):
        outputs.replace_files(new, [str(p) for p in old])
    assert tree_digest(tmp_path) == before


def test_check_output_refuses_what_it_may_not_replace(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "bert_train.json").write_text("{}")
    with pytest.raises(UserError, match=rf"^--output={run}/x.txt is inside the model directory "
                       rf"{run}, which belongs to the run that made it"):
        outputs.check_output(str(run / "x.txt"), FILE_KIND, overwrite=True)
    mine = tmp_path / "mine.txt"
    mine.write_text("my notes")
    with pytest.raises(UserError, match=rf"^--output={mine} exists; choose another path or "
                       "pass --overwrite$"):
        outputs.check_output(str(mine), FILE_KIND, overwrite=False)
    with pytest.raises(UserError, match=rf"^--output={mine} is not a demo file, so --overwrite "
                       "does not replace it"):
        outputs.check_output(str(mine), FILE_KIND, overwrite=True)
    demo = tmp_path / "demo.txt"
    demo.write_text("demo output")
    assert outputs.check_output(str(demo), FILE_KIND, overwrite=True) == str(demo)
    with pytest.raises(UserError, match=rf"^--output={tmp_path} is a directory; give a file"):
        outputs.check_output(str(tmp_path), FILE_KIND, overwrite=True)
    with pytest.raises(UserError, match=rf"^--output={run} holds bert_train.json \(not a demo "
                       "directory\\), so --overwrite does not replace it"):
        outputs.check_output(str(run), DIR_KIND, overwrite=True)
    with pytest.raises(UserError, match=rf"^--output={mine} is a file; give a directory"):
        outputs.check_output(str(mine), DIR_KIND, overwrite=True)


def test_overwrite_of_a_directory_needs_our_marker_and_nothing_else(tmp_path):
    path = tmp_path / "out"
    with outputs.new_directory(str(path), DIR_KIND, writing="demo") as staging:
        os.mkdir(os.path.join(staging, "sub"))
    with pytest.raises(UserError, match=r"exists and is not empty; choose a new directory or "
                       "pass --overwrite$"):
        outputs.check_output(str(path), DIR_KIND, overwrite=False)
    assert outputs.check_output(str(path), DIR_KIND, overwrite=True) == str(path)
    (path / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match=rf"^--output={path} holds notes.txt besides what "
                       "bert-train demo wrote there; move them"):
        outputs.check_output(str(path), DIR_KIND, overwrite=True)
    other = outputs.Kind("other", "another output", directory=True)
    with pytest.raises(UserError, match=r"holds .bert-train-output.json, notes.txt, sub/ \(not "
                       "another output\\)"):
        outputs.check_output(str(path), other, overwrite=True)
    legacy = tmp_path / "legacy"  # made before markers: recognized by its content
    legacy.mkdir()
    (legacy / "result.txt").write_text("1")
    assert outputs.check_output(str(legacy), DIR_KIND, overwrite=True) == str(legacy)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert outputs.check_output(str(empty), DIR_KIND, overwrite=False) == str(empty)


def test_an_unwritable_directory_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    # As root, permission bits do not stop writes: os.access answers as for a normal user.
    locked = os.path.realpath(tmp_path)
    real_access = os.access
    monkeypatch.setattr(outputs.os, "access", lambda p, mode, **kw: (
        False if os.path.realpath(p) == locked else real_access(p, mode, **kw)))
    with pytest.raises(UserError, match=rf"^--output={tmp_path}/new/x.txt: {tmp_path} is not "
                       "writable; make it writable or choose another path$"):
        outputs.check_output(str(tmp_path / "new" / "x.txt"), FILE_KIND, overwrite=False)
