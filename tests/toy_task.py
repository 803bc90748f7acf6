"""A tiny, deterministic Task for trainer tests: bag-of-embeddings classifier on synthetic ids.

Each example is a padded id sequence; its label says whether most of its real tokens are
"low" ids (< vocab_size / 2), which a masked mean of embeddings followed by an MLP learns in a
few dozen steps. The data is generated from `data_seed`, so every run sees the same examples
in the same (seeded, reshuffled per epoch) order.
"""

import dataclasses
import json
import os

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from bert_trainer import features as F
from bert_trainer.tasks import Task

LOGITS = "logits"
PREDICTIONS = "predictions"


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    vocab_size: int = 32
    seq_length: int = 8
    hidden_size: int = 16
    num_classes: int = 2
    dropout: float = 0.0
    train_batch_size: int = 8
    eval_batch_size: int = 16
    num_train_examples: int = 256
    num_eval_examples: int = 40
    data_seed: int = 0
    shuffle: bool = True
    poison_batch: int | None = None  # this training batch (per pipeline) gets a NaN input mask


def make_examples(config: ToyConfig, num: int, seed: int) -> dict[str, np.ndarray]:
    """Synthetic examples: ids [num, seq], mask [num, seq], labels [num]."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, config.vocab_size, size=(num, config.seq_length))
    lengths = rng.integers(2, config.seq_length + 1, size=num)
    mask = (np.arange(config.seq_length)[None, :] < lengths[:, None]).astype(np.int32)
    ids = (ids * mask).astype(np.int32)
    low = ((ids < config.vocab_size // 2) & (mask == 1)).sum(axis=1)
    labels = (2 * low > lengths).astype(np.int32)
    return {F.INPUT_WORD_IDS: ids, F.INPUT_MASK: mask, F.LABEL_IDS: labels}


class ToyTask(Task):
    name = "toy"
    loss_names = ("loss", "ce_loss")

    def __init__(self, config: ToyConfig = ToyConfig()):
        self.config = config

    def global_batch_size(self, is_training: bool) -> int:
        c = self.config
        return c.train_batch_size if is_training else c.eval_batch_size

    def build_model(self) -> keras.Model:
        c = self.config
        mask_dtype = "float32" if c.poison_batch is not None else "int32"
        ids = keras.Input((c.seq_length,), dtype="int32", name=F.INPUT_WORD_IDS)
        mask = keras.Input((c.seq_length,), dtype=mask_dtype, name=F.INPUT_MASK)
        x = keras.layers.Embedding(c.vocab_size, c.hidden_size, name="embedding")(ids)
        m = ops.expand_dims(ops.cast(mask, x.dtype), -1)  # (batch, seq, 1)
        pooled = ops.sum(x * m, axis=1) / ops.maximum(ops.sum(m, axis=1), 1.0)  # (batch, hidden)
        h = keras.layers.Dense(c.hidden_size, activation="relu", name="hidden")(pooled)
        h = keras.layers.LayerNormalization(name="layer_norm")(h)
        h = keras.layers.Dropout(c.dropout)(h)
        logits = keras.layers.Dense(c.num_classes, name="classifier")(h)
        return keras.Model({F.INPUT_WORD_IDS: ids, F.INPUT_MASK: mask}, {LOGITS: logits})

    def build_inputs(self, split, input_context, *, is_training):
        c = self.config
        num, seed = ((c.num_train_examples, c.data_seed) if split == self.train_split
                     else (c.num_eval_examples, c.data_seed + 1))
        examples = make_examples(c, num, seed)
        if c.poison_batch is not None:
            examples[F.INPUT_MASK] = examples[F.INPUT_MASK].astype(np.float32)
        dataset = tf.data.Dataset.from_tensor_slices(examples)
        batch_size = self.global_batch_size(is_training)
        if input_context is not None:
            dataset = dataset.shard(input_context.num_input_pipelines,
                                    input_context.input_pipeline_id)
            batch_size = input_context.get_per_replica_batch_size(batch_size)
        if is_training:
            if c.shuffle:
                dataset = dataset.shuffle(num, seed=c.data_seed, reshuffle_each_iteration=True)
            dataset = dataset.repeat()
        dataset = dataset.batch(batch_size, drop_remainder=is_training)
        if is_training and c.poison_batch is not None:
            dataset = dataset.enumerate().map(self._poison)
        return dataset

    def _poison(self, index, batch):
        batch = dict(batch)
        nan = tf.fill(tf.shape(batch[F.INPUT_MASK]), float("nan"))
        poisoned = tf.equal(index, self.config.poison_batch)
        batch[F.INPUT_MASK] = tf.where(poisoned, nan, batch[F.INPUT_MASK])
        return batch

    def build_losses(self, features, outputs):
        ce = keras.losses.sparse_categorical_crossentropy(
            features[F.LABEL_IDS], ops.cast(outputs[LOGITS], "float32"), from_logits=True)
        return {"loss": ce, "ce_loss": ce}

    def build_metrics(self, training):
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

    def update_metrics(self, metrics, features, outputs):
        metrics[0].update_state(features[F.LABEL_IDS], outputs[LOGITS])

    def eval_step_outputs(self, features, outputs):
        return {PREDICTIONS: ops.argmax(outputs[LOGITS], axis=-1),
                F.LABEL_IDS: features[F.LABEL_IDS]}

    def aggregate_eval(self, gathered):
        correct = gathered[PREDICTIONS] == gathered[F.LABEL_IDS]
        return {"host_accuracy": float(np.mean(correct)), "num_examples": float(correct.size)}

    def write_model_info(self, model_dir):
        with open(os.path.join(model_dir, "toy_config.json"), "w") as f:
            json.dump(dataclasses.asdict(self.config), f)
