"""Registry of fine-tuning datasets: where a task's raw examples come from and what they mean.

`get_task_data(name)` returns a `TaskData`: the task family, its label names, its default
splits, its TFDS source and a column preset for its local files (GLUE's TSV layouts), so both
`--task=mrpc` (TFDS `glue/mrpc`) and `--task=mrpc --train_file=MRPC/train.tsv` work. A task of
your own is `local_task_data(...)` with `--train_file/--eval_file`.

`TaskData.load` returns raw examples as an unbatched `tf.data.Dataset` of dicts, the same
layout whatever the source, so the builders (`classification_data`, `squad_data`,
`tagging_data`) never care where data came from. tf.data rather than Python lists because TFDS
already is tf.data, and classification and tagging tokenize in graph; SQuAD windows host-side
and reads the dataset back in batches (`squad_data.squad_examples`). The layouts, by family:
  classification: {"text": string, "text_b": string (pairs only), "label": int64}
  regression:     the same with "label": float32
  squad:          {"id", "question", "context": string, "answers": {"text": [n] string,
                   "answer_start": [n] int32}, "is_impossible": bool}
  tagging:        {"tokens": [words] string, "tags": [words] int64 (IOB2, index of label_names)}
Unlabeled local files (no label column) give no "label".

Local files are read twice: once eagerly in `load`, which raises every bad-input `UserError`
(file:line) in the caller rather than deep inside a tf.data iterator, then streamed by the
dataset. Both passes stream, so memory stays bounded (SQuAD JSON excepted: JSON is one document).
"""

import dataclasses
import itertools
import math

import tensorflow as tf
from absl import logging

from bert_trainer.data import sources
from bert_trainer.tasks.tagging import data as tagging_data
from bert_trainer.data.sources import TextColumns
from bert_trainer.data.tfds_sources import load_tfds
from bert_trainer.errors import UserError

FAMILIES = ("classification", "regression", "squad", "tagging")
CONLL2003_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC",
                    "I-MISC")  # TFDS conll2003's order, so TFDS and file ids agree.
_TRAIN_EVAL = {"train": "train", "eval": "validation"}
_CHUNK_ROWS = 256


