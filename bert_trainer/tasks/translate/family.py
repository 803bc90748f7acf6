"""The translate family: sentence pairs (source → target) for sequence-to-sequence fine-tuning.

Raw examples (`TaskData.load`): {"source": string, "target": string}. Local files:

- TSV, CSV or JSONL pair files; `--source_column/--target_column` name the columns (header
  names or 0-based indices; JSONL keys, default "source" and "target"). Without them the
  first two columns are the pair.
- the Tatoeba/manythings format (`english<TAB>spanish[<TAB>attribution]`, no header, often
  named `spa.txt`) as it is: `.txt` files are read as TSV.
- A first row of column names (`english<TAB>spanish`) is a header: a row whose pair fields
  are each one lower-case word (letters, digits, `_` or `-`); `--header/--noheader` decides
  instead.

Bad rows (one column, an empty source or target) are one-line errors naming file:line, or
skipped and counted with `--skip_bad_rows`. TFDS presets: `ted_hrlr_translate/pt_to_en`
(Portuguese → English TED talks) and `wmt14_translate/de-en` (German → English news).
"""

import csv
import dataclasses
import os
import re

import tensorflow as tf
from absl import logging

from bert_trainer.data import sources
from bert_trainer.data.sources import TextColumns
from bert_trainer.data.task_data import TaskData, validated_stream
from bert_trainer.errors import UserError
from bert_trainer.tasks.family import Family, decode, finite
from bert_trainer.tasks.translate import serving as translate_serving
from bert_trainer.tasks.translate.task import TranslateConfig, TranslationTask

SOURCE, TARGET = "source", "target"
PAIR_COLUMNS = TextColumns(0, 1, None)  # the first two columns; role "text" is the source
JSONL_KEYS = TextColumns(SOURCE, TARGET, None)
_HEADER_NAME = re.compile(r"[a-z][a-z0-9_\-]*")


def _first_row(path: str, fmt: str) -> tuple[int, list[str]] | None:
    """(line, fields) of the first non-blank row of a TSV or CSV file, or None."""
    for number, text in sources.utf8_lines(path):
        if text.strip():
            fields = text.split("\t") if fmt == "tsv" else next(csv.reader([text]), [])
            return number, fields
    return None


def looks_like_header(fields: list[str], indices: tuple[int, int]) -> bool:
    """Whether a first row names its columns: each pair field is one lower-case word.

    Args:
      fields: the row's fields.
      indices: the source and target columns.

    Returns:
      True for `english<TAB>spanish`, False for `Go.<TAB>Ve.<TAB>CC-BY 2.0 ...`.
    """
    picked = [fields[i].strip() for i in indices if i < len(fields)]
    return len(picked) == 2 and all(_HEADER_NAME.fullmatch(f) for f in picked)


