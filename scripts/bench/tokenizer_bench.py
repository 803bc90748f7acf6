"""Tokenizer throughput: bert_trainer's in-graph `Tokenizer` vs the `tokenizers` package.

Both tokenize the same real texts (SST-2 sentences and corpus lines) with the same uncased
vocabulary into word pieces, without [CLS]/[SEP], in batches. With `threads=None` both may use
every core: ours through a parallel `tf.data` map (how the input pipelines run it),
`tokenizers` through its own Rust thread pool (`encode_batch`). With `threads=1` each is held
to one thread, which compares per-core speed and is robust to other load on the machine.
A per-text digest of the ids lets the harness report how often the two agree, which shows
they do the same work.
"""

import os
import zlib

import numpy as np


def read_texts(path: str) -> list[str]:
    """One text per line (the harness writes this file)."""
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def _digest(ids) -> int:
    return zlib.crc32(np.asarray(ids, np.int32).tobytes())


def _build_bert_trainer(vocab: str, texts: list[str], batch_size: int, threads: int | None):
    import tensorflow as tf

    from bert_trainer.data.tokenizer import Tokenizer

    if threads:  # Before TensorFlow creates its thread pools, i.e. before the first op.
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    tokenizer = Tokenizer(vocab, lower_case=True)
    batches = tf.data.Dataset.from_tensor_slices(texts).batch(batch_size)
    if threads:
        options = tf.data.Options()
        options.threading.private_threadpool_size = threads
        batches = batches.with_options(options)
    ragged = tokenizer.tokenize(texts)  # Once, outside the timing, for the parity digests.
    digests = [_digest(row) for row in ragged.numpy()]

    def count_pieces(batch):
        return tf.size(tokenizer.tokenize(batch).flat_values, out_type=tf.int64)

    counts = batches.map(count_pieces, num_parallel_calls=threads or tf.data.AUTOTUNE)

    def run(n: int) -> dict:
        tokens = 0
        for _ in range(n):
            tokens += int(counts.reduce(np.int64(0), lambda total, c: total + c))
        return {"tokens": tokens, "texts": n * len(texts)}

    return digests, run


def _build_tokenizers(vocab: str, texts: list[str], batch_size: int, threads: int | None):
    if threads:  # Read by the Rust side before its thread pool starts / on each batch call.
        os.environ["RAYON_NUM_THREADS"] = str(threads)
        os.environ["TOKENIZERS_PARALLELISM"] = "false" if threads == 1 else "true"
    import tokenizers

    tokenizer = tokenizers.BertWordPieceTokenizer(vocab, lowercase=True)
    batches = [texts[i:i + batch_size] for i in range(0, len(texts), batch_size)]
    digests = [_digest(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False)]

    def run(n: int) -> dict:
        tokens = 0
        for _ in range(n):
            for batch in batches:
                encodings = tokenizer.encode_batch(batch, add_special_tokens=False)
                tokens += sum(len(e.ids) for e in encodings)
        return {"tokens": tokens, "texts": n * len(texts)}

    return digests, run


def build(implementation: str, vocab: str, texts_file: str, batch_size: int = 1024,
          threads: int | None = None):
    """Worker entry point.

    Args:
      implementation: "bert_trainer" or "tokenizers".
      vocab: path of an uncased BERT vocab.txt.
      texts_file: UTF-8 file, one text per line.
      batch_size: texts per tokenizer call.
      threads: None: every core; else at most this many threads.

    Returns:
      (info, run): info holds the number of texts and a crc32 digest of each text's ids;
      run(n) tokenizes every text n times and returns {"tokens", "texts"}.
    """
    texts = read_texts(texts_file)
    builder = {"bert_trainer": _build_bert_trainer, "tokenizers": _build_tokenizers}
    digests, run = builder[implementation](vocab, texts, batch_size, threads)
    return {"texts": len(texts), "digests": digests}, run


def collect_texts(shared_dir, limit: int) -> list[str]:
    """Half SST-2 training sentences, half corpus lines, each evenly spaced; `limit` in all.

    Args:
      shared_dir: pathlib.Path of ../shared (data/sst2/train.tsv and data/corpus/*/*.txt).
      limit: most texts returned.

    Returns:
      Non-empty texts in a fixed order (deterministic): short review sentences, then longer
      lines of books and speeches.
    """
    with open(shared_dir / "data" / "sst2" / "train.tsv", encoding="utf-8") as f:
        next(f)  # Header.
        sentences = [text for line in f if (text := line.split("\t")[0].strip())]
    lines = []
    for path in sorted((shared_dir / "data" / "corpus").glob("*/*.txt")):
        with open(path, encoding="utf-8", errors="replace") as f:
            lines.extend(stripped for line in f if (stripped := line.strip()))
    texts = _evenly(sentences, (limit + 1) // 2)
    return texts + _evenly(lines, limit - len(texts))


def _evenly(items: list, count: int) -> list:
    """`count` items spread evenly over `items` (all of them if there are fewer)."""
    if count >= len(items):
        return list(items)
    return [items[i * len(items) // count] for i in range(count)]
