"""Float tolerances of the suite: what a float32 reader would defend, in one place.

float32 keeps 24 significant bits: one ULP is 2**-23, about 1.2e-7 of the value. Two
computations that are equal in exact arithmetic need not agree bit for bit: oneDNN and Eigen
block matmuls and reductions by shape and by CPU (AVX2 or AVX-512, Intel or AMD, core count),
so a batch of 2 and a batch of 1, an eager and a traced call, or a dict and a list input may
sum in different orders. Each op then differs by a few ULP and a tiny model's layers add a few
more: `RTOL` (~100 ULP) covers that with room, `ATOL` covers values that cancel to near zero
(a LayerNorm's output, a gradient) where a relative bound means nothing. Values that are all
far below 1 (learning rates) pass `atol=0`, or ATOL would swallow them.

Exact equality stays where the code guarantees bit identity: values restored from a
checkpoint or file (the bytes), copies and gathers (no arithmetic), integer ids and masks,
and a resume in the same process layout. Comparisons there use
`np.testing.assert_array_equal` with a comment where that is not obvious.
"""

import numpy as np

# Equal maths, different summation orders: a few ULP per op through a tiny model.
RTOL = 1e-5
ATOL = 1e-6


def as_float64(value):
    """A tensor or array (float32, bfloat16, float16 ...) as a float64 NumPy array."""
    return np.asarray(value).astype(np.float64)


def assert_close(actual, desired, *, rtol=RTOL, atol=ATOL, err_msg=""):
    """`actual` equals `desired` up to float32 rounding: |a - d| <= atol + rtol * |d|.

    Args:
      actual: the computed value (tensor, array or number).
      desired: the reference value, same shape (or broadcastable).
      rtol: relative tolerance; pass a larger one with a reason where values accumulate over
        many layers or steps, or bfloat16 is involved.
      atol: absolute tolerance for values near zero.
      err_msg: printed with a failure (e.g. the variable's name).
    """
    np.testing.assert_allclose(as_float64(actual), as_float64(desired), rtol=rtol, atol=atol,
                               err_msg=err_msg)
