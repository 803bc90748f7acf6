"""The demo's fine-tuning task: which standard-library package does a docstring sentence come from?

Every Python installation carries it, so `make demo` fine-tunes on real text with no download.
The sentences are the prose of the docstrings and comments of five packages (asyncio, email,
importlib, unittest, xml), cleaned exactly as `demo_corpus` cleans the pretraining corpus; the
label is the package, real metadata rather than a made-up rule. Each package writes about its
own subject (event loops, message headers, module loaders, test cases, XML trees), so the task
is learnable, yet many sentences are short and generic ("Return the result."), so it is not
trivial.

Held-out means unseen: the dev set is whole *modules* (source files) that contribute no
sentence to training, about `DEV_FRACTION` of each package's sentences. A dev sentence that
also occurs in a training module (or in two packages) is dropped, and the demo passes its
pretraining text through `write_pretraining_corpus`, which removes every dev sentence, so the
model never reads a dev sentence before it is evaluated on it.

The files are TSV with a `text<TAB>label` header (what `bert-train finetune
--task=classification` reads by default), rows shuffled with a fixed seed.
"""

import collections
import dataclasses
import json
import os
import random
import zlib

from bert_trainer.demo import corpus as demo_corpus
from bert_trainer.errors import UserError

PACKAGES = ("asyncio", "email", "importlib", "unittest", "xml")
DEV_FRACTION = 0.2
TRAIN_FILE = "train.tsv"
DEV_FILE = "dev.tsv"
STATS_FILE = "task.json"
# A module whose sentences would push the dev share past this multiple of its target stays
# in training: one big file must not take half a package.
_MAX_DEV_OVERSHOOT = 1.5
SHUFFLE_SEED = 0


@dataclasses.dataclass(frozen=True)
class DemoTask:
    """The files written by `build_demo_task` and what they hold.

    Attributes:
      train_file, dev_file: TSV paths (`text<TAB>label`, header row).
      label_names: the packages, sorted (the class order `with_labels_from` reads back).
      train_counts, dev_counts: label -> number of sentences.
      dev_modules: label -> the held-out module paths (relative to the package's parent).
      majority_label: the most frequent training label.
      majority_accuracy: dev accuracy of always predicting `majority_label`: the baseline
        that a trained model must beat for its accuracy to mean anything.
    """

    train_file: str
    dev_file: str
    label_names: tuple[str, ...]
    train_counts: dict
    dev_counts: dict
    dev_modules: dict
    majority_label: str
    majority_accuracy: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def load(cls, output_dir: str) -> "DemoTask":
        """The `DemoTask` that `build_demo_task(output_dir)` wrote to its task.json."""
        with open(os.path.join(output_dir, STATS_FILE), encoding="utf-8") as f:
            fields = json.load(f)
        return cls(**{**fields, "label_names": tuple(fields["label_names"])})


def module_sentences(package: str) -> dict[str, list[str]]:
    """The prose sentences of each source file of a standard-library package.

    Args:
      package: an importable standard-library package, e.g. "email".

    Returns:
      {module path relative to the package's parent, e.g. "email/utils.py": sentences},
      in file order; a sentence is one line (whitespace collapsed, so it fits a TSV cell).

    Raises:
      UserError: the package has no Python source (unknown, built in, or a C extension).
    """
    # demo_corpus owns the parsing and cleaning; its per-file helpers are reused (not
    # copied) so the task and the pretraining corpus see identical sentences.
    files = demo_corpus._module_files(package)  # noqa: SLF001
    if not files:
        raise UserError(f"package {package!r} has no Python source in this installation; "
                        f"choose standard-library packages such as {', '.join(PACKAGES)}")
    common = os.path.commonpath(files)
    # Names start with the package ("email/utils.py"), so they are unique across packages.
    parent = os.path.dirname(common) if os.path.isdir(common) else os.path.dirname(files[0])
    out = {}
    for path in files:
        name = os.path.relpath(path, parent)
        # A fresh `seen` per file: the paragraph dedup is applied across the task below.
        sentences = demo_corpus._sentences(demo_corpus._file_paragraphs(path), set())  # noqa: SLF001
        out[name.replace(os.sep, "/")] = [" ".join(s.split()) for s in sentences]
    return out


def split_modules(counts: dict[str, int], dev_fraction: float) -> list[str]:
    """Picks the held-out modules of one package: about `dev_fraction` of its sentences.

    Modules are visited in the order of a hash of their name (stable across runs and
    machines, unlike `hash()`), and each is held out while the dev share is below target,
    unless it alone would overshoot it by more than half.

    Args:
      counts: module name -> number of sentences.
      dev_fraction: target share of the sentences in dev, in (0, 1).

    Returns:
      The held-out module names, sorted.
    """
    target = dev_fraction * sum(counts.values())
    dev, taken = [], 0
    for name in sorted(counts, key=lambda n: (zlib.crc32(n.encode()), n)):
        n = counts[name]
        if n and taken < target and taken + n <= _MAX_DEV_OVERSHOOT * target:
            dev.append(name)
            taken += n
    return sorted(dev)


