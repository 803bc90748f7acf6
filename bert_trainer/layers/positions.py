"""Gathering the vectors at given positions of each sequence (masked LM, sparse last layer)."""

from keras import ops


def flat_slots(positions, seq_length):
    """int32 `[batch * K]`: the flat slot `b * seq_length + positions[b, k]` of each position
    (int `[batch, K]`) in a `[batch, seq_length]` grid flattened row by row."""
    positions = ops.cast(positions, "int32")
    offsets = ops.arange(ops.shape(positions)[0], dtype="int32")[:, None]
    return ops.reshape(positions + offsets * ops.cast(seq_length, "int32"), (-1,))


def gather_positions(sequence, positions):
    """`sequence[b, positions[b, k]]` for every b, k.

    One gather from the flattened `[batch * seq, width]` rows (google-research/bert's
    `gather_indexes`): its gradient is a row scatter into `sequence`, where
    `take_along_axis` broadcasts the indices to `[batch, P, width]` and transposes.

    Args:
      sequence: `[batch, seq, width]`.
      positions: int `[batch, P]`, each in `[0, seq)`.

    Returns:
      `[batch, P, width]` in `sequence`'s dtype.
    """
    if len(positions.shape) != 2:
        raise ValueError(f"positions must be [batch, P], got shape {tuple(positions.shape)}")
    shape = ops.shape(sequence)
    batch, length = shape[0], shape[1]
    width = sequence.shape[-1] if sequence.shape[-1] is not None else shape[2]
    flat = ops.take(ops.reshape(sequence, (-1, width)), flat_slots(positions, length),
                    axis=0)  # (batch * P, width)
    return ops.reshape(flat, (batch, positions.shape[1] or ops.shape(positions)[1], width))
