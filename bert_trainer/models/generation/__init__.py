"""Generation in the graph: everything that turns a trained decoder into text, in one place.

  decoding.py        the search loops: greedy search, beam search and sampling over a
                     `step_fn(ids, index, state, constants)` with a cache in `state`
  causal.py          `generate`: a causal LM's prompts continued with its key/value cache
  seq2seq.py         `translate`: an encoder-decoder's sources decoded with its cache
  compiled_loops.py  the XLA compile cache and width bucketing `generate` and `translate`
                     share (one compiled loop per model and settings)

Models (`models/causal_lm.py`, `models/seq2seq_transformer.py`) provide the step hooks
(`decode_step`, `init_cache`, `decoding_table`); this package owns the loops around them.
"""
