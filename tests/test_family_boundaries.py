"""Nothing outside a task family's own package branches on a family's name.

The registry, the exporter, `predict` and the commands ask the family object
(`bert_trainer/tasks/family.py`); a comparison such as `family == "squad"` or
`family in ("classification", "regression")` anywhere else would bring back the scattered
special cases that plugin families cannot reach.
"""

import ast
import pathlib

from bert_trainer.commands import common
from bert_trainer.tasks import registry

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "bert_trainer"
FAMILY_DIRS = {PACKAGE / "tasks" / name for name in registry.BUILT_IN}
NAMES = set(registry.BUILT_IN)


def _names_in(node) -> set[str]:
    """Family names that a compared expression spells out (a string, or a tuple/list/set)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_names_in(e) for e in node.elts)) if node.elts else set()
    return set()


def name_branches(source: str) -> list[tuple[int, str]]:
    """(line, family name) of every comparison against a family name in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                found += [(node.lineno, name) for name in sorted(_names_in(operand))]
        elif isinstance(node, ast.Match):  # match family: case "squad": ...
            for case in node.cases:
                pattern = case.pattern
                if isinstance(pattern, ast.MatchValue):
                    found += [(case.pattern.lineno, n) for n in _names_in(pattern.value)]
    return found


def test_the_check_finds_name_branches():
    source = ('if family == "squad": pass\n'
              'x = task.family in ("classification", "regression")\n'
              'y = "tagging" != kind\n'
              'z = family == "pretraining" or name in ("sst2",)\n')
    assert name_branches(source) == [(1, "squad"), (2, "classification"), (2, "regression"),
                                     (3, "tagging")]


def test_no_family_name_branches_outside_the_family_packages():
    checked, offenders = 0, []
    for path in sorted(PACKAGE.rglob("*.py")):
        if any(d in path.parents for d in FAMILY_DIRS):
            continue
        checked += 1
        offenders += [f"{path.relative_to(PACKAGE.parent)}:{line}: compares with {name!r}"
                      for line, name in name_branches(path.read_text(encoding="utf-8"))]
    assert checked > 50  # the walk saw the package
    assert offenders == [], "ask the family object instead:\n" + "\n".join(offenders)


def test_every_built_in_family_is_one_registered_package():
    for name, module in registry.BUILT_IN.items():
        family = registry.get_family(name)
        assert family.name == name and family.module_name().startswith(module + ".")
        assert (PACKAGE / "tasks" / name / "__init__.py").is_file()
        if not (family.presets() or family.local_tasks):
            continue  # no fine-tuning tasks (causal_lm generates): no finetune recipe
        assert family.recipe == f"configs/tasks/{name}.gin"
        assert pathlib.Path(common.resolve_gin_file(family.recipe)).is_file()


def test_pretraining_objectives_are_families_that_pretrain_asks():
    """`bert-train pretrain` asks `registry.objective` (tasks/objective.py): each objective
    is a built-in family's, named in configurables' list, with registered gin configurables."""
    from bert_trainer import configurables

    owners = {f.objective.name: f for f in registry.families() if f.objective is not None}
    assert sorted(owners) == sorted(configurables.PRETRAINING_OBJECTIVES)
    for name, family in owners.items():
        assert family.name in registry.BUILT_IN and registry.objective(name) is family.objective
        objective = family.objective
        assert hasattr(configurables, objective.config_name), objective.config_name
        assert callable(getattr(configurables, objective.builder_name)), objective.builder_name
    assert owners["masked_lm"].exports_encoder and not owners["causal_lm"].exports_encoder
    # What masked-LM model directories record ("pretraining") is read as its family.
    assert registry.family_from_info({"family": "pretraining"}) is owners["masked_lm"]
    pretrain = (PACKAGE / "commands" / "pretrain.py").read_text(encoding="utf-8")
    assert "registry.objective(" in pretrain
    for module in ("tasks.causal_lm", "tasks.masked_lm", "CausalLMTask", "PretrainingTask"):
        assert module not in pretrain, f"commands/pretrain.py names {module}: ask the objective"

