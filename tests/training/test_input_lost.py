"""An input file that disappears mid-run: the steps done are checkpointed, then the error goes
to the command, which names the file in one line (`data/record_faults.vanished`)."""

import pytest
import tensorflow as tf
from robust_testing import checkpoint_steps
from toy_task import ToyConfig, ToyTask

from bert_trainer import features as F
from bert_trainer.data import record_faults
from bert_trainer.training.trainer import Trainer, TrainerConfig

LOOP = dict(train_steps=20, steps_per_loop=10, checkpoint_interval=100, summary_interval=100,
            eval_steps=0)


class VanishingToyTask(ToyTask):
    """The toy task whose 8th training batch reads a file that is no longer there."""

    def __init__(self, missing: str):
        super().__init__(ToyConfig())
        self.missing = missing

    def build_inputs(self, split, input_context, *, is_training):
        dataset = super().build_inputs(split, input_context, is_training=is_training)
        if not is_training:
            return dataset

        def read(index, batch):
            gone = tf.cond(tf.equal(index, 7), lambda: tf.io.read_file(self.missing),
                           lambda: tf.constant(""))
            batch = dict(batch)  # the ids depend on the read (+ 0), so it is not pruned
            ids = batch[F.INPUT_WORD_IDS]
            batch[F.INPUT_WORD_IDS] = ids + tf.cast(tf.strings.length(gone) * 0, ids.dtype)
            return batch

        return dataset.enumerate().map(read)


def test_the_steps_done_are_checkpointed_before_the_error(tmp_path):
    missing = str(tmp_path / "data" / "train-00001-of-00002.tfrecord")
    trainer = Trainer(VanishingToyTask(missing), str(tmp_path / "run"),
                      config=TrainerConfig(**LOOP))
    with pytest.raises(tf.errors.NotFoundError) as raised:
        trainer.train_and_evaluate()
    assert checkpoint_steps(tmp_path / "run") == [7]  # was []: 7 steps lost
    line = str(record_faults.vanished(raised.value, {"--train_data": f"{tmp_path}/data/*"},
                                      f"{tmp_path}/run/ckpt-7"))
    assert line == (f"{missing} was deleted while the run read it (a shard of --train_data="
                    f"{tmp_path}/data/*); the steps trained are saved in {tmp_path}/run/ckpt-7; "
                    "put it back, or leave it out of --train_data, and run the same command "
                    "again to resume")
