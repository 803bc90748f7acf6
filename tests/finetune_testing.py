"""Helpers shared by the fine-tuning task tests: build a task on the tiny pretrained model, train
it with the real Trainer, and read the training loss back from the TensorBoard events; write
the tiny model in other formats; run `bert-train` commands (a subprocess, or in this process)."""

import glob
import importlib
import json
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

from bert_trainer.encoders import BertEncoder
from bert_trainer.interop import formats, hf, pretrained
from bert_trainer.tasks import finetuning, registry
from bert_trainer.training import OptimizerConfig, Trainer, TrainerConfig

# Not conftest's REPO: subprocesses import this module too (outside pytest).
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(REPO, "..", "shared", "data")


def shared_file(relative: str) -> str:
    return os.path.normpath(os.path.join(SHARED_DATA, relative))


def make_task(name: str, pretrained: dict, *, train_file=None, eval_file=None,
              max_train_examples=None, max_eval_examples=None, seq_length=32,
              train_batch_size=16, eval_batch_size=32, dropout_rate=0.0, task_options=None,
              **resolve_options):
    """A task of `registry` on the tiny pretrained model's encoder and vocabulary
    (`resolve_options`: `resolve_task_data`'s, column flags among them)."""
    spec = finetuning.spec_from_checkpoint(pretrained["dir"])
    columns = {k: resolve_options.pop(k) for k in list(resolve_options) if k.endswith("_column")}
    task_data = registry.resolve_task_data(name, train_file=train_file, columns=columns,
                                           **resolve_options)
    config = finetuning.FinetuneConfig(seq_length=seq_length, train_batch_size=train_batch_size,
                                       eval_batch_size=eval_batch_size, dropout_rate=dropout_rate,
                                       shuffle_buffer=1000)
    data = finetuning.DataConfig(train_file=train_file, eval_file=eval_file,
                                 max_train_examples=max_train_examples,
                                 max_eval_examples=max_eval_examples)
    return registry.build_task(task_data, spec, config=config, data=data, **(task_options or {}))


def train(task, model_dir: str, init_checkpoint: str | None, *, steps: int,
          learning_rate: float = 1e-3, summary_interval: int = 5, eval_steps=None):
    """Trains `task` for `steps` steps with the real Trainer; returns (trainer, RunResult)."""
    config = TrainerConfig(train_steps=steps, steps_per_loop=summary_interval,
                           summary_interval=summary_interval, checkpoint_interval=steps,
                           eval_steps=eval_steps, init_checkpoint=init_checkpoint,
                           best_metric=task.best_metric if eval_steps != 0 else None)
    optimizer = OptimizerConfig(learning_rate=learning_rate, warmup_steps=0)
    trainer = Trainer(task, model_dir, config=config, optimizer=optimizer)
    return trainer, trainer.train_and_evaluate()


def scalar_history(model_dir: str, tag: str, subdir: str = "train") -> list[float]:
    """The values of one scalar summary, in step order, from model_dir/<subdir> events."""
    points = []
    for path in glob.glob(os.path.join(model_dir, subdir, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == tag:
                    points.append((event.step, float(tf.make_ndarray(value.tensor))))
    return [v for _, v in sorted(points)]


def assert_encoder_equals(encoder, arrays) -> None:
    """Every encoder variable equals the saved array at the same position."""
    assert len(encoder.weights) == len(arrays)
    for variable, array in zip(encoder.weights, arrays, strict=True):
        np.testing.assert_array_equal(variable.numpy(), array, err_msg=variable.path)


def write_tiny_hf(pretrained_dir: dict, path) -> str:
    """The tiny pretrained encoder as a Hugging Face directory (config.json, safetensors, vocab)."""
    info = finetuning.spec_from_checkpoint(pretrained_dir["dir"])
    encoder = BertEncoder.from_config(info.config)
    encoder.set_weights(pretrained_dir["encoder_weights"])
    ckpt = formats.BertCheckpoint(pretrained.bert_config(encoder),
                                  pretrained.reference_weights(encoder),
                                  pretrained_dir["vocab_file"], True, "weights", "config")
    hf.write_hf(str(path), ckpt)
    return str(path)


def write_tiny_google(hf_dir: str, path) -> str:
    """The tiny encoder as a Google TF1 directory (reference names, bert_config.json, vocab)."""
    ckpt = hf.read_hf(hf_dir)
    path.mkdir(parents=True)
    names = sorted(ckpt.weights)
    tf.raw_ops.SaveV2(prefix=str(path / formats.TF1_PREFIX), tensor_names=names,
                      shape_and_slices=[""] * len(names),
                      tensors=[tf.constant(ckpt.weights[n]) for n in names])
    (path / formats.TF1_CONFIG).write_text(json.dumps(ckpt.config.to_json_dict()))
    (path / formats.VOCAB_FILE).write_bytes(open(ckpt.vocab_file, "rb").read())
    return str(path)


def run_cli(*args) -> subprocess.CompletedProcess:
    """`bert-train ARGS` as a user runs it: a subprocess from the repository root."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-m", "bert_trainer.cli", *map(str, args)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)


def run_in_process(command: str, *args) -> int:
    """Runs a command through the CLI's runner in this process, from a clean flag/gin state."""
    import gin  # noqa: PLC0415 - the command helpers' imports: not for every importer
    from absl import flags  # noqa: PLC0415

    from bert_trainer.commands import run_command  # noqa: PLC0415

    module = importlib.import_module(f"bert_trainer.commands.{command}")
    flags.FLAGS.unparse_flags()  # Flag values must not leak from an earlier run.
    gin.clear_config()
    return run_command(module, [f"bert-train {command}", *map(str, args)])


def error_line(capsys, command: str, *args) -> str:
    """Runs a command in-process; returns the one line it prints for a user error."""
    from bert_trainer.errors import EXIT_USER_ERROR  # noqa: PLC0415

    assert run_in_process(command, *args) == EXIT_USER_ERROR
    stderr = capsys.readouterr().err
    lines = [ln for ln in stderr.splitlines() if ln.startswith(f"bert-train {command}:")]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]
