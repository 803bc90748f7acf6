"""TensorFlow Datasets access that fails in one line, never with a download traceback.

bert-train never downloads behind the user's back: `load_tfds` reads a dataset already prepared
in `data_dir` (TFDS's default `~/tensorflow_datasets` when None). When it is not there the
error names the dataset, `--data_dir` and the local-file alternative (`--train_file` /
`--eval_file`). `download=True` runs `download_and_prepare` and turns a network failure into
the same kind of one-line error. `TfdsText` reads a text dataset (Wikipedia, books, reviews) as
pretraining documents for `create_pretraining_data --tfds`.
"""

import dataclasses
import os
from collections.abc import Iterator

import tensorflow as tf
import tensorflow_datasets as tfds

from bert_trainer.data import text_corpus
from bert_trainer.errors import UserError

_NOT_PREPARED = "could not find data"  # TFDS's AssertionError text for an unprepared dataset.


def _builder(name: str, data_dir: str | None, local_files: str):
    try:
        return tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise UserError(f"TFDS has no dataset '{name}'; check the task's TFDS name or use local "
                        f"files with {local_files}") from None


def _not_prepared(name: str, builder, local_files: str,
                  download_error: str | None = None) -> UserError:
    where = getattr(builder, "data_dir_root", None) or "the TFDS data_dir"
    if download_error is None:
        problem = f"is not prepared in {where} and bert-train does not download datasets"
    else:
        problem = f"is not in {where} and downloading it failed ({download_error})"
    return UserError(
        f"TFDS dataset '{name}' {problem}: pass --data_dir=DIR holding a prepared copy (made "
        f"by 'tfds build {name} --data_dir=DIR' on a machine with network), or use local files "
        f"with {local_files}")


def load_tfds(name: str, split: str, data_dir: str | None = None, *, download: bool = False,
              shuffle_files: bool = False,
              local_files: str = "--train_file/--eval_file") -> tf.data.Dataset:
    """One split of a TFDS dataset as a `tf.data.Dataset` of example dicts.

    Args:
      name: TFDS name with config, e.g. "glue/mrpc", "squad/v1.1", "imdb_reviews".
      split: TFDS split name ("train", "validation", "validation_matched", ...).
      data_dir: directory holding prepared TFDS datasets; None means TFDS's default.
      download: download and prepare the dataset if it is missing (needs network).
      shuffle_files: shuffle the order of the split's files (training; not deterministic).
      local_files: the flags a user could give local files with instead (for the errors).

    Returns:
      Unbatched examples, TFDS's feature dicts (strings as tf.string, labels as int64).

    Raises:
      UserError: unknown dataset or split, dataset not prepared (offline), download failed.
    """
    if data_dir is not None:
        data_dir = os.path.expanduser(data_dir)
    builder = _builder(name, data_dir, local_files)
    if download:
        try:
            builder.download_and_prepare()
        except Exception as e:  # noqa: BLE001 (network errors come in many types)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise _not_prepared(name, builder, local_files, first) from None
    try:
        return builder.as_dataset(split=split, shuffle_files=shuffle_files)
    except AssertionError as e:
        if _NOT_PREPARED not in str(e):
            raise
        raise _not_prepared(name, builder, local_files) from None
    except ValueError as e:
        if "split" not in str(e).lower():
            raise
        known = ", ".join(sorted(builder.info.splits)) or "none prepared"
        raise UserError(f"TFDS dataset '{name}' has no split '{split}' (splits: {known}); "
                        "choose one of them") from None


@dataclasses.dataclass(frozen=True)
class TfdsText:
    """A TFDS text dataset read as pretraining documents: one example, one document.

    Each example's `text_key` feature is split into lines and each line into sentences
    (`text_corpus.split_sentences`); a document longer than `max_document_sentences` is cut,
    as for text files. Examples are read in the dataset's own order (files not shuffled), so
    the documents, and the data made from them, are the same on every run.

    Attributes:
      name: TFDS name with config, e.g. "wikipedia/20230601.en", "imdb_reviews".
      split: TFDS split (slices such as "train[:10%]" too).
      text_key: the string feature holding the text.
      data_dir: directory holding the prepared dataset; None means TFDS's default.
    """

    name: str
    split: str = "train"
    text_key: str = "text"
    data_dir: str | None = None
    max_document_sentences: int = 2000

    def texts(self) -> tf.data.Dataset:
        """The dataset's texts (tf.string scalars); raises UserError before reading any."""
        dataset = load_tfds(self.name, self.split, self.data_dir, local_files="--input")
        spec = dataset.element_spec
        texts = sorted(k for k, v in spec.items() if getattr(v, "dtype", None) == tf.string
                       and v.shape.rank == 0) if isinstance(spec, dict) else []
        if self.text_key not in texts:
            raise UserError(f"TFDS dataset '{self.name}' has no text feature "
                            f"'{self.text_key}' (its text features: {', '.join(texts) or 'none'}); "
                            "pass --tfds_text_key=one of them")
        return dataset.map(lambda example: example[self.text_key])

    def documents(self, stats=None) -> Iterator[list[str]]:
        """Yields the documents (lists of sentences); `stats["text_bytes"]` counts the text."""
        for raw in self.texts().as_numpy_iterator():
            if stats is not None:
                stats["text_bytes"] += len(raw)
            text = raw.decode("utf-8", errors="replace")
            sentences = [s for line in text.splitlines()
                         for s in text_corpus.split_sentences(line)]
            step = self.max_document_sentences
            for start in range(0, len(sentences), step):
                yield sentences[start:start + step]
