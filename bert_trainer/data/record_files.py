"""TFRecord shards as pretraining reads them: the files of a pattern, what their first record
holds, and the records sharded over input pipelines and shuffled with a seed (the same order
in every run, so a resumed run skips to exactly where it stopped). Each objective's pipeline
(`tasks/masked_lm/data.py`, `tasks/causal_lm/data.py`) parses them.
"""

import tensorflow as tf

from bert_trainer.errors import UserError


def list_files(file_pattern) -> list[str]:
    """The TFRecord files of glob(s) `file_pattern` (comma list allowed), sorted; JSON left out."""
    patterns = [file_pattern] if isinstance(file_pattern, str) else list(file_pattern)
    patterns = [p.strip() for part in patterns for p in str(part).split(",") if p.strip()]
    # create_pretraining_data writes DIR/train-summary.json beside DIR/train-*.tfrecord, so a
    # loose glob like 'DIR/train-*' matches it too: it is JSON, never records.
    files = sorted({f for p in patterns for f in tf.io.gfile.glob(p)
                    if not f.endswith(".json")})
    if not files:
        raise UserError(f"pretraining data '{file_pattern}' matches no file; "
                        "make it with 'bert-train create_pretraining_data'")
    return files


def inspect_records(path: str) -> dict:
    """Feature name -> length of the first record of a TFRecord file.

    Raises:
      UserError: the file is empty or not a TFRecord of tf.train.Example.
    """
    try:
        raw = next(iter(tf.data.TFRecordDataset(path).take(1)), None)
    except tf.errors.DataLossError:
        raise UserError(f"{path} is not a TFRecord file; pass the shards written by "
                        "create_pretraining_data") from None
    if raw is None:
        raise UserError(f"{path} holds no records; re-run create_pretraining_data")
    example = tf.train.Example.FromString(raw.numpy())
    out = {}
    for name, feat in example.features.feature.items():
        kind = feat.WhichOneof("kind")
        out[name] = len(getattr(feat, kind).value) if kind else 0
    return out


def record_dataset(files: list[str], file_pattern, options,
                   seed: int) -> tuple[tf.data.Dataset, int]:
    """Serialized records of `files`: sharded over input pipelines, shuffled with `seed`.

    Args:
      files: the TFRecord files (`list_files`).
      file_pattern: what the user gave, for error messages.
      options: the `input_utils.PipelineOptions`: training shuffles the files and the records
        (`shuffle_buffer`) and repeats forever; `input_context` shards the files across input
        pipelines; `deterministic` keeps the element order fixed across runs (a slower
        interleave).
      seed: seeds the file order and the shuffle (the same order in every run: exact resume).

    Returns:
      (dataset of scalar tf.string records, this input pipeline's id).
    """
    input_context, is_training = options.input_context, options.is_training
    dataset = tf.data.Dataset.from_tensor_slices(files)
    pipeline_id = 0
    if input_context and input_context.num_input_pipelines > 1:
        if len(files) < input_context.num_input_pipelines:
            raise UserError(f"'{file_pattern}' has {len(files)} file(s) for "
                            f"{input_context.num_input_pipelines} input pipelines; write at "
                            "least that many shards (--num_shards)")
        pipeline_id = input_context.input_pipeline_id
        dataset = dataset.shard(input_context.num_input_pipelines, pipeline_id)
    if is_training:
        dataset = dataset.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.interleave(
        tf.data.TFRecordDataset, cycle_length=min(len(files), 8),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=options.deterministic)
    if is_training:
        dataset = dataset.shuffle(options.shuffle_buffer, seed=seed).repeat()
    return dataset, pipeline_id
