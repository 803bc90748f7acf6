"""The domain-adaptation benchmark's data and its one fine-tuning recipe.

IMDB's training reviews (`sentence<TAB>label`, ../shared/data/imdb/train.tsv) are split once:
the LAST `held_out` reviews are held out (neither pretraining nor fine-tuning sees them; they
are the test set); of the rest, the first `labelled` reviews are the fine-tuning set, and all
of the rest (the labelled ones included: their text, not their labels, as in Gururangan et
al.'s task-adaptive pretraining) are the continued-pretraining text. Made in `workdir/data`:

- pretrain.txt: the pretraining reviews, one sentence a line, a blank line after each review;
- records/train-*.tfrecord: `bert-train create_pretraining_data` at `seq_length` with the
  published model's vocabulary (masked on the fly by bert-train's pipeline);
- train.npz: the same sequences as arrays, which PyTorch masks its own way (same tokens);
- finetune_train.tsv, held_out.tsv: `sentence<TAB>label` files for `bert-train finetune`.
"""

import csv
import dataclasses
import json
import os
import pathlib
import statistics
import subprocess
import sys

from bench import quality_data

REPO = pathlib.Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class Data:
    train_glob: str
    train_npz: str
    finetune_file: str
    held_out_file: str
    counts: dict  # pretraining, labelled and held-out reviews


@dataclasses.dataclass(frozen=True)
class FinetuneRecipe:
    """One fine-tune for every system: `bert-train finetune --task=imdb` on the labelled
    reviews, scored on the held-out ones."""

    steps: int
    learning_rate: float
    batch_size: int
    seq_length: int
    long_texts: str
    seeds: tuple[int, ...]


def read_reviews(tsv: str) -> list[tuple[str, str]]:
    """(review, label) rows of IMDB's `sentence<TAB>label` file, in file order."""
    csv.field_size_limit(1 << 24)
    with open(tsv, encoding="utf-8", newline="") as f:
        return [(r["sentence"], r["label"])
                for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]


def split(rows: list, *, held_out: int, labelled: int, max_pretrain: int | None):
    """(pretraining rows, labelled rows, held-out rows): the last `held_out` rows are held
    out; the labelled rows are the first `labelled` of the rest; pretraining reads the rest
    (at most `max_pretrain` rows), never a held-out one."""
    if held_out + labelled > len(rows):
        raise ValueError(f"{len(rows)} reviews cannot give {held_out} held out and "
                         f"{labelled} labelled")
    rest, test = rows[:len(rows) - held_out], rows[len(rows) - held_out:]
    return rest[:max_pretrain], rest[:labelled], test


def _write_tsv(path: str, rows) -> None:
    with open(path + ".tmp", "w", encoding="utf-8", newline="") as f:
        f.write("sentence\tlabel\n")
        f.writelines(f"{' '.join(text.split())}\t{label}\n" for text, label in rows)
    os.replace(path + ".tmp", path)


def prepare(workdir: str, *, imdb_file: str, vocab_file: str, seq_length: int, held_out: int,
            labelled: int, max_pretrain: int | None, log=print) -> Data:
    """Makes (or reuses) the benchmark's data in `workdir/data`."""
    root = os.path.join(workdir, "data")
    os.makedirs(root, exist_ok=True)
    data = Data(os.path.join(root, "records", "train-*.tfrecord"),
                os.path.join(root, "train.npz"), os.path.join(root, "finetune_train.tsv"),
                os.path.join(root, "held_out.tsv"), {})
    counts_file = os.path.join(root, "counts.json")
    text = os.path.join(root, "pretrain.txt")
    if not os.path.exists(counts_file):
        pretrain, train, test = split(read_reviews(imdb_file), held_out=held_out,
                                      labelled=labelled, max_pretrain=max_pretrain)
        _write_tsv(data.finetune_file, train)
        _write_tsv(data.held_out_file, test)
        with open(text + ".tmp", "w", encoding="utf-8") as f:
            f.writelines(quality_data.review_text(r) for r, _ in pretrain)
        os.replace(text + ".tmp", text)
        with open(counts_file, "w") as f:
            json.dump({"pretraining": len(pretrain), "labelled": len(train),
                       "held_out": len(test)}, f)
    with open(counts_file) as f:
        counts = json.load(f)
    log(f"IMDB reviews: {counts['pretraining']} for pretraining, {counts['labelled']} "
        f"labelled, {counts['held_out']} held out")
    records = pathlib.Path(data.train_glob)
    if not list(records.parent.glob(records.name)):
        quality_data.bert_train(
            "create_pretraining_data", f"--input={text}", f"--vocab={vocab_file}",
            f"--output={data.train_glob}", f"--max_seq_length={seq_length}", "--num_shards=2",
            "--seed=1", "--encoding_errors=replace", log=log)
    if not os.path.exists(data.train_npz):
        quality_data._save(data.train_npz, quality_data.sequences(data.train_glob, seq_length))
    return dataclasses.replace(data, counts=counts)


def finetune_command(snapshot: str, data: Data, recipe: FinetuneRecipe,
                     model_dir: str) -> list[str]:
    """`bert-train finetune --task=imdb` from `snapshot` (a model directory, a checkpoint
    prefix or a Hugging Face directory)."""
    return [sys.executable, "-m", "bert_trainer.cli", "finetune", "--task=imdb",
            f"--init_checkpoint={snapshot}", f"--train_file={data.finetune_file}",
            f"--eval_file={data.held_out_file}", f"--model_dir={model_dir}",
            f"--seq_length={recipe.seq_length}", f"--batch_size={recipe.batch_size}",
            f"--learning_rate={recipe.learning_rate}", f"--train_steps={recipe.steps}",
            f"--long_texts={recipe.long_texts}",
            f"--seeds={','.join(map(str, recipe.seeds))}"]


def imdb_accuracy(snapshot: str, data: Data, recipe: FinetuneRecipe, model_dir: str,
                  log_file: str) -> dict:
    """{"mean", "std", "seeds": [held-out accuracy per seed]} of fine-tuning `snapshot`."""
    with open(log_file, "w") as log:
        code = subprocess.run(finetune_command(snapshot, data, recipe, model_dir), cwd=REPO,
                              stdout=log, stderr=subprocess.STDOUT).returncode
    if code:
        raise RuntimeError(f"fine-tuning {snapshot} failed ({code}); see {log_file}")
    with open(os.path.join(model_dir, "eval_results.json"), encoding="utf-8") as f:
        runs = json.load(f)["runs"]
    by_seed = {int(r["seed"]): float(r["metrics"]["accuracy"]) for r in runs}
    values = [by_seed[s] for s in recipe.seeds]
    return {"mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else None, "seeds": values}
