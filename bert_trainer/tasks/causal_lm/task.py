"""Causal language modelling: next-token pretraining of a `CausalLM` (GPT-style).

The data are the blocks of `bert-train create_pretraining_data --objective=causal_lm`
(`tasks.causal_lm.corpus`: documents packed into one stream, one [SEP] before each, cut into
blocks of `block_size` tokens), read by `tasks.causal_lm.data`. The model sees every token
of a block; the logits at position t are scored against token t + 1, so the last position has
no target. The model is built by `model_fn` (gin's `build_causal_lm`, or an init checkpoint's
model info) and trained as is: its checkpoint names are its own weights' paths.
"""

import dataclasses
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from bert_trainer import features as F
from bert_trainer import losses as losses_lib
from bert_trainer.checkpoints import model_dir as model_dir_lib
from bert_trainer.data.input_utils import PipelineOptions
from bert_trainer.data.tokenizer import load_vocab
from bert_trainer.errors import UserError
from bert_trainer.interop import resolve
from bert_trainer.tasks.base import Task
from bert_trainer.tasks.causal_lm import data as block_data

TASK_NAME = "causal_lm"


@dataclasses.dataclass(frozen=True)
class CausalLMConfig:
    """What to pretrain on, and how the blocks are batched.

    Attributes:
        train_data: TFRecord glob(s) of training blocks (comma-separated allowed).
        eval_data: TFRecord glob(s) of held-out blocks; None: no evaluation.
        vocab_file: the WordPiece vocab.txt the data were made with; copied to the model
            directory (generation detokenizes with it).
        lower_case: whether the vocabulary is uncased (recorded in the model directory).
        block_size: tokens per block; must equal the records' length and be at most the
            model's max_sequence_length.
        train_batch_size: global training batch of blocks (summed over replicas).
        eval_batch_size: global eval batch; None: the training batch.
        shuffle_buffer: blocks in the training shuffle buffer.
        data_seed: seeds the file order and the shuffle (exact resumption relies on it).
    """

    train_data: str | None = None
    eval_data: str | None = None
    vocab_file: str | None = None
    lower_case: bool = True
    block_size: int = 256
    train_batch_size: int = 32
    eval_batch_size: int | None = None
    shuffle_buffer: int = 10_000
    data_seed: int = 0

    def __post_init__(self):
        for field in ("train_batch_size", "shuffle_buffer"):
            if getattr(self, field) < 1:
                raise UserError(f"CausalLMConfig.{field}={getattr(self, field)} must be >= 1")
        if self.block_size < 2:
            raise UserError(f"CausalLMConfig.block_size={self.block_size} must be >= 2 (a token "
                            "and the next one it predicts)")
        if self.eval_batch_size is not None and self.eval_batch_size < 1:
            raise UserError(f"CausalLMConfig.eval_batch_size={self.eval_batch_size} must be "
                            ">= 1 (or None: the training batch)")
        if self.vocab_file is None:
            raise UserError("CausalLMConfig.vocab_file is not set; pass --vocab_file=VOCAB "
                            "(the vocabulary the blocks were made with)")


def next_token_targets(features: dict, outputs: dict):
    """The scored positions of a batch: logits at t against token t + 1.

    Returns:
      (labels int32 [batch, t-1], logits float32 [batch, t-1, vocab], weights float32
      [batch, t-1]: 1 where the target is a real token, 0 on padding).
    """
    ids = features[F.INPUT_WORD_IDS]  # (batch, t)
    logits = outputs[F.LOGITS][:, :-1]  # (batch, t-1, vocab): the last position has no target
    mask = features.get(F.INPUT_MASK)
    weights = tf.ones_like(ids[:, 1:], tf.float32) if mask is None else tf.cast(
        mask[:, 1:] != 0, tf.float32)
    return tf.cast(ids[:, 1:], tf.int32), logits, weights


