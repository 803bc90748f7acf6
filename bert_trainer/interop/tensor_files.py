"""Weights files known by their headers before any tensor is read.

A safetensors file says in its header what it holds: each tensor's dtype, shape and byte
range. A header may claim anything: a [3,000,000, 384] tensor in a sparse file (4.6 GB of
holes) was read into memory before any check, and only then refused for the wrong reason.
So `read_header` checks the header against itself and against the file's size (every range
inside the file, each range the size its dtype and shape say), and `TensorSource` gives the
readers (`hf.py`, `gpt2.py`) every tensor's name and shape first: they check those against
config.json, then read only the tensors they use, one at a time (`safe_open`).

A pickle `pytorch_model.bin` has no header: it is read whole (with `--allow_pickle` only)
before its shapes are known.
"""

import dataclasses
import json
import math
import os
from collections.abc import Callable

import numpy as np
from safetensors import SafetensorError, safe_open

from bert_trainer.errors import UserError

# Bytes per element of each safetensors dtype.
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
               "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1,
               "BOOL": 1}
# The safetensors library's own limit on a header (100 MB).
MAX_HEADER_BYTES = 100_000_000


def _refusal(path: str, reason: str) -> UserError:
    return UserError(f"{path} could not be read as safetensors ({reason}); re-download it or "
                     "save it again with float32/float16 tensors")


def read_header(path: str) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor of the safetensors file `path`, from its header alone,
    checked against the file: each byte range inside the data, of the size its dtype and
    shape imply.

    Raises:
      UserError: one line naming the file (and the tensor) and what does not fit.
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            prefix = f.read(8)
            length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
            if length < 0:
                raise _refusal(path, f"a file of {size} bytes has no header")
            if length > min(MAX_HEADER_BYTES, size - 8):
                raise _refusal(path, f"its header claims {length} bytes, the file holds "
                                     f"{size - 8} after the length")
            header = json.loads(f.read(length))
    except OSError as e:
        raise UserError(f"{path} could not be read ({e.strerror or e})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _refusal(path, f"its header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise _refusal(path, "its header is not a JSON object")
    data = size - 8 - length
    return {name: _entry_shape(path, name, entry, data)
            for name, entry in header.items() if name != "__metadata__"}


def _entry_shape(path: str, name: str, entry, data: int) -> tuple[int, ...]:
    """The shape of one header entry, after checking its dtype, shape and byte range."""
    if not isinstance(entry, dict):
        raise _refusal(path, f"tensor {name} has no dtype, shape and data_offsets")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise _refusal(path, f"tensor {name} has an unknown dtype {dtype!r}")
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise _refusal(path, f"tensor {name} has a malformed shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1]):
        raise _refusal(path, f"tensor {name} has malformed data_offsets {offsets!r}")
    nbytes = math.prod(shape) * DTYPE_BYTES[dtype]
    if offsets[1] - offsets[0] != nbytes:
        raise _refusal(path, f"tensor {name} claims shape {shape} of {dtype} ({nbytes} bytes) "
                             f"but spans {offsets[1] - offsets[0]} bytes")
    if offsets[1] > data:
        raise _refusal(path, f"tensor {name} ends at byte {offsets[1]} of a data section of "
                             f"{data} bytes: the file is cut short")
    return tuple(shape)


@dataclasses.dataclass
class TensorSource:
    """The tensors of a weights file (or a sharded index), known by name and shape before any
    is read.

    Attributes:
      weights_file: the file named in messages (the index for a sharded model).
      shapes: tensor name -> shape, from the headers (a pickle: from its loaded arrays).
    """

    weights_file: str
    shapes: dict[str, tuple[int, ...]]
    _read: Callable[[list[str]], dict[str, np.ndarray]]

    def read(self, names) -> dict[str, np.ndarray]:
        """The tensors of `names` that the file holds (the others are never read)."""
        return self._read([n for n in dict.fromkeys(names) if n in self.shapes])


def safetensors_source(files: list[str], weights_file: str) -> TensorSource:
    """The tensors of one safetensors file or of a model's shards, each header checked."""
    where, shapes = {}, {}
    for path in files:
        if not os.path.isfile(path):
            raise UserError(f"{path} does not exist (listed in {weights_file})")
        for name, shape in read_header(path).items():
            where[name], shapes[name] = path, shape

    def read(names: list[str]) -> dict[str, np.ndarray]:
        tensors = {}
        for path in dict.fromkeys(where[n] for n in names):
            try:
                with safe_open(path, framework="numpy") as f:
                    tensors.update({n: f.get_tensor(n) for n in names if where[n] == path})
            except (SafetensorError, OSError, ValueError, TypeError) as e:
                raise _refusal(path, str(e)) from None
        return tensors

    return TensorSource(weights_file, shapes, read)


def loaded_source(tensors: dict[str, np.ndarray], weights_file: str) -> TensorSource:
    """Tensors already in memory (a pickle, read whole) as a source."""
    return TensorSource(weights_file, {n: tuple(np.shape(a)) for n, a in tensors.items()},
                        lambda names: {n: tensors[n] for n in names})
