"""The demo's fine-tuning task: real labels, held-out modules, no dev sentence leaks."""

import pytest

from bert_trainer.demo import task as demo_task
from bert_trainer.errors import UserError

# Two small packages keep the build fast; the demo itself uses demo_task.PACKAGES.
SMALL_PACKAGES = ("concurrent", "json")


def _rows(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert lines[0] == "text\tlabel"
    rows = [line.split("\t") for line in lines[1:]]
    assert all(len(row) == 2 for row in rows), "every row is exactly text<TAB>label"
    return rows


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo_task")
    return demo_task.build_demo_task(str(out), packages=SMALL_PACKAGES), out


def test_module_sentences_are_one_line_prose_named_by_package():
    by_module = demo_task.module_sentences("json")
    assert "json/decoder.py" in by_module and "json/__init__.py" in by_module
    sentences = [s for group in by_module.values() for s in group]
    assert len(sentences) > 30
    assert all("\t" not in s and "\n" not in s and s == " ".join(s.split()) for s in sentences)
    assert all(len(s.split()) >= 3 for s in sentences)  # demo_corpus's minimum sentence length


def test_split_modules_skips_a_module_that_would_overshoot_the_target():
    # Target 10 of 100 sentences; the 90-sentence module alone would be 9x the target.
    dev = demo_task.split_modules({"big.py": 90, "a.py": 5, "b.py": 5}, 0.1)
    assert "big.py" not in dev and dev
    assert sum({"a.py": 5, "b.py": 5}[m] for m in dev) <= 15


def test_split_modules_is_deterministic_and_near_the_fraction():
    counts = {f"m{i}.py": 10 + i for i in range(30)}  # 735 sentences
    dev = demo_task.split_modules(counts, 0.2)
    assert dev == demo_task.split_modules(dict(reversed(counts.items())), 0.2)
    share = sum(counts[m] for m in dev) / sum(counts.values())
    assert 0.2 <= share <= 0.3, share


def test_build_writes_labelled_files_whose_counts_match(built):
    task, out = built
    assert demo_task.DemoTask.load(str(out)) == task
    assert task.label_names == ("concurrent", "json")
    for path, counts in ((task.train_file, task.train_counts), (task.dev_file, task.dev_counts)):
        rows = _rows(path)
        assert {label for _, label in rows} <= set(task.label_names)
        assert {k: sum(label == k for _, label in rows) for k in counts} == counts
    dev_total = sum(task.dev_counts.values())
    assert task.majority_accuracy == pytest.approx(task.dev_counts[task.majority_label]
                                                   / dev_total)
    assert task.majority_label == max(task.train_counts, key=task.train_counts.get)


def test_rows_are_shuffled_so_a_prefix_samples_every_class(built):
    task, _ = built
    for path in (task.train_file, task.dev_file):
        assert {label for _, label in _rows(path)[:15]} == set(task.label_names), path


def test_dev_is_held_out_modules_and_never_in_train(built):
    task, _ = built
    train = {text for text, _ in _rows(task.train_file)}
    dev = _rows(task.dev_file)
    assert not train & {text for text, _ in dev}
    for package in SMALL_PACKAGES:
        by_module = demo_task.module_sentences(package)
        held_out = task.dev_modules[package]
        assert held_out and set(held_out) < set(by_module)
        allowed = {s for m in held_out for s in by_module[m]}
        assert {text for text, label in dev if label == package} <= allowed


def test_build_is_deterministic(built, tmp_path):
    task, _ = built
    again = demo_task.build_demo_task(str(tmp_path), packages=SMALL_PACKAGES)
    for first, second in ((task.train_file, again.train_file), (task.dev_file, again.dev_file)):
        with open(first, "rb") as a, open(second, "rb") as b:
            assert a.read() == b.read()


def test_write_pretraining_corpus_splits_documents_and_drops_excluded(tmp_path):
    docs = [[f"Document {d} sentence {s} is here." for s in range(3)] for d in range(6)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join("\n".join(d) + "\n\n" for d in docs))
    # Doc 1 loses two of its three sentences (too short for a pair: dropped); doc 4 loses one.
    exclude = [docs[1][0], docs[1][1], "  " + docs[4][2].replace(" ", "   ") + " "]
    stats = demo_task.write_pretraining_corpus(
        str(corpus), str(tmp_path / "t.txt"), str(tmp_path / "e.txt"), exclude=exclude,
        eval_every=3)
    assert stats == {"train_documents": 3, "eval_documents": 2, "train_sentences": 8,
                     "eval_sentences": 6, "excluded": 3}
    eval_docs = (tmp_path / "e.txt").read_text().split("\n\n")
    assert eval_docs[0].splitlines() == docs[0] and eval_docs[1].splitlines() == docs[3]
    train_text = (tmp_path / "t.txt").read_text()
    assert docs[4][2] not in train_text and docs[4][1] in train_text
    assert "Document 1 " not in train_text


@pytest.mark.parametrize("call, message", [
    (lambda d: demo_task.build_demo_task(d, packages=("json", "json")), "at least 2"),
    (lambda d: demo_task.build_demo_task(d, dev_fraction=1.0), "dev_fraction=1.0"),
    (lambda d: demo_task.module_sentences("no_such_package_xyz"), "no_such_package_xyz"),
    (lambda d: demo_task.build_demo_task(d, packages=("json", "tomllib", "argparse")),
     "'argparse' has too few modules"),
])
def test_bad_input_is_a_one_line_user_error(tmp_path, call, message):
    with pytest.raises(UserError, match=message) as info:
        call(str(tmp_path))
    assert "\n" not in str(info.value)
