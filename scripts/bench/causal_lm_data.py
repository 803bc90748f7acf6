"""The causal-LM benchmark's data: corpus documents, a held-out split, packed token blocks.

The packing follows bert-train's causal-LM convention: the documents' word pieces go into one
stream with one `[SEP]` before each document,

    [SEP] doc1 [SEP] doc2 [SEP] doc3 ...

cut into blocks of `block_size` tokens (documents may span blocks; the final partial block is
dropped). A model sees a whole block and is scored at every position but the last, on the
token that follows. Every `holdout_every`-th document (in corpus order) is held out, so the
held-out blocks are text no model trained on; the vocabulary is learned from the training
documents only.
"""

import os

import numpy as np

from bert_trainer.data import text_corpus
from bert_trainer.data.tokenizer import Tokenizer
from bert_trainer.data.vocab import learn_vocab

TOKENIZE_BATCH = 256  # Documents per Tokenizer call.


def read_documents(corpus_dir: str, max_documents: int = 0) -> list[str]:
    """Every document of the corpus's text files (sorted paths), each as one string.

    Args:
      corpus_dir: a directory of text files, one level of subdirectories deep
        (../shared/data/corpus).
      max_documents: the first N documents only (0: all).

    Returns:
      Documents, their sentences joined by spaces.
    """
    paths = text_corpus.expand_inputs(os.path.join(corpus_dir, "*", "*.txt"))
    documents = []
    for sentences in text_corpus.read_documents(paths, input_format="auto",
                                                encoding_errors="replace"):
        documents.append(" ".join(sentences))
        if max_documents and len(documents) >= max_documents:
            break
    return documents


def split(documents: list[str], holdout_every: int) -> tuple[list[str], list[str]]:
    """(training documents, held-out documents): every `holdout_every`-th one is held out."""
    held = [d for i, d in enumerate(documents) if i % holdout_every == holdout_every - 1]
    train = [d for i, d in enumerate(documents) if i % holdout_every != holdout_every - 1]
    return train, held


def vocab_sample(documents: list[str], max_chars: int) -> list[str]:
    """Every k-th document, k the smallest that keeps the sample within `max_chars` (0: all).

    Spread over the whole corpus, so every source (books, speeches, the Bible) is in it.
    """
    total = sum(len(d) for d in documents)
    stride = 1 if not max_chars or total <= max_chars else -(-total // max_chars)
    return documents[::stride]


def learn(documents: list[str], vocab_size: int, workdir: str, max_chars: int = 0) -> str:
    """Learns an uncased WordPiece vocabulary from `documents` (a `vocab_sample` of at most
    `max_chars` characters); returns the vocab.txt path."""
    text = os.path.join(workdir, "vocab_input.txt")
    with open(text, "w", encoding="utf-8") as f:
        for document in vocab_sample(documents, max_chars):
            f.write(document + "\n")
    output = os.path.join(workdir, "vocab.txt")
    learn_vocab(text, vocab_size, output, lower_case=True, progress=None, overwrite=True)
    return output


def pack(tokenizer: Tokenizer, documents: list[str], block_size: int) -> np.ndarray:
    """[SEP] doc [SEP] doc ... cut into [num_blocks, block_size] int32 (the rest dropped)."""
    stream = []
    for start in range(0, len(documents), TOKENIZE_BATCH):
        pieces = tokenizer.tokenize(documents[start:start + TOKENIZE_BATCH]).to_list()
        for ids in pieces:
            stream.append(tokenizer.sep_id)
            stream.extend(ids)
    num_blocks = len(stream) // block_size
    return np.asarray(stream[:num_blocks * block_size], np.int32).reshape(num_blocks, block_size)


def prepare(corpus_dir: str, workdir: str, *, block_size: int, vocab_size: int,
            holdout_every: int, vocab_file: str | None = None, max_documents: int = 0,
            vocab_sample_chars: int = 0) -> dict:
    """Reads, splits, (learns a vocabulary,) tokenizes and packs; saves the blocks.

    Returns:
      {"train_file", "heldout_file" (.npy of blocks), "vocab_file", "vocab_size",
       "documents": {"train", "heldout"}, "blocks": {"train", "heldout"}}.
    """
    train_docs, held_docs = split(read_documents(corpus_dir, max_documents), holdout_every)
    if not train_docs or not held_docs:
        raise ValueError(f"{corpus_dir}: too few documents to hold one in {holdout_every} out")
    vocab_file = vocab_file or learn(train_docs, vocab_size, workdir, vocab_sample_chars)
    tokenizer = Tokenizer(vocab_file, lower_case=True)
    out = {"vocab_file": vocab_file, "vocab_size": tokenizer.vocab_size,
           "documents": {"train": len(train_docs), "heldout": len(held_docs)}, "blocks": {}}
    for name, docs in (("train", train_docs), ("heldout", held_docs)):
        blocks = pack(tokenizer, docs, block_size)
        out[f"{name}_file"] = os.path.join(workdir, f"{name}_blocks.npy")
        np.save(out[f"{name}_file"], blocks)
        out["blocks"][name] = len(blocks)
    return out


def batches_forever(blocks: np.ndarray, batch_size: int, seed: int):
    """Shuffled batches of whole blocks, reshuffled every epoch; yields [batch, block] int32."""
    if len(blocks) < batch_size:
        raise ValueError(f"{len(blocks)} training blocks cannot fill a batch of {batch_size}")
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(blocks))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            yield blocks[order[start:start + batch_size]]