class Perplexity(keras.metrics.Metric):
    """exp(mean token cross-entropy) over everything seen since the last reset.

    Sums the token losses and the token count (summed over replicas and batches) and takes
    exp of their ratio once, in `result`: the perplexity of the whole evaluation set, not a
    mean of per-batch perplexities.
    """

    def __init__(self, name="perplexity", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total",
                                       aggregation="sum")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count",
                                       aggregation="sum")

    def update_state(self, token_losses, sample_weight=None):
        """Adds float32 token losses `[...]`, weighted by `sample_weight` (same shape)."""
        token_losses = tf.cast(token_losses, tf.float32)
        weights = (tf.ones_like(token_losses) if sample_weight is None
                   else tf.cast(sample_weight, tf.float32))
        self.total.assign_add(tf.reduce_sum(token_losses * weights))
        self.count.assign_add(tf.reduce_sum(weights))

    def result(self):
        return tf.exp(tf.math.divide_no_nan(self.total, self.count))


class CausalLMTask(Task):
    """Next-token prediction on a `CausalLM`.

    Loss, per example (the trainer averages over the global batch):
        loss = sum_t w_t * xent(logits_t, id_{t+1}) / max(sum_t w_t, 1)   t < block_size - 1
    Metrics: perplexity = exp(token loss summed over the set / tokens), next_token_accuracy
    (the target scored highest, over tokens).

    Args:
        config: data and batching.
        model_fn: builds a fresh `CausalLM` (called once, in `build_model`).
        checkpoint: the init checkpoint, already resolved by the caller; None: `initialize`
            resolves its argument.
    """

    name = TASK_NAME
    train_split = "train"
    eval_split = "eval"
    loss_names = ("loss",)

    def __init__(self, config: CausalLMConfig, model_fn: Callable[[], keras.Model], *,
                 checkpoint: "resolve.ResolvedCheckpoint | None" = None):
        self.config = config
        self.model_fn = model_fn
        self.checkpoint = checkpoint
        self._model = None  # kept for write_model_info and check_resume

    # -------------------------------------------------------------------------- model

    def build_model(self) -> keras.Model:
        """The `CausalLM` of `model_fn`, checked against the config and built."""
        model = self.model_fn()
        if not hasattr(model, "decode_step"):
            source = (f"--init_checkpoint={self.checkpoint.path} holds" if self.checkpoint
                      else "the model builder gave")
            raise UserError(f"{source} a {type(model).__name__}, not a CausalLM; the causal_lm "
                            "objective trains a decoder-only model (build_causal_lm, or a "
                            "causal model directory to warm-start from)")
        c = self.config
        if c.block_size > model.max_sequence_length:
            raise UserError(f"CausalLMConfig.block_size={c.block_size} exceeds the model's "
                            f"max_sequence_length={model.max_sequence_length}; make blocks of "
                            "at most that many tokens or enlarge "
                            "build_causal_lm.max_sequence_length")
        size = len(load_vocab(c.vocab_file))
        if size != model.vocab_size:
            raise UserError(f"vocab {c.vocab_file} has {size} tokens but the model's vocab_size "
                            f"is {model.vocab_size}; set build_causal_lm.vocab_size = {size}")
        if not model.built:
            model({F.INPUT_WORD_IDS: np.ones((1, 2), np.int32)}, training=False)
        self._model = model
        return model

    def model_inputs(self, features: dict) -> dict:
        """The token ids only: every block is full, so no attention mask is needed."""
        return {F.INPUT_WORD_IDS: features[F.INPUT_WORD_IDS]}

    def flops_counter(self, model: keras.Model):
        """Asks the model (`CausalLM.training_flops`), as the masked-LM task does."""
        if not getattr(model, "counts_flops", False) or not hasattr(model, "training_flops"):
            return None
        return lambda features, outputs: model.training_flops(self.model_inputs(features),
                                                              outputs)

    # -------------------------------------------------------------------------- input

    def global_batch_size(self, is_training: bool) -> int:
        c = self.config
        return c.train_batch_size if is_training else (c.eval_batch_size or c.train_batch_size)

    def build_inputs(self, split, input_context, *, is_training):
        """Batches of blocks from `train_data` or `eval_data` (see `Task.build_inputs`)."""
        c = self.config
        patterns = {self.train_split: c.train_data, self.eval_split: c.eval_data}
        if split not in patterns:
            raise UserError(f"causal_lm has splits {sorted(patterns)}, not {split!r}")
        if not patterns[split]:
            flag = "--train_data" if split == self.train_split else "--eval_data"
            raise UserError(f"CausalLMConfig.{split}_data is not set; pass {flag}=GLOB (files "
                            "written by 'bert-train create_pretraining_data "
                            "--objective=causal_lm')")
        batch_size = self.global_batch_size(is_training)
        if input_context is not None:
            batch_size = input_context.get_per_replica_batch_size(batch_size)
        return block_data.causal_lm_dataset(
            patterns[split], block_size=c.block_size, options=PipelineOptions(
                batch_size=batch_size, is_training=is_training, input_context=input_context,
                shuffle_buffer=c.shuffle_buffer, seed=c.data_seed, deterministic=True))

    # -------------------------------------------------------------------- losses, metrics

    def build_losses(self, features, outputs):
        """Per-example mean next-token cross-entropy, float32 [per_replica_batch]."""
        labels, logits, weights = next_token_targets(features, outputs)
        xent = losses_lib.sparse_softmax_cross_entropy(labels, logits)  # (batch, t-1)
        loss = tf.reduce_sum(xent * weights, -1) / tf.maximum(tf.reduce_sum(weights, -1), 1.0)
        return {"loss": loss}

    def build_metrics(self, training):
        del training  # the same metrics for training and evaluation
        return [Perplexity(name="perplexity"), keras.metrics.Mean(name="next_token_accuracy")]

    def update_metrics(self, metrics, features, outputs):
        labels, logits, weights = next_token_targets(features, outputs)
        # The fused kernel computes both from one pass over the logits.
        metrics[0].update_state(losses_lib.sparse_softmax_cross_entropy(labels, logits),
                                sample_weight=weights)
        metrics[1].update_state(losses_lib.label_is_top(labels, logits), sample_weight=weights)

    # ----------------------------------------------------------------- warm start, export

    def initialize(self, model: keras.Model, init_checkpoint) -> None:
        """Warm starts every weight from a bert-train causal-LM checkpoint.

        Args:
          model: the model from `build_model`.
          init_checkpoint: an `interop.resolve.ResolvedCheckpoint` or a path to resolve.
        """
        checkpoint = init_checkpoint
        if self.checkpoint is not None and init_checkpoint == self.checkpoint.path:
            checkpoint = self.checkpoint  # resolved once, by the command
        super().initialize(model, checkpoint)

    def task_info(self) -> dict:
        """The `task` entry of bert_train.json."""
        return {"name": self.name, "family": TASK_NAME, "block_size": self.config.block_size}

    def check_resume(self, model_dir: str) -> None:
        """Refuses a model_dir trained as another task, model or vocabulary.

        Another block size is another run: warm-start it from this one in a new --model_dir.
        """
        if self._model is None:
            raise RuntimeError("check_resume called before build_model")
        model_dir_lib.check_resume(
            model_dir, encoder_class=type(self._model).__name__,
            encoder_config=self._model.get_config(), vocab_file=self.config.vocab_file,
            lower_case=self.config.lower_case, task=self.task_info(),
            task_keys=("name", "family", "block_size"))

    def write_model_info(self, model_dir: str) -> None:
        """Writes bert_train.json (the CausalLM's config, the task) and copies the vocab."""
        if self._model is None:
            raise RuntimeError("write_model_info called before build_model")
        c = self.config
        model_dir_lib.write_model_info(model_dir, self._model, vocab_file=c.vocab_file,
                                       lower_case=c.lower_case, task=self.task_info())
