"""The classification family: IMDB, the GLUE classification tasks, and your own labelled texts.

Raw examples (`TaskData.load`): {"text": string, "text_b": string (pairs only), "label":
int64 class id}. Local files are TSV, CSV or JSONL read through a column mapping
(`sources.TextColumns`); labels are class names, or their ids written as integers.
"""

import decimal

import tensorflow as tf
from absl import logging

from bert_trainer.data import sources, windows
from bert_trainer.data.sources import TextColumns
from bert_trainer.data.task_data import TRAIN_EVAL, TaskData, validated_stream
from bert_trainer.errors import UserError
from bert_trainer.models.bert_classifier import POOLINGS
from bert_trainer.tasks.classification.serving import ClassifierServing
from bert_trainer.tasks.classification.task import SentenceClassificationTask
from bert_trainer.tasks.family import Family, decode, mark_truncated, num_classes

_ENTAIL = ("entailment", "not_entailment")


def glue(name, label_names, tfds_keys, columns, *, family, has_header=True, splits=None):
    """A GLUE task: its TFDS features (`tfds_keys`) and the columns of GLUE's own TSVs."""
    text_keys = ("text", "text_b") if "text_b" in tfds_keys else ("text",)
    return TaskData(name=name, family=family, label_names=label_names, text_keys=text_keys,
                    splits=splits or dict(TRAIN_EVAL), tfds_name=f"glue/{name}",
                    tfds_keys=tfds_keys, columns=columns, has_header=has_header)


def _label_index(label_names) -> dict:
    """Raw label string → id: a label's name, or its id written as an integer (GLUE's 0/1
    files for named classes). Names that are integers themselves get no id fallback: "1"
    must then mean the class named "1"."""
    numeric = any(name.lstrip("-").isdigit() for name in label_names)
    index = {} if numeric else {str(i): i for i in range(len(label_names))}
    index.update({name: i for i, name in enumerate(label_names)})
    return index


def _shown(label_names, most: int = 20) -> str:
    """The label set as a message shows it: every name, or the first `most` and the count."""
    names = list(label_names)
    if len(names) <= most:
        return str(names)
    return f"{str(names[:most])[:-1]}, ... ({len(names)} names)]"


def _number(label: str) -> decimal.Decimal | None:
    """The finite number a label spells ("1.0" and "01" spell 1), else None. Decimal, not
    float: two long integer labels must not compare equal by rounding."""
    try:
        number = decimal.Decimal(label)
    except decimal.InvalidOperation:
        return None
    return number if number.is_finite() else None


def stored_pooling(task: dict, where: str) -> str:
    """The head's pooling a task entry records ("cls" when it records none); a value this
    version does not know is one line naming the file."""
    pooling = task.get("pooling", "cls")
    if pooling not in POOLINGS:
        raise UserError(f"{where}: task.pooling={pooling!r} is unknown; use one of "
                        f"{', '.join(POOLINGS)}")
    return pooling


