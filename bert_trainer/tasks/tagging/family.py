"""The tagging family: named entities (CoNLL-2003, or your own CoNLL column files).

Raw examples (`TaskData.load`): {"tokens": [words] string, "tags": [words] int64 (IOB2, index
of label_names)}. Local files are CoNLL columns (word first, tag last); tags in IOB1 are
converted to IOB2. Tags a task does not name are refused with their file:line.
"""

import tensorflow as tf

from bert_trainer.data import sources, windows
from bert_trainer.data.task_data import TaskData, validated_stream
from bert_trainer.errors import UserError
from bert_trainer.tasks.family import Family, decode, mark_truncated, num_classes
from bert_trainer.tasks.tagging import data as tagging_data
from bert_trainer.tasks.tagging.serving import TaggerServing
from bert_trainer.tasks.tagging.task import TaggingTask

CONLL2003_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC",
                    "I-MISC")  # TFDS conll2003's order, so TFDS and file ids agree.


class TaggingFamily(Family):
    """Per-word IOB2 tagging (see the module docstring)."""

    name = "tagging"
    recipe = "configs/tasks/tagging.gin"
    task_class = TaggingTask
    local_tasks = ("tagging",)
    local_file_format = "conll"
    has_label_names = True
    input_orders = (("text",),)
    answer_outputs = ("entity_type", "entity_text", "entity_start", "entity_end",
                      "num_entities")

    def presets(self):
        return (TaskData(name="conll2003", family=self, label_names=CONLL2003_LABELS,
                         splits={"train": "train", "eval": "dev"}, tfds_name="conll2003",
                         tfds_keys={"tokens": "tokens", "tags": "ner"}, file_format="conll"),)

    def _conll(self, td, path, skip_bad_rows, stats=None):
        sources.check_file(path)
        fmt = sources.file_format(path, td.file_format)
        if fmt not in ("conll", "tsv"):
            raise UserError(f"{path}: task '{td.name}' reads CoNLL column files, not {fmt}")
        return sources.read_conll(path, skip_bad_rows=skip_bad_rows, stats=stats)

    def _rows(self, td, path, skip_bad_rows, stats=None):
        """Raw dicts of a local CoNLL file (tags converted to IOB2 and checked)."""
        index = {tag: i for i, tag in enumerate(td.label_names)}
        for first, words, tags in self._conll(td, path, skip_bad_rows, stats):
            ids = []
            for i, tag in enumerate(tagging_data.to_iob2(tags)):
                if tag not in index:
                    raise UserError(f"{path}:{first + i}: tag {tags[i]!r} is not in the label "
                                    f"set {list(td.label_names)}; fix the tag or the task")
                ids.append(index[tag])
            yield {"tokens": words, "tags": ids}

    def read_local(self, td, path, skip_bad_rows, stats):
        td.require_label_names(path)
        signature = {"tokens": tf.TensorSpec([None], tf.string),
                     "tags": tf.TensorSpec([None], tf.int64)}
        return validated_stream(lambda counts: self._rows(td, path, skip_bad_rows, counts),
                                lambda first: signature, stats)

    def from_tfds(self, td, example):
        tags = tagging_data.iob2_ids(example[td.tfds_keys["tags"]], td.label_names)
        return {"tokens": example[td.tfds_keys["tokens"]], "tags": tags}

    def labels_from_file(self, td, path, skip_bad_rows):
        """"O", then B-/I- of each entity type of the file, types sorted."""
        tags = set()
        for _, _, row_tags in self._conll(td, path, skip_bad_rows):
            tags.update(tagging_data.to_iob2(row_tags))
        return tuple(tagging_data.sorted_tags(tags))

    def head_options(self, task, where):
        return {"num_classes": num_classes(task, where)}

    def serving_module(self, model, task, **common):
        stored = windows.stored_options(task)
        return TaggerServing(model, label_names=task["label_names"], **common,
                             long_texts=stored["long_texts"], doc_stride=stored["doc_stride"])

    def format_answer(self, outputs, i):
        count = int(outputs["num_entities"][i])
        return mark_truncated(
            {"entities": [{"type": decode(outputs["entity_type"][i, j]),
                           "text": decode(outputs["entity_text"][i, j]),
                           "start": int(outputs["entity_start"][i, j]),
                           "end": int(outputs["entity_end"][i, j])} for j in range(count)]},
            outputs, i)
