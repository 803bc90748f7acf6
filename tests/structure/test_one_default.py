"""Every setting has one default, written once: in its config class (or its builder's
signature). A shipped .gin file that binds a setting to the value it already has at that point
(the default, or what a file it includes bound) writes it a second time, and the two drift
apart the day one of them changes. Recipes bind what differs and say the rest in comments.

The effective value before a line follows gin's own order: the files a file includes, in
order, then the file's earlier lines. Re-binding a setting a parent file changed back to the
default is a real binding (demo.gin turns smoke.gin's evaluation off), and is kept.
"""

import ast
import dataclasses
import inspect
import re

from conftest import REPO

from bert_trainer.encoders import builder
from bert_trainer.models import causal_lm
from bert_trainer.tasks import finetuning
from bert_trainer.tasks.causal_lm import task as causal_lm_task
from bert_trainer.tasks.masked_lm import task as pretraining
from bert_trainer.tasks.squad import task as question_answering
from bert_trainer.training import optimization, trainer

CONFIGS = REPO / "bert_trainer" / "configs"
CLASSES = (finetuning.FinetuneConfig, causal_lm_task.CausalLMConfig,
           pretraining.PretrainingConfig, question_answering.SquadConfig,
           optimization.OptimizerConfig, trainer.TrainerConfig)
BUILDERS = {"build_encoder": builder.build_encoder, "build_causal_lm": causal_lm.build_causal_lm}
_BINDING = re.compile(r"^(?P<name>\w+\.\w+)\s*=\s*(?P<value>.+?)\s*$")
_INCLUDE = re.compile(r"^include\s+'(?P<path>[^']+)'")
_UNSET = object()


def defaults() -> dict[str, object]:
    """{"Configurable.parameter": its default} of every configurable a shipped file binds."""
    out = {}
    for cls in CLASSES:
        out.update({f"{cls.__name__}.{f.name}": f.default for f in dataclasses.fields(cls)
                    if f.default is not dataclasses.MISSING})
    for name, fn in BUILDERS.items():
        out.update({f"{name}.{k}": p.default for k, p in inspect.signature(fn).parameters.items()
                    if p.default is not inspect.Parameter.empty})
    return out


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b


def redundant_bindings(files=None) -> list[str]:
    """"FILE:LINE: binding" of every line binding the value its setting already has there."""
    known = defaults()
    files = sorted(CONFIGS.rglob("*.gin")) if files is None else files
    effective_cache: dict = {}
    found = []

    def effective(path, report: bool) -> dict:
        """The literal bindings in effect after `path` (reporting its redundant lines)."""
        if not report and path in effective_cache:
            return effective_cache[path]
        values: dict = {}
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            include = _INCLUDE.match(line)
            if include:
                values.update(effective(REPO / "bert_trainer" / include["path"], False))
                continue
            binding = _BINDING.match(line)
            if not binding:
                continue
            try:
                value = ast.literal_eval(binding["value"])
            except (ValueError, SyntaxError):  # a reference, a macro, a comment after it
                values.pop(binding["name"], None)
                continue
            before = values.get(binding["name"], known.get(binding["name"], _UNSET))
            if report and _same(before, value):
                where = path.relative_to(REPO) if REPO in path.parents else path
                found.append(f"{where}:{number}: {line.strip()}")
            values[binding["name"]] = value
        effective_cache[path] = values
        return values

    for path in files:
        effective(path, True)
    return found


def test_no_shipped_gin_file_writes_a_default_again():
    redundant = redundant_bindings()
    assert not redundant, ("these bindings repeat the value the setting already has (its "
                           "default, or an included file's); drop them (say the value in a "
                           "comment if the recipe should show it):\n" + "\n".join(redundant))


def test_the_check_finds_a_repeated_default_and_keeps_a_real_reset(tmp_path):
    # Guards the reader: a rule that finds nothing passes vacuously.
    parent = tmp_path / "parent.gin"
    parent.write_text("TrainerConfig.eval_steps = 10\n", encoding="utf-8")
    child = tmp_path / "child.gin"
    child.write_text(f"include '{parent}'\n"
                     "TrainerConfig.eval_steps = None\n"  # a reset: kept
                     "FinetuneConfig.seq_length = 128\n"  # the default again
                     "FinetuneConfig.seq_length = 64\n"
                     "OptimizerConfig.epsilon = 1e-6\n"  # the default again
                     "OptimizerConfig.clip_norm = 1\n", encoding="utf-8")  # 1.0: not the same
    include_root = REPO / "bert_trainer"
    # `include` paths resolve under bert_trainer/ as the shipped configs' do; an absolute one
    # stays absolute.
    assert (include_root / str(parent)) == parent
    found = [line.split(": ", 1)[1] for line in redundant_bindings([child])]
    assert found == ["FinetuneConfig.seq_length = 128", "OptimizerConfig.epsilon = 1e-6"]
    assert defaults()["FinetuneConfig.seq_length"] == 128
    assert defaults()["OptimizerConfig.epsilon"] == 1e-6
    assert _same(defaults()["OptimizerConfig.clip_norm"], 1.0)
