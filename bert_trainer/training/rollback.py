"""NaN/Inf rollback bookkeeping: which step's batches to drop, and how many rollbacks are left.

The protocol of `TrainerConfig.nonfinite_policy="rollback"` (the trainer restores checkpoints
and builds iterators; this module decides): when step s is refused, the last good checkpoint c
is restored (the trainer writes one at the start if there is none), steps c+1..s-1 are replayed
on the same batches as before (they were good), the batch(es) of step s are dropped (`skip`),
a checkpoint is written at step s-1, and training goes on with the batches that followed.
The checkpointed `skipped_steps` counts dropped steps, so the input of step t starts
(t - 1 + skipped_steps) * accumulation_steps batches per replica into the stream, and exact
resume still holds. Consecutive bad batches cost one rollback each; a run stops as with
"stop" after `max_rollbacks` skips.
"""

import tensorflow as tf
from absl import logging

from bert_trainer.training.config import NonFiniteError


class Rollbacks:
    """The rollback state of one trainer. Build it under the strategy's scope.

    Args:
        policy: "stop" or "rollback" (`TrainerConfig.nonfinite_policy`).
        max_rollbacks: how many steps a run may drop, the checkpointed ones included.
        accumulation_steps: batches per replica per optimizer step (all are dropped).

    Attributes:
        skipped_steps: int64 variable, steps whose batches were dropped (checkpointed).
        skip_at: when the global step reaches this, the next step's batches are dropped
            (None: nothing pending).
    """

    def __init__(self, policy: str, max_rollbacks: int, accumulation_steps: int):
        self.policy = policy
        self.max_rollbacks = max_rollbacks
        self.accumulation_steps = accumulation_steps
        self.skipped_steps = tf.Variable(
            0, dtype=tf.int64, trainable=False, name="skipped_steps",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self.skip_at: int | None = None
        self._used = 0

    @property
    def enabled(self) -> bool:
        return self.policy == "rollback"

    def start(self) -> None:
        """Counts the checkpointed skips as used rollbacks (call at the start of a run)."""
        self._used = int(self.skipped_steps.numpy())

    def consumed_steps(self, step: int) -> int:
        """Optimizer steps' worth of input read before `step` (trained on or dropped)."""
        return step + int(self.skipped_steps.numpy())

    def next_stop(self, step: int) -> int | None:
        """The pending skip step if it lies ahead of `step` (a loop must end there)."""
        return self.skip_at if self.skip_at is not None and self.skip_at > step else None

    def plan(self, error: NonFiniteError, restore) -> tuple[int, str]:
        """Decides on a refused step and restores the last good checkpoint.

        Args:
            error: the refused step.
            restore: fn() -> (checkpoint path, its step): restores the last good checkpoint.

        Returns:
            (restored step, checkpoint path).

        Raises:
            NonFiniteError: `error` again, when the policy is "stop" or rollbacks are used up.
        """
        if not self.enabled:
            raise error
        if self._used >= self.max_rollbacks:
            logging.error("NaN/Inf at step %d: max_rollbacks=%d used up, stopping", error.step,
                          self.max_rollbacks)
            raise error
        self._used += 1
        path, restored = restore()
        self.skip_at = error.step - 1
        first, last = restored + 1, error.step - 1
        replay = ("" if first > last else f"step {last} is replayed on the same batch(es), then "
                  if first == last else f"steps {first}-{last} are replayed on the same batches, "
                  "then ")
        logging.warning("NaN/Inf at step %d: rollback %d of %d to %s (step %d); %sthe batch(es) "
                        "of step %d are skipped", error.step, self._used, self.max_rollbacks,
                        path, restored, replay, error.step)
        return restored, path

    def skip(self, iterator, step: int) -> None:
        """Drops the input of step `step + 1` (the refused one) from `iterator` and counts it.

        The caller checkpoints right after: no skip then happens after the latest checkpoint,
        so a later rollback never has to redo one.
        """
        for _ in range(self.accumulation_steps):
            next(iterator)
        self.skipped_steps.assign_add(1)
        self.skip_at = None
        logging.warning("Skipped the batch(es) of step %d (%d step(s) skipped so far)", step + 1,
                        int(self.skipped_steps.numpy()))