@dataclasses.dataclass(frozen=True)
class TaskData:
    """Where a fine-tuning task's raw examples come from.

    Attributes:
      name: task name (`--task`).
      family: "classification", "regression", "squad" or "tagging".
      label_names: class names in id order (tags for tagging); None for regression and SQuAD,
        and for local data whose labels `with_labels_from` reads from the training file.
      text_keys: raw text keys: ("text",) or ("text", "text_b") for pairs.
      splits: task split ("train", "eval") → TFDS split name.
      tfds_name: TFDS dataset (with config), or None for local files only.
      tfds_keys: raw key → TFDS feature name.
      columns: local TSV/CSV/JSONL column mapping (classification and regression).
      has_header: local TSV/CSV files start with a header row.
      file_format: force the local format ("tsv", "csv", "jsonl", "json", "conll"); None: by
        the file's extension.
      version_2: SQuAD v2.0 (unanswerable questions); pass it on to the `squad_data` builders.
    """

    name: str
    family: str
    label_names: tuple[str, ...] | None = None
    text_keys: tuple[str, ...] = ("text",)
    splits: dict = dataclasses.field(default_factory=lambda: dict(_TRAIN_EVAL))
    tfds_name: str | None = None
    tfds_keys: dict = dataclasses.field(default_factory=dict)
    columns: TextColumns | None = None
    has_header: bool = True
    file_format: str | None = None
    version_2: bool = False

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise UserError(f"task '{self.name}': family '{self.family}' is not one of {FAMILIES}")
        check_label_names(self.label_names or (), f"task '{self.name}': label_names")

    @property
    def is_pair(self) -> bool:
        return "text_b" in self.text_keys

    @property
    def num_labels(self) -> int:
        """Classes (tags) of the task; 1 for regression, 0 for SQuAD."""
        if self.family == "regression":
            return 1
        return len(self.label_names or ())

    def load(self, split: str, *, file: str | None = None, data_dir: str | None = None,
             skip_bad_rows: bool = False, download: bool = False,
             stats: sources.ReadStats | None = None) -> tf.data.Dataset:
        """Raw examples of one split (layout in the module docstring).

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
            return self._load_local(file, skip_bad_rows, stats or sources.ReadStats(file))
        if self.tfds_name is None:
            raise UserError(f"task '{self.name}' has no TFDS source; pass its {split} data with "
                            "--train_file/--eval_file")
        if (self.family in ("classification", "tagging")) and not self.label_names:
            raise UserError(f"task '{self.name}' has no label names; call with_labels_from first")
        raw = load_tfds(self.tfds_name, self.splits.get(split, split), data_dir, download=download)
        return raw.map(self._from_tfds, num_parallel_calls=tf.data.AUTOTUNE)

    def with_labels_from(self, path: str, *, skip_bad_rows: bool = False) -> "TaskData":
        """This task with `label_names` read from a training file when it has none.

        Classes are the distinct labels of the file, sorted (numerically when all are
        integers); tags are "O" then B-/I- of each entity type, types sorted.
        """
        if self.label_names or self.family not in ("classification", "tagging"):
            return self
        if self.family == "tagging":
            tags = set()
            for _, _, row_tags in self._conll(path, skip_bad_rows):
                tags.update(tagging_data.to_iob2(row_tags))
            names = tagging_data.sorted_tags(tags)
        else:
            labels = {r.label.strip() for r in self._records(path, skip_bad_rows)
                      if r.label is not None}
            if not labels:
                raise UserError(f"{path} has no label column to read the label names from; "
                                "map the label column or give the label names")
            numeric = all(lab.lstrip("-").isdigit() for lab in labels)
            names = sorted(labels, key=lambda x: int(x) if numeric else x)
        return dataclasses.replace(self, label_names=tuple(names))

    # -- local files ---------------------------------------------------------------------

    def _records(self, path, skip_bad_rows, stats=None):
        sources.check_file(path)
        fmt = sources.file_format(path, self.file_format)
        columns = self.columns or TextColumns()
        if fmt == "jsonl":
            return sources.read_jsonl(path, columns, skip_bad_rows=skip_bad_rows, stats=stats)
        if fmt not in ("tsv", "csv"):
            raise UserError(f"{path}: task '{self.name}' reads TSV, CSV or JSONL, not {fmt}")
        return sources.read_table(path, columns, delimiter="\t" if fmt == "tsv" else ",",
                                  has_header=self.has_header, skip_bad_rows=skip_bad_rows,
                                  stats=stats)

    def _conll(self, path, skip_bad_rows, stats=None):
        sources.check_file(path)
        fmt = sources.file_format(path, self.file_format)
        if fmt not in ("conll", "tsv"):
            raise UserError(f"{path}: task '{self.name}' reads CoNLL column files, not {fmt}")
        return sources.read_conll(path, skip_bad_rows=skip_bad_rows, stats=stats)

    def _classification_rows(self, path, skip_bad_rows, stats=None):
        """Raw dicts of a local classification/regression file (labels checked)."""
        index = _label_index(self.label_names) if self.family == "classification" else None
        for record in self._records(path, skip_bad_rows, stats):
            row = {"text": record.text}
            if self.is_pair:
                row["text_b"] = record.text_b
            if record.label is not None:
                row["label"] = _parse_label(record.label, index, self.label_names,
                                            f"{path}:{record.line}")
            yield row

    def _tagging_rows(self, path, skip_bad_rows, stats=None):
        """Raw dicts of a local CoNLL file (tags converted to IOB2 and checked)."""
        index = {tag: i for i, tag in enumerate(self.label_names)}
        for first, words, tags in self._conll(path, skip_bad_rows, stats):
            ids = []
            for i, tag in enumerate(tagging_data.to_iob2(tags)):
                if tag not in index:
                    raise UserError(f"{path}:{first + i}: tag {tags[i]!r} is not in the label "
                                    f"set {list(self.label_names)}; fix the tag or the task")
                ids.append(index[tag])
            yield {"tokens": words, "tags": ids}

    def _load_local(self, path, skip_bad_rows, stats):
        if self.family == "squad":
            rows = sources.read_squad_json(path, skip_bad_rows=skip_bad_rows, stats=stats)
            if not self.version_2:
                _refuse_unanswerable(path, rows)
            if stats.skipped:
                logging.warning("%s", stats.summary())
            return _squad_slices(rows)
        if self.family in ("classification", "tagging") and not self.label_names:
            raise UserError(f"task '{self.name}' has no label names; call with_labels_from "
                            f"with the training file before loading {path}")
        make_rows = (self._tagging_rows if self.family == "tagging"
                     else self._classification_rows)
        first = None
        for row in make_rows(path, skip_bad_rows, stats):  # Validation pass: errors raise here.
            first = first or row
        if stats.skipped:
            logging.warning("%s", stats.summary())
        signature = self._local_signature(has_label="label" in first)
        return _stream_rows(lambda: make_rows(path, skip_bad_rows), signature)

    def _local_signature(self, has_label: bool) -> dict:
        if self.family == "tagging":
            return {"tokens": tf.TensorSpec([None], tf.string),
                    "tags": tf.TensorSpec([None], tf.int64)}
        signature = {key: tf.TensorSpec([], tf.string) for key in self.text_keys}
        if has_label:
            dtype = tf.float32 if self.family == "regression" else tf.int64
            signature["label"] = tf.TensorSpec([], dtype)
        return signature

    # -- TFDS ----------------------------------------------------------------------------

    def _from_tfds(self, example: dict) -> dict:
        """A TFDS example in the raw layout of the task's family (graph function)."""
        if self.family == "squad":
            return {"id": example["id"], "question": example["question"],
                    "context": example["context"], "answers": example["answers"],
                    "is_impossible": example.get("is_impossible", tf.constant(False))}
        if self.family == "tagging":
            tags = tagging_data.iob2_ids(example[self.tfds_keys["tags"]], self.label_names)
            return {"tokens": example[self.tfds_keys["tokens"]], "tags": tags}
        row = {key: example[self.tfds_keys.get(key, key)] for key in self.text_keys}
        dtype = tf.float32 if self.family == "regression" else tf.int64
        row["label"] = tf.cast(example[self.tfds_keys.get("label", "label")], dtype)
        return row


