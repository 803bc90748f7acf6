"""Task families: which exist, and how plugin families are found.

Families register themselves (`register_family`) when their module is imported. The
built-in ones (`BUILT_IN`: one line per family) are imported on first use; others are
plugins, imported from
- `import_family_modules("my.module")`: the commands' `--family_module` flag;
- the `BERT_TRAIN_FAMILIES` environment variable (comma-separated modules);
- the `bert_train.families` entry-point group of installed packages (each entry point names
  a module, or an object to call, that registers its family);
- never from what a model directory records: its bert_train.json's "family_module" is named
  in the message of `family_from_info` (pass it with --family_module if you trust it).

Task names (`bert_trainer.tasks.registry`) and rebuilding a model directory's task
(`bert_trainer.tasks.rebuild`) look families up here.
"""

import importlib
import os
from importlib import metadata

from bert_trainer.errors import UserError
from bert_trainer.tasks.family import Family

BUILT_IN = {
    "classification": "bert_trainer.tasks.classification",
    "regression": "bert_trainer.tasks.regression",
    "squad": "bert_trainer.tasks.squad",
    "tagging": "bert_trainer.tasks.tagging",
    "translate": "bert_trainer.tasks.translate",
    "causal_lm": "bert_trainer.tasks.causal_lm",
    "masked_lm": "bert_trainer.tasks.masked_lm",
}
# What a family's model directories record as "family", where it is not the family's name:
# masked-LM pretraining has always written "pretraining".
RECORDED_NAMES = {"pretraining": "masked_lm"}
ENV_VAR = "BERT_TRAIN_FAMILIES"
ENTRY_POINT_GROUP = "bert_train.families"

_families: dict[str, Family] = {}
_plugins_loaded = False


def register_family(family: Family) -> Family:
    """Makes `family` known by its name (and its datasets by theirs); returns it.

    Registering the same family class again replaces the earlier object (a module imported
    twice); another family under a taken name, or a dataset name another family declares, is
    refused.
    """
    if not isinstance(family, Family) or not family.name:
        raise UserError(f"register_family: {family!r} is not a named tasks.family.Family")
    old = _families.get(family.name)
    built_in = BUILT_IN.get(family.name)
    if built_in and not family.module_name().startswith(built_in):
        raise UserError(f"task family '{family.name}' is already registered by {built_in}; "
                        "give the family another name")
    if old is not None and type(old).__qualname__ != type(family).__qualname__:
        raise UserError(f"task family '{family.name}' is already registered by "
                        f"{old.module_name()}; give the family another name")
    names = {t.name for t in family.presets()} | set(family.local_tasks)
    for other in _families.values():
        if other.name != family.name:
            clash = names & ({t.name for t in other.presets()} | set(other.local_tasks))
            if clash:
                raise UserError(f"task family '{family.name}' declares the task "
                                f"'{sorted(clash)[0]}' of family '{other.name}'; rename it")
    _families[family.name] = family
    return family


def _import(module: str, source: str) -> None:
    """Imports a family module the user named; any failure is one line naming the module."""
    if "/" in module or "\\" in module or module.endswith(".py"):
        name = os.path.splitext(os.path.basename(module))[0]
        raise UserError(f"{source}: '{module}' is a file path, not a module name; put its "
                        f"folder on PYTHONPATH and pass --family_module={name}")
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise UserError(f"{source}: cannot import the task family module '{module}' ({e}); "
                        "install it or fix PYTHONPATH") from None
    except Exception as e:  # noqa: BLE001 (the plugin's own code failed: one line, named)
        first = (str(e).strip().splitlines() or [""])[0]
        error = UserError(f"{source}: importing the task family module '{module}' failed: "
                          f"{type(e).__name__}: {first}; fix the module")
        raise error from None


def import_family_modules(modules, source: str = "--family_module") -> None:
    """Imports plugin family modules (each registers its family when imported).

    Args:
      modules: a comma-separated string or a list of module names; None or empty: none.
      source: named in error messages.
    """
    if isinstance(modules, str):
        modules = modules.split(",")
    for module in modules or ():
        if module.strip():
            _import(module.strip(), source)


def load_plugins() -> None:
    """Imports the families of `BERT_TRAIN_FAMILIES` and of the entry points, once."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    import_family_modules(os.environ.get(ENV_VAR), ENV_VAR)
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = entry.load()
        except ImportError as e:
            raise UserError(f"entry point {entry.name} ({ENTRY_POINT_GROUP}) of an installed "
                            f"package cannot be imported ({e})") from None
        if isinstance(loaded, Family):
            register_family(loaded)
        elif callable(loaded) and not isinstance(loaded, type):
            loaded()


def _built_in(name: str) -> None:
    """Imports a built-in family's package; registers its `FAMILY` if the import did not
    (a package imported before the registry was reset)."""
    if name not in _families:
        register_family(importlib.import_module(BUILT_IN[name]).FAMILY)


def families() -> list[Family]:
    """Every family: the built-in ones and the plugins."""
    for name in BUILT_IN:
        _built_in(name)
    load_plugins()
    return list(_families.values())


def get_family(name: str) -> Family:
    """The family named `name` (the built-in one is imported on first use).

    Raises:
      UserError: no such family (the message lists the known ones).
    """
    if name in BUILT_IN:
        _built_in(name)
    if name not in _families:
        load_plugins()
    if name not in _families:
        known = sorted({f.name for f in families()})
        raise UserError(f"unknown task family '{name}'; known: {', '.join(known)} (a plugin "
                        f"family needs --family_module or {ENV_VAR})")
    return _families[name]


def registered(name: str | None) -> Family | None:
    """The family registered as `name` now (nothing is imported), or None."""
    return _families.get(name) if name else None


def objectives() -> dict:
    """{name: pretraining objective (`tasks.objective.Objective`)} of the built-in families
    (and of any family registered so far: no plugin is imported for it)."""
    for name in BUILT_IN:
        _built_in(name)
    return {f.objective.name: f.objective for f in _families.values()
            if f.objective is not None}


def objective(name: str):
    """The pretraining objective of `pretraining_objective.name` `name`, from the family that
    owns it.

    Raises:
      UserError: no family has it (the message lists the known ones).
    """
    owned = objectives()
    if name not in owned:
        raise UserError(f"pretraining_objective.name={name!r} is unknown; use one of "
                        f"{', '.join(sorted(owned))}")
    return owned[name]


def family_from_info(task: dict, where: str = "model info") -> Family:
    """The family of a stored task entry.

    A model directory (or export) from elsewhere never chooses what is imported: a plugin
    family is found only if the user named its module (`--family_module`, `BERT_TRAIN_FAMILIES`
    or an installed entry point); the recorded "family_module" is only named in the message.
    """
    name = task.get("family")
    if not name:
        raise UserError(f"{where}: the task entry names no family; pass --task")
    name = RECORDED_NAMES.get(name, name)
    if name not in _families and name not in BUILT_IN:
        load_plugins()
    module = task.get("family_module")
    if name not in _families and name not in BUILT_IN and module:
        raise UserError(f"{where}: the task family '{name}' is in the module '{module}', which "
                        "is imported only when you name it (a model directory does not choose "
                        f"what runs); if you trust it, pass --family_module={module}")
    return get_family(name)
