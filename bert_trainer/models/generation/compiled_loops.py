"""Decoding loops compiled with XLA: one compiled loop kept per model and settings, and input
widths padded to buckets so that a run compiles once per bucket, not once per width.

`causal.generate` and `seq2seq.translate` run their loops this way by
default: on a CPU the graph executor dispatches a step's ~200 small ops one by one, which
costs more than their arithmetic; XLA runs the step as one program.
"""

import weakref

import tensorflow as tf

# Input widths (prompts, sources) are padded up to a multiple of this by default.
WIDTH_BUCKET = 32


def bucket_width(ids, limit, multiple=WIDTH_BUCKET):
    """`ids` `[b, w]` with zero columns added up to a multiple of `multiple`, without going
    past `limit` columns (nor cutting any). A zero column is padding the caller masks out.
    """
    width = ids.shape[1]
    # A static width is padded with Python ints, so the padded shape stays static.
    low, high = (max, min) if width is not None else (tf.maximum, tf.minimum)
    if width is None:
        width = tf.shape(ids)[1]
    target = low(width, high(-(-width // multiple) * multiple, limit))
    return tf.pad(ids, [[0, 0], [0, target - width]])


# model -> {settings: the XLA-compiled loop}: the same `tf.function` for every call, so eager
# calls reuse its traces and compiled programs (shape by shape).
_COMPILED = weakref.WeakKeyDictionary()


def compiled(model, key, make):
    """`tf.function(make(model), jit_compile=True)`, made once per model and `key` (the
    settings `make` closes over) and reused; made afresh when `key` cannot be hashed (a
    tensor setting) or the model takes no weak reference. The cached function holds the
    model through a proxy, so the cache never keeps a model alive."""
    try:
        loops = _COMPILED.setdefault(model, {})
        hash(key)
    except TypeError:
        return tf.function(make(model), jit_compile=True)
    if key not in loops:
        loops[key] = tf.function(make(weakref.proxy(model)), jit_compile=True)
    return loops[key]
