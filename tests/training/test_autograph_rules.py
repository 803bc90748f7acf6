"""AutoGraph leaves this package's traced code as written (bert_trainer/autograph_rules.py).

A real fine-tune (text input pipeline, the training loop with gradient accumulation,
evaluation) runs with AutoGraph's converter watched: no function of `bert_trainer` may be
converted, and the run must still train. Code outside the package is converted as before.
"""

import collections

import gin
import pytest
import tensorflow as tf
from absl import flags
from finetune_testing import shared_file
from tensorflow.python.autograph.impl import api

from bert_trainer import autograph_rules
from bert_trainer.commands import finetune, run_command


@pytest.fixture
def converted(monkeypatch):
    """The modules of the functions AutoGraph converts while the test runs ({module: count})."""
    seen = collections.Counter()
    convert = api._convert_actual

    def watched(entity, program_ctx):
        seen[getattr(entity, "__module__", None) or "?"] += 1
        return convert(entity, program_ctx)

    monkeypatch.setattr(api, "_convert_actual", watched)
    return seen


def test_the_rules_name_this_package_and_tensorflow_text():
    from tensorflow.python.autograph.core import config  # noqa: PLC0415

    rules = {str(rule) for rule in config.CONVERSION_RULES}
    for module in autograph_rules.AS_WRITTEN:
        assert f"DoNotConvert rule for {module}" in rules, rules
    assert {"bert_trainer.training", "bert_trainer.data", "bert_trainer.tasks",
            "tensorflow_text"} <= set(autograph_rules.AS_WRITTEN)


def test_code_outside_the_package_is_still_converted(converted):
    @tf.function
    def absolute(x):
        if x > 0:  # a Python `if` on a tensor: only AutoGraph makes this a graph branch
            return x
        return -x

    assert float(absolute(tf.constant(-2.0))) == 2.0
    assert float(absolute(tf.constant(3.0))) == 3.0
    assert converted[__name__] >= 1


@pytest.mark.slow  # a fine-tune in this process, about 5 s
def test_a_fine_tune_converts_no_function_of_the_package(tiny_pretrained, tmp_path, converted):
    flags.FLAGS.unparse_flags()
    gin.clear_config()
    model_dir = tmp_path / "sst2"
    rc = run_command(finetune, [
        "bert-train finetune", "--task=sst2", f"--train_file={shared_file('sst2/train.tsv')}",
        f"--eval_file={shared_file('sst2/dev.tsv')}", "--max_eval_examples=20",
        "--max_train_examples=64", "--seq_length=32", "--batch_size=16", "--train_steps=2",
        f"--init_checkpoint={tiny_pretrained['dir']}", f"--model_dir={model_dir}",
        "--gin_param=TrainerConfig.accumulation_steps = 2"])
    assert rc == 0
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-2")
    ours = {m: n for m, n in converted.items() if m.startswith("bert_trainer")}
    assert ours == {}, f"AutoGraph converted functions of {sorted(ours)}"
