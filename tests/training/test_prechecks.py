"""The library's side of the checks made before training: data readers, task data, the
encoder spec of a checkpoint prefix, and the finite float flags (fast, no training; the CLI
sweep is tests/cli/test_bad_inputs.py's PRECHECK_CASES)."""

import json

import pytest
from absl import flags

from bert_trainer.commands import shared_flags
from bert_trainer.data import sources
from bert_trainer.errors import UserError
from bert_trainer.tasks import finetuning, registry


def test_a_directory_given_as_an_input_file_is_named(tmp_path):
    with pytest.raises(UserError, match=rf"^input file {tmp_path} is a directory; give a file$"):
        sources.check_file(str(tmp_path))
    with pytest.raises(UserError, match=r"^--eval_file=.* is a directory; give a file$"):
        shared_flags.check_input_files(train_file=None, eval_file=str(tmp_path))
    shared_flags.check_input_files(train_file=str(tmp_path / "absent.tsv"))  # left to readers


@pytest.mark.parametrize("label", ["nan", "inf", "-Infinity", "1e999"])
def test_regression_labels_must_be_finite(tmp_path, label):
    path = tmp_path / "scores.tsv"
    path.write_text(f"text\tlabel\ngood\t0.5\nodd\t{label}\n")
    data = registry.resolve_task_data("regression")
    with pytest.raises(UserError, match=rf"^{path}:3: label '{label}' is not a finite number"):
        data.load("train", file=str(path))


def test_finite_regression_labels_load_as_floats(tmp_path):
    path = tmp_path / "scores.tsv"
    path.write_text("text\tlabel\ngood\t0.5\nbad\t-2e3\n")
    rows = list(registry.resolve_task_data("regression").load("train", file=str(path)))
    assert [float(r["label"]) for r in rows] == [0.5, -2000.0]


def test_label_names_must_be_unique_and_named():
    with pytest.raises(UserError, match=r"^--label_names lists 'b' twice; class names must "):
        registry.resolve_task_data("classification", label_names=["a", "b", "b"])
    with pytest.raises(UserError, match=r"^--label_names holds an empty name"):
        registry.resolve_task_data("classification", label_names=["a", " "])
    with pytest.raises(UserError, match=r"^task 'mine': label_names lists 'x' twice"):
        registry.local_task_data("mine", "classification", label_names=["x", "y", "x"])
    assert registry.resolve_task_data("sst2", label_names=["no", "yes"]).label_names == (
        "no", "yes")


def _squad_file(tmp_path, qas) -> str:
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [
        {"context": "The cat sat on the mat.", "qas": qas}]}]}))
    return str(path)


@pytest.mark.parametrize("unanswerable", [
    {"id": "q2", "question": "Who flew?", "answers": [], "is_impossible": True},
    {"id": "q2", "question": "Who flew?", "answers": []}])
def test_squad_v1_task_refuses_an_unanswerable_question(tmp_path, unanswerable):
    answered = {"id": "q1", "question": "Who sat?",
                "answers": [{"text": "cat", "answer_start": 4}]}
    path = _squad_file(tmp_path, [answered, unanswerable])
    with pytest.raises(UserError, match=rf"^{path}: question q2 is unanswerable \(SQuAD v2\); "
                                        r"use --task=squad_v2$"):
        registry.get_task_data("squad").load("train", file=path)
    rows = list(registry.get_task_data("squad_v2").load("train", file=path))
    assert [bool(r["is_impossible"]) for r in rows] == [False, "is_impossible" in unanswerable]


def test_finite_float_flag_refuses_nan_and_infinities():
    values = flags.FlagValues()
    flags.DEFINE(shared_flags.FiniteFloatParser(), "rate", None, "A rate.", flag_values=values)
    values(["prog", "--rate=2.5e-5"])
    assert values.rate == 2.5e-5
    for bad in ("nan", "inf", "-inf", "1e999"):
        values.unparse_flags()
        with pytest.raises(flags.IllegalFlagValueError,
                           match=rf"^flag --rate={bad}: must be a finite number$"):
            values(["prog", f"--rate={bad}"])


def test_every_float_flag_of_the_commands_is_finite():
    import bert_trainer.commands.create_pretraining_data  # noqa: F401, PLC0415
    import bert_trainer.commands.finetune  # noqa: F401, PLC0415

    floats = {name: flags.FLAGS[name] for name in flags.FLAGS
              if flags.FLAGS[name].parser.flag_type() == "float"
              and flags.FLAGS.find_module_defining_flag(name, "").startswith("bert_trainer.")}
    assert {"learning_rate", "num_epochs", "masked_lm_prob", "short_seq_prob"} <= set(floats)
    assert all(isinstance(f.parser, shared_flags.FiniteFloatParser) for f in floats.values())


def test_num_epochs_must_be_finite():
    with pytest.raises(UserError, match=r"^num_epochs=inf must be > 0 and finite$"):
        finetuning.FinetuneConfig(num_epochs=float("inf"))


def test_a_checkpoint_prefix_names_the_encoder_of_its_directory(tiny_pretrained):
    from_dir = finetuning.spec_from_checkpoint(tiny_pretrained["dir"])
    from_prefix = finetuning.spec_from_checkpoint(tiny_pretrained["prefix"])
    assert from_prefix == from_dir


def test_a_google_checkpoint_prefix_asks_for_its_directory(tmp_path):
    # Google's layout is recognized by its file names (bert_config.json + a .index file).
    (tmp_path / "bert_config.json").write_text("{}")
    (tmp_path / "bert_model.ckpt.index").write_bytes(b"")
    prefix = tmp_path / "bert_model.ckpt"
    with pytest.raises(UserError, match=rf"^--init_checkpoint={prefix}: a Google BERT checkpoint "
                                        rf"is read from its directory; pass "
                                        rf"--init_checkpoint={tmp_path}$"):
        finetuning.spec_from_checkpoint(str(prefix))


@pytest.mark.parametrize("field, value, message", [
    ("weight_decay", float("inf"), "optimizer weight_decay=inf must be a finite number"),
    ("learning_rate", float("nan"), "optimizer learning_rate=nan must be a finite number"),
    ("clip_norm", float("-inf"), "optimizer clip_norm=-inf must be a finite number"),
    ("beta_2", 1.0, "optimizer beta_2=1.0 must be in [0, 1)"),
])
def test_optimizer_values_must_be_finite(field, value, message):
    from bert_trainer.training import OptimizerConfig  # noqa: PLC0415

    with pytest.raises(UserError) as raised:
        OptimizerConfig(**{field: value})
    assert str(raised.value) == message


def test_a_bad_gin_binding_value_is_one_line():
    from bert_trainer.runs import gin_config  # noqa: PLC0415

    with pytest.raises(UserError) as raised:
        gin_config.parse_gin([], ["OptimizerConfig.learning_rate = nan"])
    message = str(raised.value)
    assert message.startswith("--gin_param 'OptimizerConfig.learning_rate = nan'")
    assert "\n" not in message
