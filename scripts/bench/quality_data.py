"""The pretraining-quality benchmark's data: one corpus, one vocabulary, one set of sequences.

Made once per work directory with bert-train's own commands (`vocab`,
`create_pretraining_data`), then exported as arrays, so that every system trains on the same
token sequences and is scored on the same masked held-out examples:

- text: ../shared/data/corpus (public-domain prose) and IMDB's training reviews, one sentence
  a line and a blank line after each review; the last `eval_reviews` reviews are held out;
- vocab.txt: a WordPiece vocabulary learned from the training text (`bert-train vocab`);
- train-*.tfrecord / eval-*.tfrecord: `bert-train create_pretraining_data` at `seq_length`
  (masked on the fly by bert-train's pipeline);
- train.npz: the training sequences' `input_word_ids`, `input_mask`, `input_type_ids`
  (PyTorch and keras-hub mask them their own way);
- eval.npz: the held-out sequences masked once by bert-train's pipeline (seed 1): the masked
  inputs, `masked_lm_positions`, `masked_lm_ids`, `masked_lm_weights`, for every scorer.
"""

import csv
import dataclasses
import os
import pathlib
import re
import subprocess
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
BREAK = re.compile(r"<br\s*/?>", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Data:
    """Where the prepared files are, and the vocabulary size."""

    vocab_file: str
    vocab_size: int
    train_glob: str
    eval_glob: str
    train_npz: str
    eval_npz: str


def review_text(review: str) -> str:
    """An IMDB review as a document: one sentence a line, then a blank line."""
    sentences = [s.strip() for s in SENTENCE_END.split(BREAK.sub(" ", review)) if s.strip()]
    return "".join(s + "\n" for s in sentences) + "\n"


def write_reviews(tsv: str, train_out: str, eval_out: str, *, eval_reviews: int,
                  max_reviews: int | None) -> tuple[int, int]:
    """Splits IMDB's `sentence<TAB>label` file into training and held-out text files.

    Returns:
      (training reviews, held-out reviews) written.
    """
    csv.field_size_limit(1 << 24)
    with open(tsv, encoding="utf-8", newline="") as f:
        reviews = [row["sentence"] for row in csv.DictReader(f, delimiter="\t",
                                                              quoting=csv.QUOTE_NONE)]
    held_out, train = reviews[-eval_reviews:], reviews[:-eval_reviews]
    if max_reviews is not None:
        train = train[:max_reviews]
    for path, part in ((train_out, train), (eval_out, held_out)):
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.writelines(review_text(r) for r in part)
        os.replace(path + ".tmp", path)
    return len(train), len(held_out)


def bert_train(*args: str, log) -> None:
    """Runs `bert-train ARGS` (this interpreter's) and fails loudly when it fails."""
    command = [sys.executable, "-m", "bert_trainer.cli", *args]
    log("$ bert-train " + " ".join(args))
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"bert-train {args[0]} failed ({done.returncode}): "
                           f"{done.stderr.strip().splitlines()[-1:]}")


def prepare(workdir: str, *, corpus_glob: str, imdb_file: str, vocab_size: int,
            seq_length: int, max_predictions: int, eval_reviews: int,
            max_reviews: int | None, max_eval_examples: int, log=print) -> Data:
    """Makes (or reuses, when already complete) the benchmark's data in `workdir/data`."""
    root = os.path.join(workdir, "data")
    os.makedirs(root, exist_ok=True)
    train_text, eval_text = (os.path.join(root, n) for n in ("imdb_train.txt", "imdb_eval.txt"))
    vocab = os.path.join(root, "vocab.txt")
    data = Data(vocab, 0, os.path.join(root, "records", "train-*.tfrecord"),
                os.path.join(root, "records", "eval-*.tfrecord"),
                os.path.join(root, "train.npz"), os.path.join(root, "eval.npz"))
    if not os.path.exists(eval_text):
        counts = write_reviews(imdb_file, train_text, eval_text, eval_reviews=eval_reviews,
                               max_reviews=max_reviews)
        log(f"IMDB reviews: {counts[0]} for training, {counts[1]} held out")
    train_inputs = f"{corpus_glob},{train_text}"
    if not os.path.exists(vocab):
        bert_train("vocab", f"--input={train_inputs}", f"--vocab_size={vocab_size}",
                   "--encoding_errors=replace", f"--output={vocab}", log=log)
    for split, inputs in (("train", train_inputs), ("eval", eval_text)):
        pattern = data.train_glob if split == "train" else data.eval_glob
        if not list(pathlib.Path(pattern).parent.glob(pathlib.Path(pattern).name)):
            bert_train("create_pretraining_data", f"--input={inputs}", f"--vocab={vocab}",
                       f"--output={pattern}", f"--max_seq_length={seq_length}",
                       "--num_shards=2" if split == "train" else "--num_shards=1", "--seed=1",
                       "--encoding_errors=replace", log=log)
    if not os.path.exists(data.train_npz):
        _save(data.train_npz, sequences(data.train_glob, seq_length))
    if not os.path.exists(data.eval_npz):
        _save(data.eval_npz, masked_examples(data.eval_glob, vocab, seq_length, max_predictions,
                                             max_eval_examples))
    with open(vocab, encoding="utf-8") as f:
        size = sum(1 for _ in f)
    return dataclasses.replace(data, vocab_size=size)


def _save(path: str, arrays: dict) -> None:
    with open(path + ".tmp", "wb") as f:
        np.savez(f, **arrays)
    os.replace(path + ".tmp", path)


def sequences(pattern: str, seq_length: int) -> dict[str, np.ndarray]:
    """Every record's encoder inputs, int32 `[examples, seq_length]` each, in file order."""
    import tensorflow as tf  # noqa: PLC0415

    from bert_trainer import features  # noqa: PLC0415

    spec = {name: tf.io.FixedLenFeature([seq_length], tf.int64)
            for name in features.ENCODER_INPUTS}
    files = sorted(tf.io.gfile.glob(pattern))
    dataset = tf.data.TFRecordDataset(files).batch(4096).map(
        lambda s: tf.io.parse_example(s, spec))
    parts = {name: [] for name in features.ENCODER_INPUTS}
    for batch in dataset.as_numpy_iterator():
        for name in parts:
            parts[name].append(batch[name].astype(np.int32))
    return {name: np.concatenate(values) for name, values in parts.items()}


def masked_examples(pattern: str, vocab: str, seq_length: int, max_predictions: int,
                    limit: int) -> dict[str, np.ndarray]:
    """The first `limit` held-out examples masked once by bert-train's pipeline (seed 1)."""
    from bert_trainer import features  # noqa: PLC0415
    from bert_trainer.tasks.masked_lm import data as masked_lm_data  # noqa: PLC0415

    dataset = masked_lm_data.pretraining_dataset(
        pattern, seq_length=seq_length, max_predictions_per_seq=max_predictions,
        batch_size=256, vocab=vocab, is_training=False, masking="dynamic", seed=1,
        deterministic=True, use_next_sentence_label=False)
    names = (*features.ENCODER_INPUTS, features.MASKED_LM_POSITIONS, features.MASKED_LM_IDS,
             features.MASKED_LM_WEIGHTS)
    parts = {name: [] for name in names}
    count = 0
    for batch in dataset.as_numpy_iterator():
        for name in names:
            parts[name].append(batch[name])
        count += len(batch[names[0]])
        if count >= limit:
            break
    return {name: np.concatenate(values)[:limit] for name, values in parts.items()}
