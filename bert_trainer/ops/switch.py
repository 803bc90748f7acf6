"""The one switch between the fused CPU kernels and TensorFlow's own ops.

Every op of `bert_trainer.ops` asks `fused(dtype)` while it is traced. The answer comes from
the innermost `fused_kernels(...)` scope, else from `BERT_TRAIN_FUSED_KERNELS` (the default):

- `"auto"` (the variable's default): the kernels where they can run: Keras on TensorFlow, no
  GPU or TPU visible, not traced for XLA (`jit_compile=True`, TPUs: custom ops cannot
  compile there), and the library builds (else a warning and TensorFlow's ops).
- `"on"` (`fused_kernels(True)`): as `"auto"`, but a library that cannot be built is an
  error instead of a warning.
- `"off"` (`fused_kernels(False)`): TensorFlow's ops, the same computation.

The trainer traces its steps inside a scope of the setting it was built under, and the
exporter traces inside `portable()`: TensorFlow's ops and no data-dependent shapes, so a
SavedModel serves wherever TensorFlow runs.
"""

import contextlib
import os
import threading

MODE_ENV = "BERT_TRAIN_FUSED_KERNELS"
MODES = ("auto", "on", "off")

_local = threading.local()  # this thread's scopes, innermost last
_shared: list[tuple[object, str]] = []  # every thread's open scopes, innermost last
_lock = threading.Lock()


def default_mode() -> str:
    """`BERT_TRAIN_FUSED_KERNELS` ("auto" when unset), the setting outside any scope.

    Raises:
      ValueError: the variable holds something else than "auto", "on" or "off".
    """
    value = os.environ.get(MODE_ENV, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"{MODE_ENV}={value!r}: expected one of {', '.join(MODES)}")
    return value


def mode() -> str:
    """The setting in force here, now: the innermost scope's, else `default_mode()`.

    A thread without a scope of its own takes the innermost one open in any thread: a
    `MirroredStrategy` traces each replica's step in a thread of its own, inside the scope
    its caller opened.
    """
    stack = getattr(_local, "stack", None)
    if stack:
        return stack[-1]
    with _lock:
        if _shared:
            return _shared[-1][1]
    return default_mode()


@contextlib.contextmanager
def fused_kernels(setting: bool | str | None = None):
    """Ops traced within this block use the fused kernels as `setting` says.

    Args:
      setting: True or "on", False or "off", "auto"; None: the setting in force where the
        block opens (`mode()`), pinned for the block.
    """
    value = _setting(setting)
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    token = object()
    stack.append(value)
    with _lock:
        _shared.append((token, value))
    try:
        yield value
    finally:
        stack.pop()
        with _lock:
            _shared[:] = [entry for entry in _shared if entry[0] is not token]


_portable = threading.local()  # this thread's portable() depth
_portable_shared = [0]  # every thread's open portable() scopes


@contextlib.contextmanager
def portable():
    """Ops traced within this block run wherever TensorFlow does: TensorFlow's own ops
    (`fused_kernels(False)`) and no data-dependent shapes (`dynamic_shapes_are_free()` is
    False): what a SavedModel holds."""
    _portable.depth = getattr(_portable, "depth", 0) + 1
    with _lock:
        _portable_shared[0] += 1
    try:
        with fused_kernels(False):
            yield
    finally:
        _portable.depth -= 1
        with _lock:
            _portable_shared[0] -= 1


def _in_portable() -> bool:
    if getattr(_portable, "depth", 0):
        return True
    if getattr(_local, "stack", None):  # a scope of this thread's own decides
        return False
    with _lock:
        return _portable_shared[0] > 0


def _setting(setting) -> str:
    if setting is None:
        return mode()
    if isinstance(setting, bool):
        return "on" if setting else "off"
    value = str(setting).strip().lower()
    if value not in MODES:
        raise ValueError(f"fused_kernels({setting!r}): expected True, False, None or one of "
                         f"{', '.join(MODES)}")
    return value


def fused(dtype=None) -> bool:
    """Whether an op traced here, now, is the fused kernel (see the module's docstring).

    Args:
      dtype: the op's dtype, if it matters: it must be one the kernels take
        (`kernels.ELEMENTWISE_DTYPES`).
    """
    setting = mode()
    if setting == "off" or _keras_backend() != "tensorflow":
        return False
    from bert_trainer import kernels  # noqa: PLC0415 - loads nothing until asked

    if dtype is not None and _dtype_name(dtype) not in kernels.ELEMENTWISE_DTYPES:
        return False
    if _under_xla() or _accelerators_visible():
        return False
    return kernels.library(required=setting == "on") is not None


def dynamic_shapes_are_free() -> bool:
    """Whether ops traced here, now, run on the CPU outside XLA, where a tensor's shape may
    change from step to step at no cost (on a GPU a data-dependent shape costs a host sync;
    XLA and TPUs need static shapes), and not for a SavedModel (`portable()`), which may be
    served on any of them."""
    return not _in_portable() and not _under_xla() and not _accelerators_visible()


def _keras_backend() -> str:
    import keras  # noqa: PLC0415

    return keras.backend.backend()


def _dtype_name(dtype) -> str:
    import tensorflow as tf  # noqa: PLC0415

    return tf.as_dtype(dtype).name


def _under_xla() -> bool:
    """True while tracing for XLA (`jit_compile=True`, TPU): custom ops cannot compile there.

    A decision at trace time: a plain `tf.function` traced outside XLA and later called from
    a `jit_compile=True` one would keep its trace. The trainer traces its XLA step afresh
    inside the compiled function (`TrainStep`), so its ops see the XLA context.
    """
    import tensorflow as tf  # noqa: PLC0415

    try:
        from tensorflow.python.ops import control_flow_util  # noqa: PLC0415
    except ImportError:  # private API gone: do not guess
        return True
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def _accelerators_visible() -> bool:
    import tensorflow as tf  # noqa: PLC0415

    return bool(tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))
