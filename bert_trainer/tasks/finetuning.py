"""What every fine-tuning task shares: the encoder it starts from, its data, warm start, model info.

A fine-tuning task is a `Task` whose model is a pretrained encoder plus a small head. Each
task family (`bert_trainer/tasks/<family>/task.py`) subclasses `FinetuningTask` and adds the
head, the losses and the metrics; this module owns the parts that do not depend on the head:

- `EncoderSpec` (`encoder_spec.py`, re-exported here): how to build the encoder and which
  vocabulary tokenizes for it; checked against the vocabulary and the sequence length up
  front, before anything is trained.
- `DataConfig` / `FinetuneConfig`: where examples come from and the few hyperparameters every
  family shares (gin configures `FinetuneConfig`).
- `initialize`: warm-starts the encoder only, through the resolved checkpoint's loader (the
  head stays initialized), and logs both.
- `write_model_info`: `bert_train.json` + vocab, with the task description an export needs.
"""

import dataclasses
import json
import math
import os

import keras
import tensorflow as tf
import tensorflow_datasets as tfds
from absl import logging

from bert_trainer.checkpoints import model_dir as model_dir_lib
from bert_trainer.checkpoints import storage
from bert_trainer.data import sources, windows
from bert_trainer.data.input_utils import PipelineOptions
from bert_trainer.data.task_data import TaskData
from bert_trainer.data.tokenizer import Tokenizer
from bert_trainer.errors import UserError, require_positive_ints
from bert_trainer.interop import resolve
from bert_trainer.interop.resolve import ResolvedCheckpoint
from bert_trainer.models import EncoderModel
from bert_trainer.tasks.base import Task
from bert_trainer.tasks.encoder_spec import (  # noqa: F401 (re-exported: the task's inputs)
    EncoderSpec,
    spec_from_checkpoint,
    spec_from_encoder,
)

