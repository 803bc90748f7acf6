"""The bert-train model directory: what a trained or converted model is on disk.

```
model_dir/bert_train.json   {"format": "bert_train", "version": 2,
                             "encoder": {"class_name": "BertEncoder",
                                         "registered_name": "bert_trainer>BertEncoder",
                                         "config": {...encoder.get_config()}},
                             "vocab_file": "vocab.txt" | null, "lower_case": true,
                             "task": {...} | null,
                             "run_settings": {"train_steps": N, ...} (finetune),
                             "time_budget": {"seconds", "elapsed_seconds", "steps", ...}
                             (a run with TrainerConfig.time_budget, when it ends)}
model_dir/vocab.txt         copied in, so the directory is self-contained
model_dir/checkpoint, ckpt-N.index, ckpt-N.data-*
                            tf.train.Checkpoint(model=M, ...): M names every weight by its
                            stable name, `encoder/<Keras path>` for the encoder and the
                            Keras path for a head (`masked_lm/bias`); see
                            `bert_trainer.checkpoints.layout`. The trainer also stores
                            `optimizer` and `step` at the root.
model_dir/.bert_train.lock  while a run trains there: {"host", "pid", "command", "started"}
                            (`training.run_lock`: one run per model_dir)
```
A resume is checked against bert_train.json first (`check_resume`): another task, label set,
sequence length, encoder architecture or vocabulary is refused before anything is restored.

Version 2 introduced the stable names; version 1 directories (checkpoints in the Keras
object-graph layout) are still read, for warm starts only.

`restore_pretrained` warm-starts an encoder (and heads) from any such checkpoint, whatever else
it holds, after checking every variable's shape against the checkpoint.
"""

import contextlib
import dataclasses
import glob
import hashlib
import json
import os
import pathlib
import shutil

import keras
import tensorflow as tf

from bert_trainer import outputs
from bert_trainer.checkpoints import layout, multi_seed_dir, select
from bert_trainer.errors import UserError

MODEL_INFO_FILE = "bert_train.json"
FORMAT_NAME, FORMAT_VERSION = "bert_train", 2
# Version 1 differs only in its checkpoints' layout, which the readers detect by themselves.
READABLE_VERSIONS = (1, 2)
VOCAB_FILE = "vocab.txt"
CHECKPOINT_NAME = select.CHECKPOINT_NAME


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """The contents of bert_train.json, with `vocab_file` resolved to an absolute path."""

    encoder_class: str
    encoder_config: dict
    vocab_file: str | None
    lower_case: bool
    task: dict | None
    registered_name: str | None = None


def write_model_info(model_dir: str, encoder: keras.Model, *, vocab_file: str | None = None,
                     lower_case: bool = True, task: dict | None = None,
                     run_settings: dict | None = None) -> str:
    """Writes model_dir/bert_train.json and copies the vocabulary to model_dir/vocab.txt.

    Args:
      model_dir: the directory (created if needed).
      encoder: a serializable encoder; its `get_config()` is stored.
      vocab_file: the WordPiece vocabulary, or None.
      lower_case: whether the vocabulary expects lower-cased text.
      task: optional JSON-ready task description (name, family, label_names, ...).
      run_settings: optional settings the run derived (train_steps, warmup_steps, ...).

    Returns:
      The path of bert_train.json.
    """
    os.makedirs(model_dir, exist_ok=True)
    stored_vocab = None
    if vocab_file is not None:
        if not os.path.isfile(vocab_file):
            raise UserError(f"vocab file {vocab_file} does not exist; pass an existing vocab.txt")
        target = os.path.join(model_dir, VOCAB_FILE)
        if not os.path.exists(target) or not os.path.samefile(vocab_file, target):
            _replace_file(target, lambda temp: shutil.copyfile(vocab_file, temp))
        stored_vocab = VOCAB_FILE
    info = {
        "format": FORMAT_NAME, "version": FORMAT_VERSION,
        "encoder": {"class_name": type(encoder).__name__,
                    "registered_name": keras.saving.get_registered_name(type(encoder)),
                    "config": encoder.get_config()},
        "vocab_file": stored_vocab, "lower_case": bool(lower_case), "task": task,
    }
    if run_settings is not None:
        info["run_settings"] = run_settings
    path = os.path.join(model_dir, MODEL_INFO_FILE)
    # Write then rename: a reader never sees half a file.
    _replace_file(path, lambda temp: pathlib.Path(temp).write_text(
        json.dumps(info, indent=2) + "\n", encoding="utf-8"))
    return path


