"""What a fine-tuning task's raw examples are and where they come from.

A `TaskData` names a task, its family (an `ExampleReader`: the task family object of
`bert_trainer.tasks`), its label names, its default splits, its TFDS source and a column
preset for its local files (GLUE's TSV layouts), so both `--task=mrpc` (TFDS `glue/mrpc`) and
`--task=mrpc --train_file=MRPC/train.tsv` work. Each family declares its datasets (presets) in
its own package; `bert_trainer.tasks.registry` collects them.

`TaskData.load` returns raw examples as an unbatched `tf.data.Dataset` of dicts, the same
layout whatever the source, so a family's dataset builders never care where data came from.
tf.data rather than Python lists because TFDS already is tf.data, and classification and
tagging tokenize in graph. Each family documents its layout (its `read_local` docstring).
Unlabeled local files (no label column) give no "label".

Local files are read twice: once eagerly in `load`, which raises every bad-input `UserError`
(file:line) in the caller rather than deep inside a tf.data iterator, then streamed by the
dataset (`validated_stream`). Both passes stream, so memory stays bounded.
"""

import dataclasses
import functools
import itertools

import tensorflow as tf
from absl import logging

from bert_trainer.data import sources
from bert_trainer.data.sources import TextColumns
from bert_trainer.data.tfds_sources import load_tfds
from bert_trainer.errors import UserError

TRAIN_EVAL = {"train": "train", "eval": "validation"}
_CHUNK_ROWS = 256


class ExampleReader:
    """How a task family reads its raw examples (a family object implements this).

    Attributes:
      name: the family's name, e.g. "classification".
      has_label_names: the family's labels are named classes (tags): a task needs its
        `label_names`, read from the training file when it has none.
    """

    name: str = ""
    has_label_names: bool = False

    def num_labels(self, task_data: "TaskData") -> int:
        """Outputs per example of the family's head: by default the number of label names."""
        return len(task_data.label_names or ())

    def read_local(self, task_data: "TaskData", path: str, skip_bad_rows: bool,
                   stats: sources.ReadStats) -> tf.data.Dataset:
        """Raw examples of a local file; bad input raises a `UserError` naming file:line."""
        raise UserError(f"task '{task_data.name}' ({self.name}) reads no local files")

    def from_tfds(self, task_data: "TaskData", example: dict) -> dict:
        """A TFDS example in the family's raw layout (graph function)."""
        raise NotImplementedError

    def labels_from_file(self, task_data: "TaskData", path: str,
                         skip_bad_rows: bool) -> tuple[str, ...]:
        """The label names of a training file (has_label_names families only)."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class TaskData:
    """Where a fine-tuning task's raw examples come from.

    Attributes:
      name: task name (`--task`).
      family: the task family (an `ExampleReader`), which reads the examples.
      label_names: class names in id order (tags for tagging); None for families without
        named labels, and for local data whose labels `with_labels_from` reads from the
        training file.
      text_keys: raw text keys: ("text",) or ("text", "text_b") for pairs.
      splits: task split ("train", "eval") → TFDS split name.
      tfds_name: TFDS dataset (with config), or None for local files only.
      tfds_keys: raw key → TFDS feature name.
      columns: local TSV/CSV/JSONL column mapping (classification and regression).
      has_header: local TSV/CSV files start with a header row.
      file_format: force the local format ("tsv", "csv", "jsonl", "json", "conll"); None: by
        the file's extension.
      version_2: SQuAD v2.0 (unanswerable questions).
    """

    name: str
    family: ExampleReader
    label_names: tuple[str, ...] | None = None
    text_keys: tuple[str, ...] = ("text",)
    splits: dict = dataclasses.field(default_factory=lambda: dict(TRAIN_EVAL))
    tfds_name: str | None = None
    tfds_keys: dict = dataclasses.field(default_factory=dict)
    columns: TextColumns | None = None
    has_header: bool = True
    file_format: str | None = None
    version_2: bool = False

    def __post_init__(self):
        if not isinstance(self.family, ExampleReader):
            raise UserError(f"task '{self.name}': {self.family!r} is not a task family")
        check_label_names(self.label_names or (), f"task '{self.name}': label_names")

    @property
    def family_name(self) -> str:
        """The family's name."""
        return self.family.name

    @property
    def is_pair(self) -> bool:
        return "text_b" in self.text_keys

    @property
    def num_labels(self) -> int:
        """Outputs of the family's head (classes, tags; 1 for regression)."""
        return self.family.num_labels(self)

    def load(self, split: str, *, file: str | None = None, data_dir: str | None = None,
             skip_bad_rows: bool = False, download: bool = False,
             stats: sources.ReadStats | None = None) -> tf.data.Dataset:
        """Raw examples of one split (layout: the family's docstring).

        Args:
          split: "train", "eval", or any TFDS split name of the task's dataset.
          file: a local file to read instead of TFDS (`--train_file` / `--eval_file`).
          data_dir: TFDS data directory (TFDS source only).
          skip_bad_rows: skip and count malformed rows of local files instead of raising.
          download: let TFDS download a missing dataset (needs network).
          stats: receives the counts of a local file (examples, skipped rows).

        Returns:
          Unbatched `tf.data.Dataset` of raw example dicts.
        """
        if file is not None:
            return self.family.read_local(self, file, skip_bad_rows,
                                          stats or sources.ReadStats(file))
        if self.tfds_name is None:
            raise UserError(f"task '{self.name}' has no TFDS source; pass its {split} data with "
                            "--train_file/--eval_file")
        self.require_label_names()
        raw = load_tfds(self.tfds_name, self.splits.get(split, split), data_dir, download=download)
        return raw.map(functools.partial(self.family.from_tfds, self),
                       num_parallel_calls=tf.data.AUTOTUNE)

    def require_label_names(self, path: str | None = None) -> None:
        """Raises a UserError when the family names its labels but this task has none."""
        if self.family.has_label_names and not self.label_names:
            where = f" before loading {path}" if path else ""
            raise UserError(f"task '{self.name}' has no label names; call with_labels_from "
                            f"with the training file{where}")

    def with_labels_from(self, path: str, *, skip_bad_rows: bool = False) -> "TaskData":
        """This task with `label_names` read from a training file when it has none (how:
        the family's `labels_from_file`)."""
        if self.label_names or not self.family.has_label_names:
            return self
        names = self.family.labels_from_file(self, path, skip_bad_rows)
        return dataclasses.replace(self, label_names=tuple(names))