def _squad_slices(rows: list[dict]) -> tf.data.Dataset:
    """SQuAD rows (already in memory: JSON is read whole) as a dataset, without a generator."""
    answers = [row["answers"] for row in rows]
    lengths = [len(a["text"]) for a in answers]
    ragged = lambda key, dtype: tf.RaggedTensor.from_row_lengths(
        tf.constant([x for a in answers for x in a[key]], dtype), lengths)
    columns = {key: tf.constant([row[key] for row in rows]) for key in (
        "id", "question", "context", "is_impossible")}
    columns["answers"] = {"text": ragged("text", tf.string),
                          "answer_start": ragged("answer_start", tf.int32)}
    return tf.data.Dataset.from_tensor_slices(columns)


def _stream_rows(make_rows, signature: dict) -> tf.data.Dataset:
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


def _label_index(label_names) -> dict:
    """Raw label string → id: a label's name, or its id written as an integer (GLUE's 0/1
    files for named classes). Names that are integers themselves get no id fallback: "1"
    must then mean the class named "1"."""
    numeric = any(name.lstrip("-").isdigit() for name in label_names)
    index = {} if numeric else {str(i): i for i in range(len(label_names))}
    index.update({name: i for i, name in enumerate(label_names)})
    return index


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


def _refuse_unanswerable(path: str, rows: list[dict]) -> None:
    """A SQuAD v1.1 task reading a v2.0 file: v1.1 has no way to train or score "no answer"."""
    for row in rows:
        if row["is_impossible"] or not row["answers"]["text"]:
            raise UserError(f"{path}: question {row['id']} is unanswerable (SQuAD v2); use "
                            "--task=squad_v2")


def _parse_label(value: str, index: dict | None, label_names, where: str):
    if index is None:  # Regression.
        try:
            number = float(value)
        except ValueError:
            raise UserError(f"{where}: regression label {value!r} is not a number; "
                            "fix the label or the label column") from None
        if not math.isfinite(number):  # NaN/Inf would poison the loss at the first step.
            raise UserError(f"{where}: label {value!r} is not a finite number; fix the label")
        return number
    label = index.get(value.strip())
    if label is None:
        raise UserError(f"{where}: label {value!r} is not in the label set {list(label_names)} "
                        "(names or ids); fix the label or the task's label names")
    return label


