"""`resolve_checkpoint`: every format resolved once, one warm-start path, settings derived once."""

import dataclasses
import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from finetune_testing import (
    assert_encoder_equals,
    run_in_process,
    shared_file,
    write_tiny_google,
    write_tiny_hf,
)

from bert_trainer.checkpoints.layout import model_trackable
from bert_trainer.errors import UserError
from bert_trainer.interop import formats, resolve, tensor_files
from bert_trainer.interop.resolve import resolve_checkpoint
from bert_trainer.tasks import finetuning, registry, run_settings
from bert_trainer.training import OptimizerConfig, Trainer, TrainerConfig

ARCHITECTURE = ("vocab_size", "hidden_size", "num_layers", "num_attention_heads", "inner_dim",
                "max_sequence_length", "type_vocab_size")


@pytest.fixture
def sources(tiny_pretrained, tmp_path):
    hf_dir = write_tiny_hf(tiny_pretrained, tmp_path / "hf")
    keras.backend.clear_session()
    return {"bert_train": tiny_pretrained["dir"], "hf": hf_dir,
            "tf1": write_tiny_google(hf_dir, tmp_path / "google")}


def test_each_format_resolves_to_its_config_and_vocabulary(sources, tiny_pretrained):
    ours = resolve_checkpoint(sources["bert_train"])
    assert (ours.format, ours.directory, ours.prefix) == ("bert_train", sources["bert_train"],
                                                          None)
    assert ours.vocab_file == tiny_pretrained["vocab_file"] and ours.lower_case
    assert isinstance(ours, resolve.BertTrainCheckpoint)
    assert ours.registered_name == "bert_trainer>BertEncoder"
    expected = {k: ours.encoder_config[k] for k in ARCHITECTURE}
    assert expected["hidden_size"] == 32 and expected["num_layers"] == 1
    for kind in ("hf", "tf1"):
        theirs = resolve_checkpoint(sources[kind])
        assert theirs.format == kind and theirs.directory == sources[kind]
        assert isinstance(theirs, resolve.ReferenceCheckpoint)
        assert theirs.vocab_file == f"{sources[kind]}/vocab.txt" and theirs.lower_case
        assert {k: theirs.encoder_config[k] for k in ARCHITECTURE} == expected
        assert theirs.bert_config.hidden_size == 32
        assert theirs.read_reference().has(formats.POOLER)
    prefix = resolve_checkpoint(tiny_pretrained["prefix"])
    assert (prefix.format, prefix.prefix) == ("bert_train", tiny_pretrained["prefix"])
    assert prefix.encoder_config == ours.encoder_config


def test_a_plain_tf_checkpoint_resolves_for_the_trainer_only(sources, tmp_path):
    encoder = resolve_checkpoint(sources["bert_train"]).build_encoder()
    prefix = tf.train.Checkpoint(model=model_trackable(encoder)).write(
        str(tmp_path / "plain" / "ckpt"))
    plain = resolve_checkpoint(prefix, any_tf_checkpoint=True)
    assert (plain.format, plain.prefix, plain.encoder_config, plain.vocab_file) == (
        resolve.TF_CHECKPOINT, prefix, None, None)
    with pytest.raises(UserError, match="is not a BERT checkpoint directory"):
        resolve_checkpoint(prefix)
    # Each format refuses, in one line, what it cannot do.
    with pytest.raises(UserError, match=r"plain/ckpt holds no encoder config \(no bert_train"):
        plain.build_encoder()
    with pytest.raises(UserError, match=r"^\S+/plain/ckpt is a tf_checkpoint checkpoint, not a "
                                        "Hugging Face or Google one; load it with "):
        plain.read_reference()
    with pytest.raises(UserError, match=r"/hf is a hf checkpoint of an encoder, not of this "
                                        "model; warm-start a fine-tuning or pretraining task"):
        resolve_checkpoint(sources["hf"]).restore_model(encoder)
    with pytest.raises(UserError, match=r"^--init_checkpoint=\S+/nowhere: no checkpoint there"):
        resolve_checkpoint(str(tmp_path / "nowhere"), any_tf_checkpoint=True)
    with pytest.raises(UserError, match=r"^--init_checkpoint=\S+/nowhere does not exist; pass a "
                                        r"bert-train model directory"):
        resolve_checkpoint(str(tmp_path / "nowhere"), flag="--init_checkpoint")


def test_every_format_loads_the_same_weights(sources, tiny_pretrained):
    for path in sources.values():
        checkpoint = resolve_checkpoint(path)
        encoder = checkpoint.build_encoder()
        report = checkpoint.load(encoder=encoder)
        assert report["initialized"] == [], path
        assert_encoder_equals(encoder, tiny_pretrained["encoder_weights"])
        keras.backend.clear_session()


def _warm_start(spec_source: str, tiny_pretrained, model_dir) -> Trainer:
    """What finetune does: resolve once for the spec, then the trainer warm-starts the task."""
    del tiny_pretrained
    train_file = shared_file("sst2/dev.tsv")
    task = registry.build_task(registry.resolve_task_data("sst2", train_file=train_file),
                               finetuning.spec_from_checkpoint(spec_source),
                               config=finetuning.FinetuneConfig(seq_length=32),
                               data=finetuning.DataConfig(train_file=train_file))
    config = TrainerConfig(train_steps=1, init_checkpoint=spec_source)
    return Trainer(task, str(model_dir), config=config, optimizer=OptimizerConfig(warmup_steps=0))