class ClassificationFamily(Family):
    """Sentence (pair) classification (see the module docstring)."""

    name = "classification"
    recipe = "configs/tasks/classification.gin"
    task_class = SentenceClassificationTask
    local_tasks = ("classification",)
    reads_columns = True
    has_label_names = True
    window_pooling = True
    head_tail = True
    input_orders = (("text", "text_b"), ("text",))
    answer_outputs = ("probabilities",)
    label_dtype = tf.int64

    def presets(self):
        return (
            TaskData(name="imdb", family=self, label_names=("neg", "pos"),
                     splits={"train": "train", "eval": "test"}, tfds_name="imdb_reviews",
                     columns=TextColumns("sentence", None, "label")),
            # GLUE: TFDS feature names, then the column preset of GLUE's own TSV files.
            glue("cola", ("unacceptable", "acceptable"), {"text": "sentence"},
                 TextColumns(3, None, 1), has_header=False, family=self),
            glue("sst2", ("negative", "positive"), {"text": "sentence"},
                 TextColumns("sentence", None, "label"), family=self),
            glue("mrpc", ("not_equivalent", "equivalent"),
                 {"text": "sentence1", "text_b": "sentence2"},
                 TextColumns("#1 String", "#2 String", "Quality"), family=self),
            glue("qqp", ("not_duplicate", "duplicate"),
                 {"text": "question1", "text_b": "question2"},
                 TextColumns("question1", "question2", "is_duplicate"), family=self),
            glue("mnli", ("entailment", "neutral", "contradiction"),
                 {"text": "premise", "text_b": "hypothesis"},
                 TextColumns("sentence1", "sentence2", "gold_label"), family=self,
                 splits={"train": "train", "eval": "validation_matched"}),
            glue("qnli", _ENTAIL, {"text": "question", "text_b": "sentence"},
                 TextColumns("question", "sentence", "label"), family=self),
            glue("rte", _ENTAIL, {"text": "sentence1", "text_b": "sentence2"},
                 TextColumns("sentence1", "sentence2", "label"), family=self),
            glue("wnli", ("not_entailment", "entailment"),
                 {"text": "sentence1", "text_b": "sentence2"},
                 TextColumns("sentence1", "sentence2", "label"), family=self),
        )

    # -- reading ---------------------------------------------------------------------------

    def records(self, td: TaskData, path: str, skip_bad_rows: bool, stats=None):
        """The `sources.TextRecord`s of a local TSV/CSV/JSONL file."""
        sources.check_file(path)
        fmt = sources.file_format(path, td.file_format)
        columns = td.columns or TextColumns()
        if fmt == "jsonl":
            return sources.read_jsonl(path, columns, skip_bad_rows=skip_bad_rows, stats=stats)
        if fmt not in ("tsv", "csv"):
            raise UserError(f"{path}: task '{td.name}' reads TSV, CSV or JSONL, not {fmt}")
        return sources.read_table(path, columns, delimiter="\t" if fmt == "tsv" else ",",
                                  has_header=td.has_header, skip_bad_rows=skip_bad_rows,
                                  stats=stats)

    def parse_label(self, td: TaskData, value: str, where: str, index: dict | None = None):
        """A raw label string as the class id; UserError naming `where` if unknown.

        `index`: `_label_index(td.label_names)`, built once by a caller that parses many
        labels (a file with 10^4 classes would otherwise rebuild it for every row).
        """
        label = (index if index is not None else _label_index(td.label_names)).get(
            value.strip())
        if label is None:
            raise UserError(f"{where}: label {value!r} is not in the label set "
                            f"{_shown(td.label_names)} (names or ids); fix the label or the "
                            "task's label names")
        return label

    def _rows(self, td: TaskData, path: str, skip_bad_rows: bool, stats=None):
        """Raw dicts of a local file (labels checked)."""
        index = _label_index(td.label_names) if td.label_names else None
        for record in self.records(td, path, skip_bad_rows, stats):
            row = {"text": record.text}
            if td.is_pair:
                row["text_b"] = record.text_b
            if record.label is not None:
                row["label"] = self.parse_label(td, record.label, f"{path}:{record.line}",
                                                index)
            yield row

    def read_local(self, td, path, skip_bad_rows, stats):
        td.require_label_names(path)

        def signature(first):
            spec = {key: tf.TensorSpec([], tf.string) for key in td.text_keys}
            if "label" in first:
                spec["label"] = tf.TensorSpec([], self.label_dtype)
            return spec

        return validated_stream(lambda counts: self._rows(td, path, skip_bad_rows, counts),
                                signature, stats)

    def from_tfds(self, td, example):
        row = {key: example[td.tfds_keys.get(key, key)] for key in td.text_keys}
        row["label"] = tf.cast(example[td.tfds_keys.get("label", "label")], self.label_dtype)
        return row

    def labels_from_file(self, td, path, skip_bad_rows):
        """The distinct labels of the file, sorted (numerically when all are integers).

        Two spellings of one number ("1", "1.0", "01") would be two classes: refused.
        """
        labels, numbers = {}, {}  # label -> its first line; number -> its first spelling
        for record in self.records(td, path, skip_bad_rows):
            label = None if record.label is None else record.label.strip()
            if label is None or label in labels:
                continue
            labels[label] = record.line
            number = _number(label)
            first = label if number is None else numbers.setdefault(number, label)
            if first != label:
                raise UserError(f"{path}:{record.line}: label {label!r} is the number {first!r} "
                                f"(line {labels[first]}) written another way, which would make "
                                "them two classes; write each class one way")
        if not labels:
            raise UserError(f"{path} has no label column to read the label names from; "
                            "map the label column or give the label names")
        numeric = all(lab.lstrip("-").isdigit() for lab in labels)
        return tuple(sorted(labels, key=lambda x: int(x) if numeric else x))

    # -- task, serving, predict ------------------------------------------------------------

    def options_from_info(self, info):
        return {"metrics": tuple(info["metrics"])} if info.get("metrics") else {}

    def head_options(self, task, where):
        return {"num_classes": num_classes(task, where), "pooling": stored_pooling(task, where)}

    def serving_options(self, task: dict) -> dict:
        """`ClassifierServing` arguments of a stored task entry (pair, windows)."""
        return dict(pair="text_b" in (task.get("text_keys") or ()),
                    **windows.stored_options(task))

    def serving_module(self, model, task, **common):
        names = task.get("label_names")
        if not names:
            names = [str(i) for i in range(num_classes(task, "bert_train.json"))]
            logging.warning("task.label_names is missing; labels are named by index: %s", names)
        return ClassifierServing(model, label_names=names, **common, **self.serving_options(task))

    def format_answer(self, outputs, i):
        return mark_truncated(
            {"label": decode(outputs["label_name"][i]),
             "label_index": int(outputs["label_index"][i]),
             "probabilities": [round(float(p), 6) for p in outputs["probabilities"][i]]},
            outputs, i)