def _glue(name, label_names, tfds_keys, columns, *, family="classification", has_header=True,
          splits=None):
    text_keys = ("text", "text_b") if "text_b" in tfds_keys else ("text",)
    return TaskData(name=name, family=family, label_names=label_names, text_keys=text_keys,
                    splits=splits or dict(_TRAIN_EVAL), tfds_name=f"glue/{name}",
                    tfds_keys=tfds_keys, columns=columns, has_header=has_header)


_ENTAIL = ("entailment", "not_entailment")
_REGISTRY = {task.name: task for task in (
    TaskData(name="imdb", family="classification", label_names=("neg", "pos"),
             splits={"train": "train", "eval": "test"}, tfds_name="imdb_reviews",
             columns=TextColumns("sentence", None, "label")),
    # GLUE: TFDS feature names, then the column preset of GLUE's own TSV files.
    _glue("cola", ("unacceptable", "acceptable"), {"text": "sentence"},
          TextColumns(3, None, 1), has_header=False),
    _glue("sst2", ("negative", "positive"), {"text": "sentence"},
          TextColumns("sentence", None, "label")),
    _glue("mrpc", ("not_equivalent", "equivalent"),
          {"text": "sentence1", "text_b": "sentence2"},
          TextColumns("#1 String", "#2 String", "Quality")),
    _glue("qqp", ("not_duplicate", "duplicate"), {"text": "question1", "text_b": "question2"},
          TextColumns("question1", "question2", "is_duplicate")),
    _glue("stsb", None, {"text": "sentence1", "text_b": "sentence2"},
          TextColumns("sentence1", "sentence2", "score"), family="regression"),
    _glue("mnli", ("entailment", "neutral", "contradiction"),
          {"text": "premise", "text_b": "hypothesis"},
          TextColumns("sentence1", "sentence2", "gold_label"),
          splits={"train": "train", "eval": "validation_matched"}),
    _glue("qnli", _ENTAIL, {"text": "question", "text_b": "sentence"},
          TextColumns("question", "sentence", "label")),
    _glue("rte", _ENTAIL, {"text": "sentence1", "text_b": "sentence2"},
          TextColumns("sentence1", "sentence2", "label")),
    _glue("wnli", ("not_entailment", "entailment"), {"text": "sentence1", "text_b": "sentence2"},
          TextColumns("sentence1", "sentence2", "label")),
    TaskData(name="squad", family="squad", tfds_name="squad/v1.1", file_format="json"),
    TaskData(name="squad_v2", family="squad", tfds_name="squad/v2.0", file_format="json",
             version_2=True),
    TaskData(name="conll2003", family="tagging", label_names=CONLL2003_LABELS,
             splits={"train": "train", "eval": "dev"}, tfds_name="conll2003",
             tfds_keys={"tokens": "tokens", "tags": "ner"}, file_format="conll"),
)}


def task_names() -> list[str]:
    """Names `get_task_data` knows."""
    return sorted(_REGISTRY)


def get_task_data(name: str) -> TaskData:
    """The registered `TaskData` of a task name.

    Raises:
      UserError: unknown name (the message lists the known ones).
    """
    if name not in _REGISTRY:
        raise UserError(f"unknown task '{name}'; choose one of {', '.join(task_names())}, or "
                        "use your own files with --train_file/--eval_file")
    return _REGISTRY[name]


def local_task_data(name: str, family: str, *, label_names=None, columns: TextColumns | None = None,
                    has_header: bool = True, file_format: str | None = None,
                    version_2: bool = False) -> TaskData:
    """A task read only from local files (`--train_file/--eval_file`).

    Args:
      name: task name used in messages.
      family: "classification", "regression", "squad" or "tagging".
      label_names: class names (tags) in id order; None to read them from the training file
        with `TaskData.with_labels_from`.
      columns: TSV/CSV/JSONL columns of text, text_b and label (default "text", "label").
      has_header: TSV/CSV files start with a header row.
      file_format: force a format instead of reading it from the file extension.
      version_2: a SQuAD v2.0 task (unanswerable questions).

    Returns:
      The `TaskData`.
    """
    columns = columns or TextColumns()
    text_keys = ("text", "text_b") if columns.text_b is not None else ("text",)
    return TaskData(name=name, family=family, text_keys=text_keys, columns=columns,
                    label_names=tuple(label_names) if label_names else None,
                    has_header=has_header, file_format=file_format, version_2=version_2)
