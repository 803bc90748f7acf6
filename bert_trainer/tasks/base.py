"""The Task interface: everything the trainer needs to know about one kind of training.

One trainer runs every task (pretraining, classification, question answering, tagging). A
task says how to build the model, its input pipeline, its losses and metrics, and how to warm
start from a pretrained checkpoint; the trainer owns the loop, the distribution strategy,
the optimizer, checkpoints and summaries. Modelled on TF Model Garden's `base_task.Task`.

How the trainer calls a task, in order:
    build_model()                     under strategy.scope() and the mixed-precision policy
    initialize(model, checkpoint)     fresh runs with --init_checkpoint only
    check_resume(model_dir)           before a resume
    write_model_info(model_dir)       chief only
    build_inputs(split, ctx, ...)     once per input pipeline (strategy.distribute_datasets_...)
    build_metrics(training)           under strategy.scope()
    flops_counter(model)              once, for the throughput's FLOPs and MFU
    per step, on each replica, inside a tf.function:
        outputs = model(model_inputs(features), training=...)
        build_losses(features, outputs); update_metrics(metrics, features, outputs)
        training only: counter(features, outputs)  (the `flops_counter`'s, when it has one)
        eval only: eval_step_outputs(features, outputs)  -> gathered to the host
    after an evaluation, on the host: aggregate_eval(gathered)
"""

import abc
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from bert_trainer import features as F
from bert_trainer.errors import UserError
from bert_trainer.interop import resolve


class Task(abc.ABC):
    """Base class of training tasks.

    Attributes:
        name: the task's name, as given to `bert-train finetune --task=NAME`.
        train_split: the split `build_inputs` trains on.
        eval_split: the split `build_inputs` evaluates on.
        loss_names: the keys `build_losses` returns, "loss" (the optimised one) first. Declared
            up front so the trainer can create its loss accumulators and summaries before the
            step function is traced.
    """

    name: str = "task"
    train_split: str = "train"
    eval_split: str = "validation"
    loss_names: tuple[str, ...] = ("loss",)

    @abc.abstractmethod
    def build_model(self) -> keras.Model:
        """Builds the model (called under `strategy.scope()` and the dtype policy).

        Returns:
            A built Keras model whose call takes `model_inputs(features)` and returns a dict
            of output tensors (logits etc.), read by `build_losses` and `update_metrics`.
        """

    @abc.abstractmethod
    def global_batch_size(self, is_training: bool) -> int:
        """The batch size summed over all replicas, for training or for evaluation.

        The trainer divides per-example losses by the training value (the
        `tf.nn.compute_average_loss` convention), so it must match what `build_inputs` yields
        in total: `input_context.get_per_replica_batch_size(global_batch_size(True))` rows per
        replica batch.
        """

    @abc.abstractmethod
    def build_inputs(self, split: str, input_context: tf.distribute.InputContext | None,
                     *, is_training: bool) -> tf.data.Dataset:
        """Builds one input pipeline's dataset of per-replica batches.

        Args:
            split: a split name, e.g. `self.train_split`.
            input_context: from `strategy.distribute_datasets_from_function` (None outside
                it): shard with `num_input_pipelines`/`input_pipeline_id` and batch with
                `get_per_replica_batch_size(self.global_batch_size(is_training))`.
            is_training: True for training: shuffle with a fixed seed, repeat forever and drop
                the last partial batch (the trainer resumes by skipping batches, so the order
                must be the same in every run). False: one pass, keep the partial batch.

        Returns:
            Batches as dicts of features keyed by the names in `bert_trainer.features`,
            labels included.
        """

    @abc.abstractmethod
    def build_losses(self, features: dict, outputs: dict) -> dict[str, tf.Tensor]:
        """Per-example losses of one replica's batch.

        Args:
            features: the batch from `build_inputs`.
            outputs: the model's outputs for it.

        Returns:
            {name: float32 [per_replica_batch]} with exactly the keys of `loss_names`; "loss"
            is optimised, the others (e.g. "mlm_loss", "nsp_loss") are logged. The trainer
            averages with `tf.nn.compute_average_loss(..., global_batch_size=...)`, so do not
            average here.
        """

    @abc.abstractmethod
    def build_metrics(self, training: bool) -> list[keras.metrics.Metric]:
        """Streaming metrics, updated in-graph on every replica and summed across them."""

    @abc.abstractmethod
    def update_metrics(self, metrics: list, features: dict, outputs: dict) -> None:
        """Updates `metrics` (from `build_metrics`) with one replica's batch."""

    def model_inputs(self, features: dict) -> dict:
        """The part of a batch the model is called with (labels left out).

        The default passes the encoder inputs (`features.ENCODER_INPUTS`) that are present;
        tasks whose model reads more (e.g. masked LM positions) override this.
        """
        return {name: features[name] for name in F.ENCODER_INPUTS if name in features}

    def flops_counter(self, model: keras.Model) -> Callable[[dict, dict], tf.Tensor] | None:
        """How to count the model FLOPs a training step executes (TensorBoard's model FLOP
        rate and MFU).

        Args:
            model: the model from `build_model`.

        Returns:
            fn(features, outputs) -> float32 scalar: the FLOPs (forward + backward) of one
            training call of `model` on one replica's batch `features`, which returned
            `outputs`; called in the same trace, right after that call. None (the default):
            unknown; the trainer then reports no FLOP rate and no MFU.
        """
        del model
        return None

    def eval_step_outputs(self, features: dict, outputs: dict) -> dict[str, tf.Tensor]:
        """Tensors to gather to the host during evaluation, for `aggregate_eval`.

        Returns:
            {name: tensor [per_replica_batch, ...]}; the trainer concatenates them over replicas
            and batches along axis 0. The default gathers nothing.
        """
        del features, outputs
        return {}

    def aggregate_eval(self, gathered: dict[str, np.ndarray]) -> dict[str, float]:
        """Host-side metrics over a whole evaluation (F1, exact match, MCC, ...).

        Args:
            gathered: `eval_step_outputs` concatenated over the evaluation, as numpy arrays.

        Returns:
            {metric name: value}; merged into the eval metrics. The default adds none.
        """
        del gathered
        return {}

    def initialize(self, model: keras.Model, init_checkpoint) -> None:
        """Warm starts `model` from a pretrained checkpoint (fresh runs only).

        The default restores the whole model and requires every model variable to be found;
        tasks that load only part of it (e.g. the encoder of a pretraining checkpoint into a
        classifier) override this and log what they loaded and what they left initialized.

        Args:
            model: the model from `build_model`.
            init_checkpoint: an `interop.resolve.ResolvedCheckpoint`, or a path to resolve (a
                checkpoint prefix or a directory).
        """
        checkpoint = resolve.as_resolved(init_checkpoint)
        try:
            checkpoint.restore_model(model)
        except UserError as e:
            raise UserError(f"--init_checkpoint={checkpoint.path} does not fit task "
                            f"{self.name!r}'s model ({e})") from None
        logging.info("Initialized all %d model variables from %s", len(model.variables),
                     checkpoint.path)

    def check_resume(self, model_dir: str) -> None:
        """Raises a UserError when `model_dir` was trained as something this task is not.

        Called by the trainer after `build_model` and before it restores `model_dir`'s latest
        checkpoint, so a resume with another task, label set, encoder or vocabulary is refused
        before anything is restored or written. The default checks nothing (the checkpoint's
        variable shapes are still checked by the restore).
        """
        del model_dir

    def write_model_info(self, model_dir: str) -> None:
        """Writes what a later export needs (model config, vocabulary) to `model_dir`.

        Called on the chief only, before training. The default writes nothing.
        """
        del model_dir
