"""Loaded once by the forkserver that starts create_pretraining_data's worker processes.

Workers fork from that server, so TensorFlow is imported once, not once per worker. The server
only imports: no TensorFlow op runs there (its runtime starts in each worker, after the fork).
TensorFlow's C++ start-up lines are held back, as the command line does in its own process.
Here are the generic pieces every corpus writer uses; `chunk_workers.map_chunks` has the
server import the writer's own module (a family's corpus.py) after this one.
"""

import os

_saved = os.dup(2)
with open(os.devnull, "wb") as _devnull:
    os.dup2(_devnull.fileno(), 2)
    try:
        import tensorflow  # noqa: F401
        import tensorflow_text  # noqa: F401

        from bert_trainer.data import corpus_chunks, example_wire, masking  # noqa: F401
    finally:
        os.dup2(_saved, 2)
        os.close(_saved)