def validated_stream(make_rows, signature_of, stats: sources.ReadStats) -> tf.data.Dataset:
    """Reads every row once (bad input raises here, in the caller), then streams them.

    Args:
      make_rows: (stats or None) -> iterator of raw example dicts (raises `UserError` on bad
        input); the validation pass counts into `stats`, the stream counts nothing.
      signature_of: first row -> key → `tf.TensorSpec` of one row ([] or [None]).
      stats: the file's counts; skipped rows are logged.

    Returns:
      Unbatched dataset of the rows (see `stream_rows`).
    """
    first = None
    for row in make_rows(stats):  # Validation pass: errors raise here.
        first = first or row
    if stats.skipped:
        logging.warning("%s", stats.summary())
    return stream_rows(lambda: make_rows(None), signature_of(first))


def stream_rows(make_rows, signature: dict) -> tf.data.Dataset:
    """Rows of a Python generator as a dataset, handed over `_CHUNK_ROWS` at a time.

    `from_generator` costs about a millisecond per element, so whole chunks (columns, with
    list-valued fields flattened plus their lengths) cross into tf.data and are unbatched
    there.

    Args:
      make_rows: () -> iterator of dicts with the keys of `signature`.
      signature: key → `tf.TensorSpec` of one row: shape [] or [None] (a list).

    Returns:
      Unbatched dataset of rows; list fields come out as 1-D tensors.
    """
    lists = [k for k, spec in signature.items() if spec.shape.rank == 1]

    def chunks():
        rows = make_rows()
        while chunk := list(itertools.islice(rows, _CHUNK_ROWS)):
            out = {k: [row[k] for row in chunk] for k in signature}
            for key in lists:
                out[f"{key}/lengths"] = [len(v) for v in out[key]]
                out[key] = [x for v in out[key] for x in v]
            yield out

    chunk_signature = {k: tf.TensorSpec([None], spec.dtype) for k, spec in signature.items()}
    chunk_signature.update({f"{k}/lengths": tf.TensorSpec([None], tf.int64) for k in lists})

    def rows_of(chunk):
        out = {k: chunk[k] for k in signature}
        for key in lists:
            out[key] = tf.RaggedTensor.from_row_lengths(out[key], chunk[f"{key}/lengths"])
        return out

    return tf.data.Dataset.from_generator(chunks, output_signature=chunk_signature).map(
        rows_of).unbatch()


def check_label_names(names, what: str) -> None:
    """Raises a one-line UserError when a class name is empty or listed twice.

    Args:
      names: class names (tags) in id order.
      what: names their source in the message, e.g. "--label_names".
    """
    seen = set()
    for name in names:
        if not str(name).strip():
            raise UserError(f"{what} holds an empty name; give every class a name")
        if name in seen:
            raise UserError(f"{what} lists {name!r} twice; class names must be unique")
        seen.add(name)
