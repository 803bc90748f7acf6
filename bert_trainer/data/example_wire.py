"""`tf.train.Example` bytes written directly, as protobuf's deterministic serialization writes them.

`create_pretraining_data` writes millions of examples of a few int64 lists and one float list;
building each as a `tf.train.Example` proto and serializing it was a large share of the
per-example time (benchmarks/README.md, "Pretraining data"). The wire format of those
messages is small: a field's tag byte, varint lengths, and packed varints (int64) or
little-endian float32s. The tests compare these bytes with
`SerializeToString(deterministic=True)` on random and real examples.
"""


def _varint(n: int) -> bytes:
    """Protobuf's varint of an int64 (a negative one as its 64-bit two's complement)."""
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_VARINTS = [_varint(n) for n in range(1 << 14)]  # Lengths and ids, looked up (1-2 bytes).


def varint_table(size: int) -> list[bytes]:
    """The varints of 0 .. size - 1 (at least), shared and grown as needed (a vocabulary)."""
    if len(_VARINTS) < size:
        _VARINTS.extend(_varint(n) for n in range(len(_VARINTS), size))
    return _VARINTS


def _length(n: int) -> bytes:
    return _VARINTS[n] if n < len(_VARINTS) else _varint(n)


def pack_int64(values) -> bytes:
    """The packed varints of any int64 values (a repeated int64 field's payload)."""
    return b"".join([_varint(int(v)) for v in values])


def int64_feature(packed: bytes) -> bytes:
    """A serialized `tf.train.Feature` holding an Int64List (field 3) of packed values."""
    inner = b"\x0a" + _length(len(packed)) + packed if packed else b""
    return b"\x1a" + _length(len(inner)) + inner


def float_feature(packed: bytes) -> bytes:
    """A serialized `tf.train.Feature` holding a FloatList (field 2); `packed`: float32 LE."""
    inner = b"\x0a" + _length(len(packed)) + packed if packed else b""
    return b"\x12" + _length(len(inner)) + inner


def example_bytes(feature_bytes: dict[str, bytes]) -> bytes:
    """`tf.train.Example(...).SerializeToString(deterministic=True)`, built directly.

    An Example's features (field 1) are a map (field 1 of Features): one entry per feature
    (key: field 1, the Feature: field 2), in key order when serialized deterministically.

    Args:
      feature_bytes: {name: serialized Feature} (`int64_feature`, `float_feature`).
    """
    entries = []
    for name, feature in sorted(feature_bytes.items()):
        key = name.encode()
        body = b"\x0a" + _length(len(key)) + key + b"\x12" + _length(len(feature)) + feature
        entries.append(b"\x0a" + _length(len(body)) + body)
    entries = b"".join(entries)
    return b"\x0a" + _length(len(entries)) + entries
