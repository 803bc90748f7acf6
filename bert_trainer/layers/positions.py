"""Gathering the vectors at given positions of each sequence (masked LM, sparse last layer)."""

from keras import ops


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
    positions = ops.cast(positions, "int32")
    offsets = ops.arange(batch, dtype="int32")[:, None] * ops.cast(length, "int32")
    flat = ops.take(ops.reshape(sequence, (-1, width)), ops.reshape(positions + offsets, (-1,)),
                    axis=0)  # (batch * P, width)
    return ops.reshape(flat, (batch, positions.shape[1] or ops.shape(positions)[1], width))