def build_demo_task(output_dir: str, packages=PACKAGES,
                    dev_fraction: float = DEV_FRACTION) -> DemoTask:
    """Writes train.tsv, dev.tsv and task.json (the `DemoTask`) to `output_dir`.

    Args:
      output_dir: created if missing.
      packages: standard-library packages; each is one class.
      dev_fraction: share of each package's sentences held out (whole modules).

    Returns:
      The `DemoTask`.

    Raises:
      UserError: fewer than two packages, a bad fraction, a package without source, or one
        whose modules cannot be split into train and dev.
    """
    if len(set(packages)) < 2:
        raise UserError(f"packages={list(packages)}: the demo task needs at least 2 distinct "
                        "packages (classes)")
    if not 0 < dev_fraction < 1:
        raise UserError(f"dev_fraction={dev_fraction} must be in (0, 1), e.g. {DEV_FRACTION}")
    train, dev, dev_modules = [], [], {}
    for package in sorted(set(packages)):
        by_module = module_sentences(package)
        held_out = split_modules({m: len(s) for m, s in by_module.items()}, dev_fraction)
        if not held_out or len(held_out) == sum(1 for s in by_module.values() if s):
            raise UserError(f"package {package!r} has too few modules with prose to hold some "
                            "out; choose a package with more source files")
        dev_modules[package] = held_out
        for module, sentences in by_module.items():
            (dev if module in held_out else train).extend((s, package) for s in sentences)
    train, dev = _deduplicated(train, dev)
    # Rows come grouped by package; shuffled (with a fixed seed, so the files repeat exactly),
    # the first N rows of a file (--max_eval_examples=N) are a fair sample of every class.
    for rows in (train, dev):
        random.Random(SHUFFLE_SEED).shuffle(rows)
    os.makedirs(output_dir, exist_ok=True)
    task = _describe(output_dir, train, dev, dev_modules)
    _write_tsv(task.train_file, train)
    _write_tsv(task.dev_file, dev)
    with open(os.path.join(output_dir, STATS_FILE), "w", encoding="utf-8") as f:
        json.dump(task.to_json(), f, indent=2)
    return task


def _deduplicated(train: list, dev: list) -> tuple[list, list]:
    """Drops sentences that carry two labels, repeats, and dev sentences also in train."""
    labels = collections.defaultdict(set)
    for sentence, label in train + dev:
        labels[sentence].add(label)
    seen = set()
    out = []
    for rows in (train, dev):
        kept = []
        for sentence, label in rows:
            # Generic sentences ("Return the result.") occur in several packages: no label.
            if len(labels[sentence]) == 1 and sentence not in seen:
                seen.add(sentence)
                kept.append((sentence, label))
        out.append(kept)
    return out[0], out[1]


def _describe(output_dir: str, train: list, dev: list, dev_modules: dict) -> DemoTask:
    train_counts = collections.Counter(label for _, label in train)
    dev_counts = collections.Counter(label for _, label in dev)
    if not dev:
        raise UserError("the demo task's dev set is empty; hold out more (dev_fraction)")
    majority = max(sorted(train_counts), key=train_counts.__getitem__)
    return DemoTask(
        train_file=os.path.join(output_dir, TRAIN_FILE),
        dev_file=os.path.join(output_dir, DEV_FILE),
        label_names=tuple(sorted(train_counts)),
        train_counts=dict(sorted(train_counts.items())),
        dev_counts=dict(sorted(dev_counts.items())), dev_modules=dev_modules,
        majority_label=majority, majority_accuracy=dev_counts[majority] / len(dev))


def _write_tsv(path: str, rows: list) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("text\tlabel\n")
        f.writelines(f"{sentence}\t{label}\n" for sentence, label in rows)


def read_tsv_sentences(path: str) -> list[str]:
    """The `text` column of a TSV written by `build_demo_task` (header skipped)."""
    with open(path, encoding="utf-8") as f:
        return [line.split("\t", 1)[0] for line in f.read().splitlines()[1:]]


def write_pretraining_corpus(corpus: str, train_output: str, eval_output: str, *,
                             exclude=(), eval_every: int = 20) -> dict:
    """Splits a one-sentence-per-line corpus into pretraining train and eval text by document.

    Args:
      corpus: google-research/bert format (a blank line between documents), e.g. from
        `demo_corpus.build_demo_corpus`.
      train_output, eval_output: the text files to write (same format).
      exclude: sentences to drop everywhere (the fine-tuning dev sentences), compared after
        collapsing whitespace.
      eval_every: every this-many-th document (the first included) goes to eval.

    Returns:
      dict: train_documents, eval_documents, train_sentences, eval_sentences, excluded.

    Raises:
      UserError: `eval_every` < 2, or the corpus is too small to give both splits.
    """
    if eval_every < 2:
        raise UserError(f"eval_every={eval_every} must be >= 2 (1 would leave no training text)")
    excluded = {" ".join(s.split()) for s in exclude}
    stats = dict.fromkeys(("train_documents", "eval_documents", "train_sentences",
                           "eval_sentences", "excluded"), 0)
    with open(corpus, encoding="utf-8") as f:
        documents = [d.splitlines() for d in f.read().split("\n\n") if d.strip()]
    outputs = {"train": [], "eval": []}
    for i, lines in enumerate(documents):
        kept = [line for line in lines if " ".join(line.split()) not in excluded]
        stats["excluded"] += len(lines) - len(kept)
        if len(kept) < 2:  # A document needs two sentences to give a next-sentence pair.
            continue
        split = "eval" if i % eval_every == 0 else "train"
        outputs[split].append("\n".join(kept) + "\n\n")
        stats[f"{split}_documents"] += 1
        stats[f"{split}_sentences"] += len(kept)
    if not stats["train_documents"] or not stats["eval_documents"]:
        raise UserError(f"{corpus}: {len(documents)} documents are too few to split into "
                        f"train and eval every {eval_every}; give a larger corpus")
    for path, texts in ((train_output, outputs["train"]), (eval_output, outputs["eval"])):
        if os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.writelines(texts)
    return stats
