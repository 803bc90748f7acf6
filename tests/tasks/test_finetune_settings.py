"""`FinetuneSettings` (`runs.finetuning`): finetune's flags read once, and what they bind in gin
and in the data."""

import dataclasses
import types

import pytest

from bert_trainer.commands.finetune import settings_from_flags
from bert_trainer.data.sources import TextColumns
from bert_trainer.errors import UserError
from bert_trainer.runs.finetuning import COLUMN_FLAGS, FinetuneSettings
from bert_trainer.tasks import registry


def parsed(**given) -> types.SimpleNamespace:
    """A parsed command line: every flag the settings read, None unless given."""
    names = [f.name for f in dataclasses.fields(FinetuneSettings)
             if f.name not in ("columns", "data")]
    data = ["train_file", "eval_file", "data_dir", "max_train_examples", "max_eval_examples"]
    values = {name: None for name in [*names, *data, *COLUMN_FLAGS, "gin_file", "gin_param"]}
    values.update(gin_file=[], gin_param=[], skip_bad_rows=None)
    return types.SimpleNamespace(**{**values, **given})


def test_the_flags_are_read_into_typed_fields():
    settings = settings_from_flags(parsed(
        task="sst2", seq_length=64, text_column="review", label_column="stars",
        seeds=["1", "2"], label_names=["neg", "pos"], gin_file=["a.gin"],
        gin_param=["x.y = 1"], train_file="t.tsv", max_eval_examples=9))
    assert (settings.task, settings.seq_length) == ("sst2", 64)
    assert settings.columns == {"text_column": "review", "label_column": "stars"}
    assert (settings.seeds, settings.label_names) == (("1", "2"), ("neg", "pos"))
    assert (settings.gin_files, settings.gin_params) == (("a.gin",), ("x.y = 1",))
    assert (settings.data.train_file, settings.data.max_eval_examples) == ("t.tsv", 9)
    assert settings.data.skip_bad_rows is False  # not given: off
    with pytest.raises(UserError, match=r"^--max_train_examples=0 must be >= 1$"):
        settings_from_flags(parsed(max_train_examples=0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.task = "cola"


def test_only_the_flags_given_become_gin_bindings_of_the_family():
    classification = registry.family_of("sst2")
    settings = FinetuneSettings(seq_length=64, learning_rate=3e-4, doc_stride=16,
                                window_pooling="max")
    assert settings.gin_bindings(classification) == [
        "FinetuneConfig.seq_length = 64", "OptimizerConfig.learning_rate = 0.0003",
        "FinetuneConfig.doc_stride = 16", "FinetuneConfig.window_pooling = 'max'"]
    squad = registry.family_of("squad")
    assert FinetuneSettings(doc_stride=32).gin_bindings(squad) == ["SquadConfig.doc_stride = 32"]
    with pytest.raises(UserError, match=r"^--long_texts=truncate does not apply to squad tasks"):
        FinetuneSettings(long_texts="truncate").gin_bindings(squad)
    with pytest.raises(UserError, match=r"^--window_pooling applies to .*, not to squad tasks"):
        FinetuneSettings(window_pooling="mean").gin_bindings(squad)


def test_column_flags_map_to_the_family_s_columns_and_are_checked_in_one_place():
    translate = registry.resolve_task_data(
        "translate", columns={"source_column": "en", "target_column": "2"})
    assert translate.columns == TextColumns("en", 2, None)
    assert translate.text_keys == ("text", "text_b")
    with pytest.raises(UserError, match=r"^--text_column does not apply to translate tasks; "
                                        r"their columns are --source_column"):
        registry.resolve_task_data("translate", columns={"text_column": "x"})
    with pytest.raises(UserError, match=r"^column flags \(--label_column\) apply to "
                                        r"classification, regression and translate files, not "
                                        r"to task 'squad' \(squad\)"):
        registry.resolve_task_data("squad", columns={"label_column": "y"})
    unset = registry.resolve_task_data("sst2", columns={"text_column": None})
    assert unset.columns == registry.get_task_data("sst2").columns