def _replace_file(path: str, write) -> None:
    """Calls `write(temp)` for a temporary sibling of `path`, then renames it over `path`.

    A failed write (a full disk) removes the temporary file and leaves `path` as it was.
    """
    temp = outputs.temporary_sibling(path)
    try:
        write(temp)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temp)
        raise


def update_model_info(model_dir: str, **entries) -> str | None:
    """Sets top-level entries of model_dir/bert_train.json (e.g. what a run's time budget
    bought), keeping the rest; written then renamed, as `write_model_info` does.

    Returns:
      The path of bert_train.json; None when the task wrote none (nothing is written).
    """
    path = os.path.join(model_dir, MODEL_INFO_FILE)
    if not os.path.isfile(path):
        return None
    info = {**json.loads(pathlib.Path(path).read_text(encoding="utf-8")), **entries}
    _replace_file(path, lambda temp: pathlib.Path(temp).write_text(
        json.dumps(info, indent=2) + "\n", encoding="utf-8"))
    return path


def read_model_info(model_dir: str) -> ModelInfo:
    """Reads model_dir/bert_train.json; UserError naming the file when absent or invalid."""
    path = os.path.join(model_dir, MODEL_INFO_FILE)
    if not os.path.isfile(path):
        multi_seed_dir.refuse_parent(model_dir)  # its models are its seed-N directories
        raise UserError(f"{path} does not exist; {model_dir} is not a bert-train model "
                        "directory (convert other checkpoints with 'bert-train convert')")
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); restore it or re-run convert") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT_NAME:
        raise UserError(f"{path}: 'format' must be '{FORMAT_NAME}'; not a bert-train model file")
    if info.get("version") not in READABLE_VERSIONS:
        raise UserError(f"{path}: version {info.get('version')} is not supported by this "
                        f"bert-train (reads versions {', '.join(map(str, READABLE_VERSIONS))}); "
                        "upgrade bert-train")
    encoder = info.get("encoder")
    if not isinstance(encoder, dict) or not isinstance(encoder.get("config"), dict):
        raise UserError(f"{path}: 'encoder' must hold 'class_name' and a 'config' object")
    vocab = info.get("vocab_file")
    if vocab is not None:
        vocab = os.path.abspath(os.path.join(model_dir, vocab))
        if not os.path.isfile(vocab):
            raise UserError(f"{vocab} does not exist but {path} names it; copy the vocab back")
    return ModelInfo(encoder_class=str(encoder.get("class_name")),
                     encoder_config=encoder["config"], vocab_file=vocab,
                     lower_case=bool(info.get("lower_case", True)), task=info.get("task"),
                     registered_name=encoder.get("registered_name"))


def build_encoder(info: ModelInfo) -> keras.Model:
    """Builds the (untrained) encoder that `info` describes; restore weights separately."""
    name = info.registered_name or f"bert_trainer>{info.encoder_class}"
    cls = keras.saving.get_registered_object(name)
    if cls is None:
        import bert_trainer.encoders  # noqa: F401, PLC0415 (registers the encoder classes)
        import bert_trainer.models  # noqa: F401, PLC0415 (and the models used as one: CausalLM)

        cls = keras.saving.get_registered_object(name)
    if cls is None:
        raise UserError(f"encoder class '{info.encoder_class}' in {MODEL_INFO_FILE} is unknown "
                        "to this bert-train; it was written by a newer or patched version")
    try:
        return cls.from_config(dict(info.encoder_config))
    except (TypeError, ValueError) as e:
        raise UserError(f"{MODEL_INFO_FILE}: the encoder config does not build a "
                        f"{info.encoder_class} ({e})") from None


