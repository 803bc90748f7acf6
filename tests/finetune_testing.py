"""Helpers shared by the fine-tuning task tests: build a task on the tiny pretrained model, train
it with the real Trainer, and read the training loss back from the TensorBoard events."""

import glob
import os

import numpy as np
import tensorflow as tf

from bert_trainer.encoders import BertEncoder
from bert_trainer.interop import formats, hf, pretrained
from bert_trainer.tasks import finetuning, registry
from bert_trainer.training import OptimizerConfig, Trainer, TrainerConfig

SHARED_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..",
                           "shared", "data")


def shared_file(relative: str) -> str:
    return os.path.normpath(os.path.join(SHARED_DATA, relative))


def make_task(name: str, pretrained: dict, *, train_file=None, eval_file=None,
              max_train_examples=None, max_eval_examples=None, seq_length=32,
              train_batch_size=16, eval_batch_size=32, dropout_rate=0.0, task_options=None,
              **resolve_options):
    """A task of `registry` on the tiny pretrained model's encoder and vocabulary."""
    spec = finetuning.spec_from_checkpoint(pretrained["dir"])
    task_data = registry.resolve_task_data(name, train_file=train_file, **resolve_options)
    config = finetuning.FinetuneConfig(seq_length=seq_length, train_batch_size=train_batch_size,
                                       eval_batch_size=eval_batch_size, dropout_rate=dropout_rate,
                                       shuffle_buffer=1000)
    data = finetuning.DataConfig(train_file=train_file, eval_file=eval_file,
                                 max_train_examples=max_train_examples,
                                 max_eval_examples=max_eval_examples)
    return registry.build_task(task_data, spec, config=config, data=data, **(task_options or {}))


def train(task, model_dir: str, init_checkpoint: str | None, *, steps: int,
          learning_rate: float = 1e-3, summary_interval: int = 5, eval_steps=None):
    """Trains `task` for `steps` steps with the real Trainer; returns (trainer, RunResult)."""
    config = TrainerConfig(train_steps=steps, steps_per_loop=summary_interval,
                           summary_interval=summary_interval, checkpoint_interval=steps,
                           eval_steps=eval_steps, init_checkpoint=init_checkpoint,
                           best_metric=task.best_metric if eval_steps != 0 else None)
    optimizer = OptimizerConfig(learning_rate=learning_rate, warmup_steps=0)
    trainer = Trainer(task, model_dir, config=config, optimizer=optimizer)
    return trainer, trainer.train_and_evaluate()


def scalar_history(model_dir: str, tag: str, subdir: str = "train") -> list[float]:
    """The values of one scalar summary, in step order, from model_dir/<subdir> events."""
    points = []
    for path in glob.glob(os.path.join(model_dir, subdir, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == tag:
                    points.append((event.step, float(tf.make_ndarray(value.tensor))))
    return [v for _, v in sorted(points)]


def assert_encoder_equals(encoder, arrays) -> None:
    """Every encoder variable equals the saved array at the same position."""
    assert len(encoder.weights) == len(arrays)
    for variable, array in zip(encoder.weights, arrays, strict=True):
        np.testing.assert_array_equal(variable.numpy(), array, err_msg=variable.path)


def write_tiny_hf(pretrained_dir: dict, path) -> str:
    """The tiny pretrained encoder as a Hugging Face directory (config.json, safetensors, vocab)."""
    info = finetuning.spec_from_checkpoint(pretrained_dir["dir"])
    encoder = BertEncoder.from_config(info.config)
    encoder.set_weights(pretrained_dir["encoder_weights"])
    ckpt = formats.BertCheckpoint(pretrained.bert_config(encoder),
                                  pretrained.reference_weights(encoder),
                                  pretrained_dir["vocab_file"], True, "weights", "config")
    hf.write_hf(str(path), ckpt)
    return str(path)
