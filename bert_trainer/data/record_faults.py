"""A damaged TFRecord shard, named: which file of the input and at which byte.

TensorFlow reports a truncated or corrupt record as a `DataLossError` ("truncated record at
2618") from deep inside the compiled training loop, naming neither the file nor the input.
`locate` reads the input's shards again, one by one, to find the damaged one; it runs only
after such an error, so a healthy run pays nothing.
"""

import re

import tensorflow as tf

from bert_trainer.data.record_files import list_files
from bert_trainer.errors import UserError

_AT = re.compile(r"(truncated|corrupted) record at (\d+)")


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