def write_pretrained(model_dir: str, *, encoder: keras.Model, masked_lm=None,
                     next_sentence=None, vocab_file: str | None = None,
                     lower_case: bool = True, task: dict | None = None) -> str:
    """Writes a model directory whose ckpt-0 holds the encoder (and pretraining heads).

    The variables get the same stable names as in a trainer's checkpoint of a
    `BertPretrainer` (`model/encoder/...`, `model/masked_lm/...`, `model/next_sentence/...`),
    so either restores into the other.

    Returns:
      The checkpoint prefix (model_dir/ckpt-0).
    """
    write_model_info(model_dir, encoder, vocab_file=vocab_file, lower_case=lower_case, task=task)
    names = layout.parts_names(encoder, _heads(masked_lm, next_sentence))
    root = tf.train.Checkpoint(model=layout.NamedVariables(names))
    manager = tf.train.CheckpointManager(root, model_dir, max_to_keep=1,
                                         checkpoint_name=CHECKPOINT_NAME)
    return manager.save(checkpoint_number=0)


def restore_pretrained(path: str, *, encoder: keras.Model, masked_lm=None,
                       next_sentence=None) -> dict[str, list[str]]:
    """Loads encoder (and optional heads) weights from a bert-train checkpoint.

    Reads both checkpoint layouts (see `bert_trainer.checkpoints.layout`): stable names, and
    the object-graph layout of format 1 (matched through the live encoder's op list).

    Args:
      path: a model directory (its latest usable checkpoint is used) or a checkpoint prefix.
      encoder, masked_lm, next_sentence: built layers, read from `model/encoder/...`,
        `model/masked_lm/...`, `model/next_sentence/...`; None skips a part.

    Returns:
      {"loaded": variable paths restored, "initialized": variable paths the checkpoint lacks
      (left as initialized)}.

    Raises:
      UserError: no checkpoint, no encoder in it, an encoder variable with no place in the
        model, or a variable whose shape differs (named with both shapes); nothing is
        restored in that case.
    """
    prefix = select.select_checkpoint(None, path, flag="--init_checkpoint")
    heads = _heads(masked_lm, next_sentence)
    for name, part in {"encoder": encoder, **heads}.items():
        if not part.weights:
            raise ValueError(f"restore_pretrained: {name} has no variables yet; build it first")
    graph, shapes = layout.read_object_graph(prefix)
    names = layout.parts_names(encoder, heads)
    if layout.layout(graph) == layout.OBJECT_GRAPH:
        root = tf.train.Checkpoint(model=tf.train.Checkpoint(encoder=encoder, **heads))
        in_encoder = {k: k for k in layout.subtree_keys(graph, ("model", layout.ENCODER))}
    else:
        root = tf.train.Checkpoint(model=layout.NamedVariables(names))
        in_encoder = {key: name for name, (key, _) in layout.stored_names(graph, shapes).items()
                      if name.startswith(f"{layout.ENCODER}/")}
    matched = layout.match_variables(graph, shapes, root)
    layout.check_shapes(prefix, matched, {id(v): name for name, v in names.items()})
    loaded_ids = {id(v) for _, _, v in matched}
    if not any(id(v) in loaded_ids for v in encoder.weights):
        raise UserError(f"{prefix} holds no encoder weights (model/encoder); it is not a "
                        "bert-train checkpoint of a BERT model")
    # Encoder variables with no place in the model mean another architecture (e.g. more
    # layers) even when every shape that did match agrees.
    unplaced = sorted(in_encoder[k] for k in set(in_encoder) - {key for key, _, _ in matched})
    if unplaced:
        raise UserError(f"{prefix}: {len(unplaced)} encoder variables have no place in the "
                        f"model (e.g. {unplaced[0]}); the checkpoint is of another "
                        "architecture (check num_layers in the encoder config)")
    root.read(prefix).expect_partial()
    return {"loaded": [v.path for v in names.values() if id(v) in loaded_ids],
            "initialized": [v.path for v in names.values() if id(v) not in loaded_ids]}


def _heads(masked_lm, next_sentence) -> dict:
    heads = {"masked_lm": masked_lm, "next_sentence": next_sentence}
    return {k: v for k, v in heads.items() if v is not None}


# Encoder config keys that say how an encoder runs or is regularized, not what it is: a resumed
# run may change them. Every other key both configs hold must agree.
_NOT_ARCHITECTURE = ("name", "trainable", "dtype", "initializer", "output_range")


