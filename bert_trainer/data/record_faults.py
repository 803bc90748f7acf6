"""A damaged or deleted TFRecord shard, named: which file of the input and at which byte.

TensorFlow reports a truncated or corrupt record as a `DataLossError` ("truncated record at
2618") from deep inside the compiled training loop, naming neither the file nor the input.
`locate` reads the input's shards again, one by one, to find the damaged one; it runs only
after such an error, so a healthy run pays nothing. A shard deleted while a run reads it
surfaces as a `NotFoundError` when the input opens it again (the next epoch): `vanished` names
it and the checkpoint the trainer wrote of the steps done.
"""

import fnmatch
import re

import tensorflow as tf

from bert_trainer.data.record_files import list_files
from bert_trainer.errors import UserError

_AT = re.compile(r"(truncated|corrupted) record at (\d+)")
# "{{function_node ...}} /data/train-00001.tfrecord; No such file or directory [Op:...]"
_MISSING = re.compile(r"(?:^|\s)(\S+?)\s?[:;] No such file or directory")


def locate(error: Exception, inputs: dict[str, str | None]) -> UserError:
    """The one-line error for a `DataLossError` of a run reading `inputs`.

    Args:
        error: what TensorFlow raised.
        inputs: {flag: file pattern} of what the run reads, e.g. {"--train_data": "d/*"};
            None patterns are skipped.

    Returns:
        "SHARD: truncated record at byte N (a shard of FLAG=PATTERN); recreate ...", or,
        when no shard fails when read again, a line naming the inputs and TensorFlow's text.
    """
    for flag, pattern in inputs.items():
        if not pattern:
            continue
        for path in list_files(pattern):
            fault = damage(path)
            if fault:
                return UserError(f"{path}: {fault} (a shard of {flag}={pattern}); recreate "
                                 "the shard with 'bert-train create_pretraining_data', or "
                                 f"leave it out of {flag}")
    text = (getattr(error, "message", None) or str(error)).strip()
    found = _AT.search(text)
    what = f"{found[1]} record at byte {found[2]}" if found else text.splitlines()[0][:200]
    named = ", ".join(f"{flag}={pattern}" for flag, pattern in inputs.items() if pattern)
    return UserError(f"a TFRecord shard of {named} is damaged ({what}); recreate the shards "
                     "with 'bert-train create_pretraining_data'")


def damage(path: str) -> str | None:
    """"truncated record at byte N" (or "corrupted ...") when `path` is damaged, else None."""
    try:
        for _ in tf.data.TFRecordDataset(path).batch(1024):
            pass
    except tf.errors.DataLossError as e:
        found = _AT.search(e.message)
        return f"{found[1]} record at byte {found[2]}" if found else e.message.splitlines()[0]
    return None


def vanished(error: Exception, inputs: dict[str, str | None],
             checkpoint: str | None) -> UserError:
    """The one-line error for an input file that disappeared while a run read it.

    Args:
        error: TensorFlow's `NotFoundError` (its text names the path).
        inputs: {flag: file pattern} of what the run reads; None patterns are skipped.
        checkpoint: the checkpoint of the steps done (the trainer writes it), or None.
    """
    text = (getattr(error, "message", None) or str(error)).strip()
    found = _MISSING.search(text)
    path = found[1] if found else text.splitlines()[0][:200]
    flag, pattern = next(((f, p) for f, p in inputs.items()
                          if p and any(fnmatch.fnmatch(path, part.strip())
                                       for part in p.split(","))), (None, None))
    where = f" (a shard of {flag}={pattern})" if flag else ""
    saved = f"the steps trained are saved in {checkpoint}; " if checkpoint else ""
    return UserError(f"{path} was deleted while the run read it{where}; {saved}put it back, "
                     f"or leave it out of {flag or 'the input'}, and run the same command "
                     "again to resume")