EVAL_RESULTS_FILE = "eval_results.json"


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where a task's examples come from (the command's data flags).

    Attributes:
      train_file, eval_file: local files; None reads the task's TFDS dataset.
      data_dir: the TFDS data directory (None: TFDS's default).
      max_train_examples: train on the first N training examples only.
      max_eval_examples: evaluate on the first N evaluation examples only.
      skip_bad_rows: skip and count malformed rows of local files instead of failing.
    """

    train_file: str | None = None
    eval_file: str | None = None
    data_dir: str | None = None
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    skip_bad_rows: bool = False

    def __post_init__(self):
        for name in ("max_train_examples", "max_eval_examples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UserError(f"--{name}={value} must be >= 1")


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """Hyperparameters every fine-tuning family shares (gin: `FinetuneConfig.*`).

    Attributes:
      seq_length: packed sequence length (<= the encoder's max_sequence_length).
      train_batch_size, eval_batch_size: global batch sizes (summed over replicas).
      num_epochs: passes over the training examples when no step count is given.
      warmup_fraction: linear warmup over this fraction of the run; None keeps
        `OptimizerConfig.warmup_steps`.
      dropout_rate: dropout in front of the head.
      encoder_dropout: the encoder's `output_dropout` and `attention_dropout` for this run;
        None keeps the checkpoint's (an encoder pretrained without dropout, as
        configs/cram.gin does, fine-tunes better with it back on).
      shuffle_buffer: training examples held by the shuffle buffer.
      seed: the shuffle seed (the order must repeat exactly for a resumed run).
      length_buckets: every batch is cut to the smallest of at most this many widths (chosen
        from the data) that holds its longest example (`data.length_buckets`); 0 pads every
        batch to `seq_length`. Off on TPUs, which need one static shape.
      group_by_length: training batches hold examples of one width: fewer padded slots where
        the fused kernels do not skip them anyway (GPU, TPU, XLA), but where an example's
        length says something of its label, batches of mostly one class, which can slow
        learning. Off by default.
      long_texts: classification and tagging texts longer than `seq_length`: "windows" (cut
        into overlapping windows: each window trains as a row, evaluation and prediction
        combine them, see `data/windows.py`), "truncate" (keep the first pieces) or
        "head_tail" (classification and regression of single texts: keep the first quarter of
        the row and fill the rest from the text's end, Sun et al. 2019).
      doc_stride: pieces between window starts; None: half a window.
      window_pooling: how a text's window logits combine (classification, regression):
        "mean" or "max".
      pooling: what a classification or regression head reads: "cls" (the encoder's pooled
        [CLS] output, BERT's) or "mean" (the mean of the tokens' outputs; see
        `models.BertClassifier`).
    """

    seq_length: int = 128
    train_batch_size: int = 32
    eval_batch_size: int = 32
    num_epochs: float = 3.0
    warmup_fraction: float | None = 0.1
    dropout_rate: float = 0.1
    encoder_dropout: float | None = None
    shuffle_buffer: int = 10_000
    seed: int = 42
    length_buckets: int = 8
    group_by_length: bool = False
    long_texts: str = "windows"
    doc_stride: int | None = None
    window_pooling: str = "mean"
    pooling: str = "cls"

    def __post_init__(self):
        if self.pooling not in ("cls", "mean"):
            raise UserError(f"FinetuneConfig.pooling={self.pooling!r} is unknown; use cls or "
                            "mean")
        if self.length_buckets < 0:
            raise UserError(f"length_buckets={self.length_buckets} must be >= 0 (0: off)")
        require_positive_ints(self, ("seq_length", "train_batch_size", "eval_batch_size",
                                     "shuffle_buffer"))
        if not (math.isfinite(self.num_epochs) and self.num_epochs > 0):
            raise UserError(f"num_epochs={self.num_epochs} must be > 0 and finite")
        if self.warmup_fraction is not None and not 0 <= self.warmup_fraction < 1:
            raise UserError(f"warmup_fraction={self.warmup_fraction} must be in [0, 1)")
        for field in ("dropout_rate", "encoder_dropout"):
            value = getattr(self, field)
            if value is not None and not 0 <= value < 1:
                raise UserError(f"{field}={value} must be in [0, 1)")

    def train_steps(self, num_examples: int) -> int:
        """Optimizer steps for `num_epochs` passes over `num_examples` (at least 1)."""
        return max(1, math.ceil(num_examples * self.num_epochs / self.train_batch_size))

    def warmup_steps(self, train_steps: int) -> int | None:
        """Warmup steps of a run of `train_steps`; None when `warmup_fraction` is None."""
        if self.warmup_fraction is None:
            return None
        return int(self.warmup_fraction * train_steps)


def stored_config_options(task: dict | None) -> dict:
    """The `FinetuneConfig` fields a model directory's task entry records about how its
    model reads text (the sequence length, the windowing options, the head's pooling), for
    rebuilding the task; a field it does not record keeps `FinetuneConfig`'s default."""
    task = task or {}
    recorded = {name: task[name] for name in ("seq_length", "pooling") if name in task}
    if "seq_length" in recorded:
        recorded["seq_length"] = int(recorded["seq_length"])
    return {**windows.stored_options(task), **recorded}


class FinetuningTask(Task):
    """A pretrained encoder plus a head, trained on one task's examples.

    Subclasses set `family`, `build_head_model`, `build_inputs`, losses and metrics.

    Args:
      task_data: the task's examples and labels (`bert_trainer.data.task_data`).
      encoder: the encoder to build and its vocabulary.
      config: shared hyperparameters (None: the defaults).
      data: where the examples come from (None: the task's TFDS dataset).

    Attributes:
      best_metric: the eval metric whose best checkpoint the trainer keeps by default.
      best_metric_mode: "max" or "min".
      tokenizer: the `Tokenizer` of `encoder.vocab_file`.
      model: the model `build_model` built last (None before).
      warm_start_report: {"loaded", "initialized"} variable paths of the last `initialize`.
      run_settings: the `run_settings.RunSettings` the command derived (None: none), written
        to bert_train.json.
    """

    family: str = ""
    train_split = "train"
    eval_split = "eval"  # TaskData's name; it maps to the dataset's validation/dev/test split.
    best_metric: str = "accuracy"
    best_metric_mode: str = "max"
    windowed: bool = False  # long texts are cut into windows, each a training row

    def __init__(self, task_data: TaskData, encoder: EncoderSpec, *,
                 config: FinetuneConfig | None = None, data: DataConfig | None = None):
        if task_data.family_name not in self.families():
            raise UserError(f"task '{task_data.name}' is a {task_data.family_name} task, not "
                            f"one of {self.families()}")
        self.name = task_data.name
        self.task_data = task_data
        self.encoder_spec = encoder
        self.config = config = config or FinetuneConfig()
        self.data = data or DataConfig()
        if config.encoder_dropout is not None:
            rate = config.encoder_dropout
            encoder = self.encoder_spec = dataclasses.replace(
                encoder, config={**encoder.config, "output_dropout": rate,
                                 "attention_dropout": rate})
        if config.seq_length > encoder.max_sequence_length:
            raise UserError(f"seq_length={config.seq_length} exceeds the encoder's "
                            f"max_sequence_length={encoder.max_sequence_length} "
                            f"({encoder.source}); use --seq_length <= "
                            f"{encoder.max_sequence_length}")
        self.tokenizer = Tokenizer(encoder.vocab_file, lower_case=encoder.lower_case)
        if self.tokenizer.vocab_size != encoder.vocab_size:
            raise UserError(f"vocab file {encoder.vocab_file} has {self.tokenizer.vocab_size} "
                            f"tokens but the encoder ({encoder.source}) has vocab_size="
                            f"{encoder.vocab_size}; pass the vocabulary the encoder was "
                            "trained with")
        self.model = None
        self.warm_start_report = None
        self.run_settings = None

    @classmethod
    def families(cls) -> tuple[str, ...]:
        """The `TaskData.family_name` values this class trains."""
        return (cls.family,)

    # -- model -----------------------------------------------------------------------------

    def build_model(self) -> keras.Model:
        self.model = self.build_head_model(self.encoder_spec.build())
        return self.model

    def build_head_model(self, encoder: keras.Model) -> keras.Model:
        """The task model around a freshly built `encoder`: `head_model` with this task's
        options."""
        return self.head_model(encoder)

    @classmethod
    def head_model(cls, encoder: keras.Model, **options) -> keras.Model:
        """The task model around `encoder` (it must expose `.encoder`): the one way the
        family builds its head, for training (`build_head_model`) and for export
        (`Family.head_model`, with the options a model directory stores)."""
        raise NotImplementedError

    def flops_counter(self, model: keras.Model):
        """Asks the model (`EncoderModel.training_flops`: the encoder's sizes, the heads'
        kernels, the tokens it packed), whatever the family; None for another kind of model."""
        if not (isinstance(model, EncoderModel) and model.counts_flops):
            return None
        return lambda features, outputs: model.training_flops(self.model_inputs(features),
                                                              outputs)

    def initialize(self, model: keras.Model,
                   init_checkpoint: str | ResolvedCheckpoint) -> None:
        """Loads the encoder's weights from a pretrained checkpoint; the head stays initialized.

        Args:
          model: the model from `build_model`.
          init_checkpoint: a `ResolvedCheckpoint`, or a path: the checkpoint the encoder spec
            was read from is not read again; any other is resolved (any format, or a prefix).
        """
        checkpoint = self._resolved(init_checkpoint)
        report = checkpoint.load(encoder=model.encoder)
        encoder_ids = {id(v) for v in model.encoder.weights}
        head = [v.path for v in model.weights if id(v) not in encoder_ids]
        missing = (f"{len(report['initialized'])} encoder variables the checkpoint lacks "
                   f"{report['initialized']} and " if report["initialized"] else "")
        logging.info("Warm start from %s: loaded %d encoder variables; left initialized: "
                     "%sthe %d head variables %s", checkpoint.path, len(report["loaded"]),
                     missing, len(head), head)
        self.warm_start_report = {"loaded": report["loaded"],
                                  "initialized": report["initialized"] + head}

    def _resolved(self, init_checkpoint) -> ResolvedCheckpoint:
        if isinstance(init_checkpoint, ResolvedCheckpoint):
            return init_checkpoint
        spec_checkpoint = self.encoder_spec.checkpoint
        if spec_checkpoint is not None and spec_checkpoint.path == init_checkpoint:
            return spec_checkpoint
        return resolve.as_resolved(init_checkpoint)

    # -- data ------------------------------------------------------------------------------

    def global_batch_size(self, is_training: bool) -> int:
        return self.config.train_batch_size if is_training else self.config.eval_batch_size

    def _file(self, split: str) -> str | None:
        return self.data.train_file if split == self.train_split else self.data.eval_file

    def raw_examples(self, split: str) -> tf.data.Dataset:
        """Unbatched raw examples of a split, cut to `max_train/eval_examples`."""
        raw = self.task_data.load(split, file=self._file(split), data_dir=self.data.data_dir,
                                  skip_bad_rows=self.data.skip_bad_rows)
        limit = self._limit(split)
        return raw if limit is None else raw.take(limit)

    def _limit(self, split: str) -> int | None:
        return (self.data.max_train_examples if split == self.train_split
                else self.data.max_eval_examples)

    def num_examples(self, split: str) -> int:
        """Examples in a split (rows, questions or sentences), after the `max_*` cut.

        Local files are counted (one read); TFDS splits come from the dataset's info. SQuAD
        counts questions, not windows, as google-research/bert does for its step count.
        """
        file = self._file(split)
        if file is not None:
            stats = sources.ReadStats(file)
            self.task_data.load(split, file=file, skip_bad_rows=self.data.skip_bad_rows,
                                stats=stats)
            count = stats.examples
        else:
            self.task_data.load(split, data_dir=self.data.data_dir)  # One-line error if absent.
            tfds_split = self.task_data.splits.get(split, split)
            builder = tfds.builder(self.task_data.tfds_name, data_dir=self.data.data_dir)
            count = builder.info.splits[tfds_split].num_examples
        limit = self._limit(split)
        return count if limit is None else min(count, limit)

    def num_train_rows(self) -> int:
        """Rows one epoch trains on: the training examples; tasks that cut long texts into
        windows (`windowed`) count the windows (`num_epochs` passes over every row)."""
        if not self.windowed:
            return self.num_examples(self.train_split)
        texts, rows = self.count_windows(self.raw_examples(self.train_split))
        logging.info("%d training texts make %d windows of seq_length %d: an epoch trains on "
                     "every window", texts, rows, self.config.seq_length)
        return rows

    def count_windows(self, raw: tf.data.Dataset) -> tuple[int, int]:
        """(texts, windows) of raw examples, for a `windowed` task (tokenizes them once)."""
        raise NotImplementedError

    def pipeline_options(self, is_training: bool, input_context) -> PipelineOptions:
        """The `PipelineOptions` the family's dataset builder takes for one pipeline."""
        batch = self.global_batch_size(is_training)
        if input_context is not None:
            batch = input_context.get_per_replica_batch_size(batch)
        # Deterministic order and a fixed seed: a resumed run skips exactly the batches the
        # interrupted one trained on (see Task.build_inputs).
        buckets = self.config.length_buckets
        if buckets > 1 and tf.config.list_logical_devices("TPU"):
            logging.info("Length buckets off: TPUs compile one static shape")
            buckets = 0
        return PipelineOptions(batch_size=batch, is_training=is_training,
                               input_context=input_context,
                               shuffle_buffer=self.config.shuffle_buffer, seed=self.config.seed,
                               deterministic=True, length_buckets=buckets,
                               group_by_length=self.config.group_by_length)

    # -- model info ------------------------------------------------------------------------

    def task_info(self) -> dict:
        """JSON description of the task: enough to rebuild it for evaluation and export."""
        td = self.task_data
        columns = dataclasses.asdict(td.columns) if td.columns is not None else None
        return {"name": self.name, "family": td.family_name,
                "family_module": td.family.module_name(),
                "label_names": list(td.label_names) if td.label_names else None,
                "seq_length": self.config.seq_length, "text_keys": list(td.text_keys),
                "columns": columns, "has_header": td.has_header, "file_format": td.file_format,
                "best_metric": self.best_metric, "best_metric_mode": self.best_metric_mode}

    def check_resume(self, model_dir: str) -> None:
        """Refuses a model_dir trained as another task, label set, sequence length, encoder or
        vocabulary (see `model_dir.check_resume`)."""
        spec = self.encoder_spec
        model_dir_lib.check_resume(
            model_dir, encoder_class=spec.registered_name.rpartition(">")[2],
            encoder_config=spec.config, vocab_file=spec.vocab_file, lower_case=spec.lower_case,
            task=self.task_info())

    def write_model_info(self, model_dir: str) -> None:
        if self.model is None:
            raise RuntimeError("write_model_info: build_model was not called")
        settings = self.run_settings.to_json() if self.run_settings is not None else None
        model_dir_lib.write_model_info(
            model_dir, self.model.encoder, vocab_file=self.encoder_spec.vocab_file,
            lower_case=self.encoder_spec.lower_case, task=self.task_info(),
            run_settings=settings)


def write_eval_results(model_dir: str, task: FinetuningTask, metrics: dict[str, float], *,
                       step: int, checkpoint: str | None, path: str | None = None) -> str:
    """Writes model_dir/eval_results.json: the task, the checkpoint evaluated and its metrics.

    `path` writes another file instead (`evaluate` writes its own: eval_results-CKPT.json).

    Returns:
      The path written (atomically: a reader never sees half a file).
    """
    record = {"task": task.name, "family": task.task_data.family_name, "step": int(step),
              "checkpoint": checkpoint, "eval_file": task.data.eval_file,
              "metrics": {k: float(v) for k, v in sorted(metrics.items())}}
    path = path or os.path.join(model_dir, EVAL_RESULTS_FILE)
    storage.write_text_atomically(path, json.dumps(record, indent=2) + "\n")
    return path
