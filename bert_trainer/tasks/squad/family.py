"""The squad family: extractive question answering (SQuAD v1.1 and v2.0).

Raw examples (`TaskData.load`): {"id", "question", "context": string, "answers": {"text": [n]
string, "answer_start": [n] int32}, "is_impossible": bool}. Local files are SQuAD JSON (read
whole: JSON is one document); a v1.1 task refuses unanswerable questions. Training and
evaluation window the contexts (`data.py`), so `--long_texts=truncate` does not apply and
`--doc_stride` binds `SquadConfig.doc_stride`.
"""


import tensorflow as tf
from absl import logging

from bert_trainer.data import sources
from bert_trainer.data.task_data import TaskData
from bert_trainer.errors import UserError
from bert_trainer.tasks.family import Family, decode, finite, mark_truncated
from bert_trainer.tasks.squad.serving import SquadServing
from bert_trainer.tasks.squad.task import QuestionAnsweringTask, SquadConfig

_SERVING_OPTIONS = ("doc_stride", "max_query_length", "max_answer_length", "n_best",
                    "null_threshold")


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


def _refuse_unanswerable(path: str, rows: list[dict]) -> None:
    """A SQuAD v1.1 task reading a v2.0 file: v1.1 has no way to train or score "no answer"."""
    for row in rows:
        if row["is_impossible"] or not row["answers"]["text"]:
            raise UserError(f"{path}: question {row['id']} is unanswerable (SQuAD v2); use "
                            "--task=squad_v2")


class SquadFamily(Family):
    """SQuAD-style span extraction (see the module docstring)."""

    name = "squad"
    recipe = "configs/tasks/squad.gin"
    task_class = QuestionAnsweringTask
    truncates = False
    doc_stride_binding = "SquadConfig.doc_stride"
    gin_configs = {"squad": SquadConfig}
    input_orders = (("question", "context"),)
    answer_outputs = ("answer", "score", "start", "end")

    def presets(self):
        return (TaskData(name="squad", family=self, tfds_name="squad/v1.1", file_format="json"),
                TaskData(name="squad_v2", family=self, tfds_name="squad/v2.0",
                         file_format="json", version_2=True))

    def read_local(self, td, path, skip_bad_rows, stats):
        rows = sources.read_squad_json(path, skip_bad_rows=skip_bad_rows, stats=stats)
        if not td.version_2:
            _refuse_unanswerable(path, rows)
        if stats.skipped:
            logging.warning("%s", stats.summary())
        return _squad_slices(rows)

    def from_tfds(self, td, example):
        return {"id": example["id"], "question": example["question"],
                "context": example["context"], "answers": example["answers"],
                "is_impossible": example.get("is_impossible", tf.constant(False))}

    def options_from_info(self, info):
        return {"squad": SquadConfig(**info["squad"])} if info.get("squad") else {}

    def serving_module(self, model, task, **common):
        squad = dict(task.get("squad") or {})
        return SquadServing(model, version_2=bool(task.get("version_2", False)), **common,
                            **{k: squad[k] for k in _SERVING_OPTIONS if k in squad})

    def format_answer(self, outputs, i):
        return mark_truncated(
            {"answer": decode(outputs["answer"][i]), "score": finite(outputs["score"][i]),
             "start": int(outputs["start"][i]), "end": int(outputs["end"][i])}, outputs, i)