class TranslateFamily(Family):
    """Sentence-pair translation (see the module docstring)."""

    name = "translate"
    recipe = "configs/tasks/translate.gin"
    task_class = TranslationTask
    local_tasks = ("translate",)
    reads_columns = True
    column_flags = {"source_column": "text_column", "target_column": "text_b_column"}
    gin_configs = {"translate": TranslateConfig}
    input_orders = ((translate_serving.INPUT,),)
    answer_outputs = (translate_serving.TRANSLATION, translate_serving.SCORE)

    def __init__(self):
        self._headers_logged = set()  # files whose header detection was logged

    def presets(self):
        return (
            TaskData(name="ted_hrlr_translate/pt_to_en", family=self,
                     tfds_name="ted_hrlr_translate/pt_to_en",
                     tfds_keys={SOURCE: "pt", TARGET: "en"}, text_keys=(SOURCE, TARGET)),
            TaskData(name="wmt14_translate/de-en", family=self, tfds_name="wmt14_translate/de-en",
                     tfds_keys={SOURCE: "de", TARGET: "en"}, text_keys=(SOURCE, TARGET)),
        )

    def local_task_data(self, name, **fields):
        """Pair files: the first two columns unless mapped, the header detected (None)."""
        if fields.get("columns") in (None, TextColumns()):
            fields["columns"] = PAIR_COLUMNS
        fields["has_header"] = None
        fields["text_keys"] = (SOURCE, TARGET)
        return super().local_task_data(name, **fields)

    # -- reading ---------------------------------------------------------------------------

    def _format(self, td: TaskData, path: str) -> str:
        if td.file_format is None and os.path.splitext(path)[1].lower() == ".txt":
            return "tsv"  # manythings.org's spa.txt: TSV without a header
        fmt = sources.file_format(path, td.file_format)
        if fmt not in ("tsv", "csv", "jsonl"):
            raise UserError(f"{path}: task '{td.name}' reads TSV, CSV or JSONL pair files "
                            f"(or Tatoeba's .txt), not {fmt}")
        return fmt

    def _records(self, td: TaskData, path: str, skip_bad_rows: bool, stats=None):
        """The `sources.TextRecord`s (text: source, text_b: target) of a local pair file."""
        sources.check_file(path)
        fmt = self._format(td, path)
        columns = td.columns or PAIR_COLUMNS
        if fmt == "jsonl":  # keys, not indices: an unnamed side keeps its default key
            columns = TextColumns(
                columns.text if isinstance(columns.text, str) else JSONL_KEYS.text,
                columns.text_b if isinstance(columns.text_b, str) else JSONL_KEYS.text_b, None)
            return sources.read_jsonl(path, columns, skip_bad_rows=skip_bad_rows, stats=stats)
        has_header = self._has_header(td, path, fmt, columns)
        return sources.read_table(path, columns, delimiter="\t" if fmt == "tsv" else ",",
                                  has_header=has_header, skip_bad_rows=skip_bad_rows,
                                  stats=stats)

    def _has_header(self, td, path, fmt, columns) -> bool:
        """The task's `has_header`, else detected from the first row (see the module doc);
        a first row of one column is refused here, naming the fix."""
        first = _first_row(path, fmt)
        if first is not None and len(first[1]) < 2:
            raise UserError(f"{path}:{first[0]}: one column; a translate file holds a source "
                            "and a target column (TSV: source<TAB>target, or CSV/JSONL with "
                            "--source_column/--target_column)")
        if td.has_header is not None:
            return td.has_header
        if isinstance(columns.text, str) or isinstance(columns.text_b, str):
            return True  # columns named by header
        header = first is not None and looks_like_header(first[1], (columns.text, columns.text_b))
        if header and path not in self._headers_logged:
            self._headers_logged.add(path)
            logging.info("%s: line %d names the columns %s: read as a header (--noheader reads "
                         "it as a pair)", path, first[0], first[1])
        return header

    def _rows(self, td: TaskData, path: str, skip_bad_rows: bool, stats=None):
        """Raw pair dicts of a local file; an empty source or target is a bad row."""
        counts = stats if stats is not None else sources.ReadStats(path)
        for record in self._records(td, path, skip_bad_rows, counts):
            empty = [role for role, text in ((SOURCE, record.text), (TARGET, record.text_b))
                     if not (text or "").strip()]
            if empty:
                if not skip_bad_rows:
                    raise UserError(f"{path}:{record.line}: empty {empty[0]}; every pair needs "
                                    "a source and a target text: fix the row or pass "
                                    "--skip_bad_rows")
                counts.examples -= 1
                counts.skip(record.line)
                continue
            yield {SOURCE: record.text, TARGET: record.text_b}

    def read_local(self, td, path, skip_bad_rows, stats):
        signature = {SOURCE: tf.TensorSpec([], tf.string), TARGET: tf.TensorSpec([], tf.string)}
        return validated_stream(lambda counts: self._rows(td, path, skip_bad_rows, counts),
                                lambda first: signature, stats)

    def from_tfds(self, td, example):
        return {SOURCE: example[td.tfds_keys[SOURCE]], TARGET: example[td.tfds_keys[TARGET]]}

    # -- task, serving, predict ------------------------------------------------------------

    def options_from_info(self, info):
        stored = info.get("translate")
        if not stored:
            return {}
        known = {f.name for f in dataclasses.fields(TranslateConfig)}
        return {"translate": TranslateConfig(**{k: v for k, v in stored.items() if k in known})}

    def _config(self, task: dict) -> TranslateConfig:
        return self.options_from_info(task).get("translate") or TranslateConfig()

    def head_options(self, task, where):
        return {"config": self._config(task)}

    def serving_module(self, model, task, **common):
        config = self._config(task)
        return translate_serving.TranslateServing(
            model, beam_size=config.beam_size, length_penalty=config.length_penalty,
            max_decode_length=config.decode_length, **common)

    def format_answer(self, outputs, i):
        answer = {translate_serving.TRANSLATION: decode(outputs[translate_serving.TRANSLATION][i]),
                  translate_serving.SCORE: finite(outputs[translate_serving.SCORE][i])}
        cut = outputs.get(translate_serving.TRUNCATED)  # absent from older exports
        if cut is not None and bool(cut[i]):
            answer["truncated"] = True
        return answer
