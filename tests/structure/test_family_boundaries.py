"""Nothing outside a task family's own package branches on a family's name.

The registry, the exporter, `predict` and the commands ask the family object
(`bert_trainer/tasks/family.py`); a comparison such as `family == "squad"` or
`family in ("classification", "regression")` anywhere else would bring back the scattered
special cases that plugin families cannot reach.
"""

import ast
import pathlib

from conftest import REPO

from bert_trainer.runs import gin_config
from bert_trainer.tasks import plugins

PACKAGE = REPO / "bert_trainer"
FAMILY_DIRS = {PACKAGE / "tasks" / name for name in plugins.BUILT_IN}
NAMES = set(plugins.BUILT_IN)


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
    for name, module in plugins.BUILT_IN.items():
        family = plugins.get_family(name)
        assert family.name == name and family.module_name().startswith(module + ".")
        assert (PACKAGE / "tasks" / name / "__init__.py").is_file()
        if not (family.presets() or family.local_tasks):
            continue  # no fine-tuning tasks (causal_lm generates): no finetune recipe
        assert family.recipe == f"configs/tasks/{name}.gin"
        assert pathlib.Path(gin_config.resolve_gin_file(family.recipe)).is_file()


def test_pretraining_objectives_are_families_that_pretrain_asks():
    """`bert-train pretrain`'s run builder (`runs/pretraining.py`) asks `plugins.objective`
    (tasks/objective.py): each objective is a built-in family's, named in configurables' list,
    with registered gin configurables; neither it nor the command names an objective."""
    from bert_trainer import configurables

    owners = {f.objective.name: f for f in plugins.families() if f.objective is not None}
    assert sorted(owners) == sorted(configurables.PRETRAINING_OBJECTIVES)
    for name, family in owners.items():
        assert family.name in plugins.BUILT_IN and plugins.objective(name) is family.objective
        objective = family.objective
        assert hasattr(configurables, objective.config_name), objective.config_name
        assert callable(getattr(configurables, objective.builder_name)), objective.builder_name
    assert owners["masked_lm"].exports_encoder and not owners["causal_lm"].exports_encoder
    # What masked-LM model directories record ("pretraining") is read as its family.
    assert plugins.family_from_info({"family": "pretraining"}) is owners["masked_lm"]
    builder = (PACKAGE / "runs" / "pretraining.py").read_text(encoding="utf-8")
    assert "plugins.objective(" in builder
    for path in ("runs/pretraining.py", "commands/pretrain.py"):
        source = (PACKAGE / path).read_text(encoding="utf-8")
        for module in ("tasks.causal_lm", "tasks.masked_lm", "CausalLMTask", "PretrainingTask"):
            assert module not in source, f"{path} names {module}: ask the objective"



# Each pretraining objective's corpus writer (what `create_pretraining_data --objective` runs):
# its family's corpus.py.
CORPUS_WRITERS = {f.objective.name: f"bert_trainer.tasks.{f.name}.corpus"
                  for f in plugins.families() if f.objective is not None}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str) -> set[str]:
    """Every module an `import` or `from ... import` in `source` may load (module level or in
    a function): `from a.b import c` gives both "a.b" and "a.b.c"."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_check_finds_imports_of_a_module():
    source = ("import a.b.corpus\n"
              "def f():\n"
              "    from a.b import corpus as c\n"
              "    from a.c.corpus import write\n")
    assert {"a.b.corpus", "a.c.corpus"} <= imported_modules(source)
    assert "a.corpus" not in imported_modules(source)


def test_only_its_family_imports_an_objectives_corpus_writer():
    """`create_pretraining_data` asks the objective (`plugins.objective(name).write_corpus`);
    the Beam pipeline and the worker pool receive the writer's functions as arguments. No
    other module (another family's writer included) imports a corpus writer."""
    assert set(CORPUS_WRITERS) == set(plugins.objectives())
    for name in CORPUS_WRITERS:
        assert (PACKAGE / "tasks" / name / "corpus.py").is_file(), name
    checked, offenders = 0, []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        imported = imported_modules(path.read_text(encoding="utf-8"))
        checked += 1
        for name, writer in CORPUS_WRITERS.items():
            if module == writer or PACKAGE / "tasks" / name in path.parents:
                continue
            if writer in imported:
                offenders.append(f"{path.relative_to(PACKAGE.parent)} imports {writer}")
    assert checked > 50
    assert offenders == [], "ask plugins.objective(name) instead:\n" + "\n".join(offenders)
    command = (PACKAGE / "commands" / "create_pretraining_data.py").read_text(encoding="utf-8")
    assert "plugins.objective(" in command


def test_create_pretraining_data_offers_every_objective():
    """Its --objective choices are spelled out (no TensorFlow for --help): the objectives',
    the default first."""
    from bert_trainer.commands import create_pretraining_data as command  # noqa: PLC0415

    assert sorted(command.OBJECTIVES) == sorted(plugins.objectives())
    assert command.OBJECTIVES[0] == "masked_lm"