def test_a_hugging_face_file_is_read_once_per_warm_start(sources, tiny_pretrained, tmp_path,
                                                         monkeypatch):
    opened = []

    def counting_open(path, **kwargs):
        opened.append(path)
        return real_open(path, **kwargs)

    # Resolving reads the file's header only (checked against config.json, not counted
    # here); the tensors are opened once.
    real_open = tensor_files.safe_open
    monkeypatch.setattr(tensor_files, "safe_open", counting_open)
    trainer = _warm_start(sources["hf"], tiny_pretrained, tmp_path / "run")
    assert opened == [f"{sources['hf']}/model.safetensors"]
    assert_encoder_equals(trainer.model.encoder, tiny_pretrained["encoder_weights"])
    assert len(trainer.task.warm_start_report["loaded"]) == len(
        tiny_pretrained["encoder_weights"])


def test_bert_train_and_hugging_face_warm_start_through_one_loader(sources, tiny_pretrained,
                                                                   tmp_path, monkeypatch):
    calls = []

    def recording(real_load):
        def recording_load(self, **parts):
            calls.append(self.format)
            return real_load(self, **parts)
        return recording_load

    for cls in (resolve.BertTrainCheckpoint, resolve.ReferenceCheckpoint):
        monkeypatch.setattr(cls, "load", recording(cls.load))
    for kind in ("bert_train", "hf"):
        trainer = _warm_start(sources[kind], tiny_pretrained, tmp_path / kind)
        assert_encoder_equals(trainer.model.encoder, tiny_pretrained["encoder_weights"])
        keras.backend.clear_session()
    assert calls == ["bert_train", "hf"]


class _FakeTask:
    best_metric, best_metric_mode = "f1", "max"

    def __init__(self, rows: int, **config):
        self.config = finetuning.FinetuneConfig(**config)
        self.rows = rows

    def num_train_rows(self) -> int:
        return self.rows


def test_derive_settings_computes_each_value_once():
    task = _FakeTask(50, num_epochs=2.0, train_batch_size=8, warmup_fraction=0.1)
    settings = run_settings.derive_settings(task, init_checkpoint="/models/bert")
    assert (settings.train_steps, settings.warmup_steps) == (13, 1)  # ceil(100 / 8), int(1.3)
    assert settings.gin_bindings() == [
        "TrainerConfig.train_steps = 13", "OptimizerConfig.warmup_steps = 1",
        "TrainerConfig.best_metric = 'f1'", "TrainerConfig.best_metric_mode = 'max'",
        "TrainerConfig.init_checkpoint = '/models/bert'"]
    assert settings.arguments("OptimizerConfig") == {"warmup_steps": 1}
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.train_steps = 3
    # What gin or a flag bound is taken as it is and neither passed on nor recorded again.
    bound = run_settings.derive_settings(
        _FakeTask(50, warmup_fraction=None), train_steps=7, best_metric_bound=True)
    assert (bound.train_steps, bound.warmup_steps, bound.derived) == (7, None, ())
    assert bound.arguments("TrainerConfig") == {} and bound.to_json() == {}


@pytest.mark.slow  # trains end to end in this process
def test_derived_settings_are_recorded_and_gin_is_left_as_parsed(sources, tmp_path, capsys):
    import gin  # noqa: PLC0415

    run = tmp_path / "run"
    assert run_in_process(
        "finetune", "--task=sst2", f"--train_file={shared_file('sst2/dev.tsv')}",
        f"--eval_file={shared_file('sst2/dev.tsv')}", "--max_train_examples=20",
        "--max_eval_examples=8", "--seq_length=16", "--batch_size=8", "--num_epochs=1",
        "--long_texts=truncate",
        f"--init_checkpoint={sources['hf']}", f"--model_dir={run}") == 0, capsys.readouterr()
    # 20 rows (truncated: one each) x 1 epoch / batch 8 = 3 steps.
    info = json.loads((run / "bert_train.json").read_text())
    assert info["run_settings"] == {"train_steps": 3, "warmup_steps": 0,
                                    "best_metric": "accuracy", "best_metric_mode": "max",
                                    "init_checkpoint": sources["hf"]}
    operative = (run / "operative_config.gin").read_text()
    derived = operative.split("# Derived by the command")[1]
    for line in ("TrainerConfig.train_steps = 3", "OptimizerConfig.warmup_steps = 0",
                 "TrainerConfig.best_metric = 'accuracy'",
                 f"TrainerConfig.init_checkpoint = '{sources['hf']}'"):
        assert line in derived.splitlines(), line
    # Nothing was bound into gin halfway through the command.
    for name in ("TrainerConfig.train_steps", "TrainerConfig.best_metric",
                 "OptimizerConfig.warmup_steps", "TrainerConfig.init_checkpoint"):
        with pytest.raises(ValueError):
            gin.query_parameter(name)
    assert np.isfinite(json.loads((run / "eval_results.json").read_text())["metrics"]["loss"])
