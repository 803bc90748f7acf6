"""The chunks every corpus writer works on: read, tokenized, counted, and their randomness.

`create_pretraining_data` cuts the corpus into chunks of consecutive documents (`read_chunks`)
and turns each into records on its own (on worker processes, see `chunk_workers`, or a Beam
pipeline, see `data.beam`). What an objective makes of a chunk is its corpus writer's (the
objective's family passes its functions in); what the writers share is here: the chunk's
sentences tokenized in a few in-graph calls, its counts, and its random generator, a function
of the seed and the chunk's index only, so the output does not depend on who made the chunk.
"""

import collections
import hashlib
import itertools
import random

from bert_trainer.data.tokenizer import Tokenizer

_TOKENIZE_BATCH = 4096  # Sentences per in-graph tokenizer call.


def read_chunks(documents, chunk_documents: int):
    """(index, list of `chunk_documents` documents) for consecutive pieces of `documents`."""
    return enumerate(iter(lambda: list(itertools.islice(documents, chunk_documents)), []))


def tokenize_documents(documents: list[list[str]], tokenizer: Tokenizer,
                       as_lists: bool = False) -> list[list]:
    """Tokenizes every sentence of a chunk of documents in a few in-graph calls.

    Returns:
      Documents as lists of int32 numpy arrays (views into one buffer), or with `as_lists` of
      lists of Python ints; sentences with no tokens and documents with no sentences are
      dropped.
    """
    flat = [s for doc in documents for s in doc]
    pieces = []
    for start in range(0, len(flat), _TOKENIZE_BATCH):
        ids = tokenizer.tokenize(flat[start:start + _TOKENIZE_BATCH])
        values, splits = ids.flat_values.numpy(), ids.row_splits.numpy()
        if as_lists:  # One conversion for the batch, then list slices.
            values, splits = values.tolist(), splits.tolist()
        pieces.extend(values[splits[i]:splits[i + 1]] for i in range(len(splits) - 1))
    out, k = [], 0
    for doc in documents:
        sentences = [p for p in pieces[k:k + len(doc)] if len(p)]
        k += len(doc)
        if sentences:
            out.append(sentences)
    return out


def chunk_rng(seed: int, chunk_index: int) -> random.Random:
    """The random generator of one chunk: a function of the seed and the chunk's index only."""
    digest = hashlib.sha256(f"{seed}:{chunk_index}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def chunk_stats(docs: list) -> collections.Counter:
    """Counts of tokenized documents, their sentences and tokens."""
    return collections.Counter(documents=len(docs), sentences=sum(len(d) for d in docs),
                               corpus_tokens=sum(len(s) for d in docs for s in d))