def check_resume(model_dir: str, *, encoder_class: str, encoder_config: dict,
                 vocab_file: str | None, lower_case: bool, task: dict | None,
                 task_keys=("name", "family", "label_names", "seq_length")) -> None:
    """Refuses to resume `model_dir` as something other than what it was trained as.

    A model_dir that holds checkpoints and a bert_train.json is compared, before anything is
    restored or written, with what this run would write there: the task (the fields
    `task_keys`), the encoder's architecture, the vocabulary (by content) and its casing.

    Args:
      model_dir: the run's directory; a fresh one (no checkpoint or no bert_train.json) passes.
      encoder_class: the new encoder's class name.
      encoder_config: the new encoder's `get_config()`.
      vocab_file: the new run's vocabulary, or None (not compared).
      lower_case: the new run's casing.
      task: what the new run writes as "task" in bert_train.json.
      task_keys: the task fields that must agree (absent fields are not compared).

    Raises:
      UserError: naming the field, the stored value, the new one and the way out.
    """
    path = os.path.join(model_dir, MODEL_INFO_FILE)
    if not (os.path.isfile(path) and _has_checkpoints(model_dir)):
        return
    old = read_model_info(model_dir)
    fix = "use another --model_dir (or the flags it was trained with)"
    what = _describe_task(old.task) if isinstance(old.task, dict) else "an encoder"
    # A directory without a task (written by convert) holds no trainer state: the restore's
    # own check refuses it, naming what its checkpoint lacks.
    compare_task = isinstance(old.task, dict) and task is not None
    if compare_task and (old.task.get("name"), old.task.get("family")) != (
            task.get("name"), task.get("family")):
        raise UserError(f"--model_dir={model_dir} was trained as {what}; this run asks for "
                        f"{_describe_task(task)}; {fix}")
    for key in task_keys if compare_task else ():
        stored, new = old.task.get(key), task.get(key)
        if key in old.task and key in task and stored != new:
            raise UserError(f"--model_dir={model_dir} was trained as {what} with {key}="
                            f"{stored!r}; this run asks for {key}={new!r}; {fix}")
    new_config = {k: v for k, v in encoder_config.items()
                  if k in old.encoder_config and not _runtime_key(k)}
    changed = [(k, old.encoder_config[k], v) for k, v in new_config.items()
               if old.encoder_config[k] != v]
    if old.encoder_class != encoder_class:
        changed.insert(0, ("encoder class", old.encoder_class, encoder_class))
    if changed:
        key, stored, new = changed[0]
        raise UserError(f"model_dir {model_dir} holds a checkpoint of another architecture: "
                        f"{key}={stored!r} in {path}, this run asks for {key}={new!r}; {fix}")
    if old.lower_case != bool(lower_case):
        raise UserError(f"--model_dir={model_dir} was trained with lower_case={old.lower_case}; "
                        f"this run asks for lower_case={bool(lower_case)}; {fix}")
    if vocab_file is not None and old.vocab_file is not None \
            and _sha256(vocab_file) != _sha256(old.vocab_file):
        raise UserError(f"--model_dir={model_dir} was trained with the vocabulary "
                        f"{old.vocab_file}; this run's {vocab_file} differs from it; {fix}")


def _runtime_key(key: str) -> bool:
    return key in _NOT_ARCHITECTURE or "dropout" in key


def _describe_task(task: dict) -> str:
    labels = task.get("label_names")
    return f"task {task.get('name')!r}" + (f" (labels {labels})" if labels else "")


def trained_task(model_dir: str) -> dict | None:
    """The task entry of a model_dir that a run has trained: it holds checkpoints and a
    bert_train.json. None for a fresh directory, or one written by convert (no task).

    Raises:
      UserError: bert_train.json is unreadable (see `read_model_info`).
    """
    if not (os.path.isfile(os.path.join(model_dir, MODEL_INFO_FILE))
            and _has_checkpoints(model_dir)):
        return None
    task = read_model_info(model_dir).task
    return task if isinstance(task, dict) else None


def _has_checkpoints(directory: str) -> bool:
    return (os.path.isfile(os.path.join(directory, "checkpoint"))
            or bool(glob.glob(os.path.join(glob.escape(directory), f"{CHECKPOINT_NAME}-*.index"))))


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()
