"""Token packing: a layer stack computed on the real tokens of a padded batch only."""

from keras import ops

from bert_trainer import ops as bert_ops
from bert_trainer.layers.positions import flat_slots


class TokenPacking:
    """The slots of a `[batch, seq]` batch that a stack of layers computes, as `[tokens, width]`
    rows: the real tokens (and any slot asked for), not the padding.

    Dense layers, LayerNorm, dropout and the feed-forward network act on each token alone, so
    computing them on the packed rows gives the same values at those tokens for fewer FLOPs
    (BERT's pretraining data is about 5 % padding; fine-tuning batches often far more).
    Attention mixes tokens: it unpacks its keys and values to `[batch, seq]` (zeros at the
    padding, which its mask hides) and packs its output again. Values at the padded slots are
    not computed at all, so only a caller that reads none of them (BERT pretraining reads
    [CLS] and the masked positions) may pack.

    The packed shapes vary with the batch: use it where shapes may vary for free (the CPU
    outside XLA, `bert_trainer.ops.dynamic_shapes_are_free`).

    Args:
      keep: bool `[batch, seq]`: the slots to compute; it must hold every slot the padding
        mask lets attention see (the others are zeros to attention, hidden by the mask).
    """

    def __init__(self, keep):
        shape = ops.shape(keep)
        self.batch, self.seq = shape[0], shape[1]
        flat = ops.reshape(ops.cast(keep, "int32"), (-1,))
        # rows[t]: the flat slot (b * seq + s) of packed row t.
        self.rows = ops.cast(ops.reshape(ops.nonzero(flat)[0], (-1,)), "int32")
        # [batch, seq]: each slot's packed row, -1 where not kept.
        self.slot_index = ops.reshape(ops.where(flat > 0, ops.cumsum(flat) - 1, -1), shape)

    def pack(self, x):
        """`[batch, seq, width]` -> `[tokens, width]`."""
        return bert_ops.pack_rows(ops.reshape(x, (-1, x.shape[-1])), self.rows)

    def unpack(self, y):
        """`[tokens, width]` -> `[batch, seq, width]`, zeros at the slots not kept."""
        flat = bert_ops.unpack_rows(y, self.rows, self.batch * self.seq)
        return ops.reshape(flat, (self.batch, self.seq, y.shape[-1]))

    def gather(self, y, positions):
        """`[tokens, width]` rows at `positions` (int `[batch, K]`, kept slots) ->
        `[batch, K, width]`."""
        rows = ops.take(ops.reshape(self.slot_index, (-1,)), flat_slots(positions, self.seq),
                        axis=0)
        count = positions.shape[1] if positions.shape[1] is not None else ops.shape(positions)[1]
        return ops.reshape(ops.take(y, rows, axis=0), (self.batch, count, y.shape[-1]))
