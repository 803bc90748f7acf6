"""TensorFlow Datasets access that fails in one line, never with a download traceback.

bert-train never downloads behind the user's back: `load_tfds` reads a dataset already prepared
in `data_dir` (TFDS's default `~/tensorflow_datasets` when None). When it is not there the
error names the dataset, `--data_dir` and the local-file alternative (`--train_file` /
`--eval_file`). `download=True` runs `download_and_prepare` and turns a network failure into
the same kind of one-line error.
"""

import os

import tensorflow as tf
import tensorflow_datasets as tfds

from bert_trainer.errors import UserError

_NOT_PREPARED = "could not find data"  # TFDS's AssertionError text for an unprepared dataset.


def _builder(name: str, data_dir: str | None):
    try:
        return tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise UserError(f"TFDS has no dataset '{name}'; check the task's TFDS name or use local "
                        "files with --train_file/--eval_file") from None


def _not_prepared(name: str, builder, download_error: str | None = None) -> UserError:
    where = getattr(builder, "data_dir_root", None) or "the TFDS data_dir"
    if download_error is None:
        problem = f"is not prepared in {where} and bert-train does not download datasets"
    else:
        problem = f"is not in {where} and downloading it failed ({download_error})"
    return UserError(
        f"TFDS dataset '{name}' {problem}: pass --data_dir=DIR holding a prepared copy (made "
        f"by 'tfds build {name} --data_dir=DIR' on a machine with network), or use local files "
        "with --train_file/--eval_file")


def load_tfds(name: str, split: str, data_dir: str | None = None, *, download: bool = False,
              shuffle_files: bool = False) -> tf.data.Dataset:
    """One split of a TFDS dataset as a `tf.data.Dataset` of example dicts.

    Args:
      name: TFDS name with config, e.g. "glue/mrpc", "squad/v1.1", "imdb_reviews".
      split: TFDS split name ("train", "validation", "validation_matched", ...).
      data_dir: directory holding prepared TFDS datasets; None means TFDS's default.
      download: download and prepare the dataset if it is missing (needs network).
      shuffle_files: shuffle the order of the split's files (training; not deterministic).

    Returns:
      Unbatched examples, TFDS's feature dicts (strings as tf.string, labels as int64).

    Raises:
      UserError: unknown dataset or split, dataset not prepared (offline), download failed.
    """
    if data_dir is not None:
        data_dir = os.path.expanduser(data_dir)
    builder = _builder(name, data_dir)
    if download:
        try:
            builder.download_and_prepare()
        except Exception as e:  # noqa: BLE001 (network errors come in many types)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise _not_prepared(name, builder, first) from None
    try:
        return builder.as_dataset(split=split, shuffle_files=shuffle_files)
    except AssertionError as e:
        if _NOT_PREPARED not in str(e):
            raise
        raise _not_prepared(name, builder) from None
    except ValueError as e:
        if "split" not in str(e).lower():
            raise
        known = ", ".join(sorted(builder.info.splits)) or "none prepared"
        raise UserError(f"TFDS dataset '{name}' has no split '{split}' (splits: {known}); "
                        "choose one of them") from None
