"""The package's import graph: no cycles, and the layer library stays below training and gin.

Imports are read from the source with `ast` (nothing is imported), both the module-level ones
and those inside functions. A function-level import counts: deferring an import (here, to keep
TensorFlow out of `--help`) changes when it runs, not what depends on what, so it must not
hide a cycle or an upward dependency. Failures name each edge with its module and line.

The commands are read the same way for one rule of docs/layout.md ("a command-line flag"): a
command reads its flags in `main` and passes them down, so no other function reads `FLAGS`.
"""

import ast
import collections
import dataclasses
import pathlib

import pytest
from conftest import REPO

PACKAGE = REPO / "bert_trainer"

# The layer library, lowest first: each may import the ones before it, never those after.
LIBRARY = ("layers", "heads", "encoders", "models")
# heads and encoders are siblings: neither imports the other.
SIBLINGS = {("heads", "encoders"), ("encoders", "heads")}
# What the layer library never imports: training, the command line, checkpoint conversion and
# storage, gin (and the module that registers builders with it), and everything above models.
FORBIDDEN_FOR_LIBRARY = (
    "bert_trainer.training", "bert_trainer.commands", "bert_trainer.interop",
    "bert_trainer.checkpoints", "bert_trainer.configurables", "bert_trainer.tasks",
    "bert_trainer.export", "bert_trainer.data", "bert_trainer.cli", "bert_trainer.demo")
FORBIDDEN_THIRD_PARTY = ("gin",)
COMMANDS = PACKAGE / "commands"
# Modules of commands/ whose functions may read FLAGS below a `main`: shared_flags is the flag
# machinery itself (`declare` registers a flag several commands take, `apply_defaults` sets
# its default for the command about to run, before its `main`), not a command reading a flag.
FLAG_MACHINERY = ("shared_flags.py",)


@dataclasses.dataclass(frozen=True)
class Edge:
    source: str  # the importing module, e.g. "bert_trainer.layers.dropout"
    target: str  # the imported bert_trainer module (or the third-party top-level name)
    line: int
    deferred: bool  # inside a function, so it runs when called rather than at import

    def __str__(self):
        where = "in a function, " if self.deferred else ""
        return f"{self.source} -> {self.target} ({where}line {self.line})"


def _modules() -> dict[str, pathlib.Path]:
    """Every module of the package by dotted name ("bert_trainer.layers" for an __init__)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The module that `name` (a module, or a name defined in one) lives in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> list[Edge]:
    """The imports of `module`: bert_trainer modules resolved, others by top-level name."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    edges = []

    def add(name, node, deferred):
        if name.split(".")[0] == "bert_trainer":
            target = _owner(name)
            if target is not None and target != module:
                edges.append(Edge(module, target, node.lineno, deferred))
        else:
            edges.append(Edge(module, name.split(".")[0], node.lineno, deferred))

    def visit(node, deferred):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, child, deferred)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: from the package, up level - 1
                    anchor = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([child.module] if child.module else []))
                for alias in child.names:  # `from pkg import submodule` imports the submodule
                    full = f"{base}.{alias.name}"
                    add(full if full in MODULES else base, child, deferred)
            visit(child, deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                        ast.Lambda)))

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), False)
    return edges


EDGES = {module: _imports(module) for module in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _describe(cycles, key, deferred: bool) -> str:
    """Each cycle with the edges that close it (function-level ones if `deferred`)."""
    lines = []
    for members in cycles:
        inside = set(members)
        lines.append(" <-> ".join(members))
        lines += dict.fromkeys(  # `from m import a, b` is one edge per name: listed once
            f"    {edge}" for module in MODULES for edge in EDGES[module]
            if key(edge.source) in inside and key(edge.target) in inside
            and key(edge.source) != key(edge.target) and (deferred or not edge.deferred))
    return "\n".join(lines)


def _graph(key, deferred: bool) -> dict[str, set[str]]:
    graph = collections.defaultdict(set)
    for module, edges in EDGES.items():
        for edge in edges:
            if (edge.target in MODULES and (deferred or not edge.deferred)
                    and key(module) != key(edge.target)):
                graph[key(module)].add(key(edge.target))
    return graph


def _part(module: str) -> str:
    """The part of the package a module belongs to: "bert_trainer.data", "bert_trainer.cli"."""
    return ".".join(module.split(".")[:2])


def test_the_graph_is_read():
    # Guards the parser itself: a test that reads no import would pass vacuously.
    assert len(MODULES) > 100 and "bert_trainer.layers.dropout" in MODULES
    assert "gin" in {edge.target for edge in EDGES["bert_trainer.configurables"]}
    deferred = [edge for edges in EDGES.values() for edge in edges if edge.deferred]
    assert any(edge.target.startswith("bert_trainer.") for edge in deferred)
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_name_the_rules_use_is_in_the_tree():
    # A rule about a module that no longer exists passes whatever the code does: a moved or
    # deleted module must be renamed or dropped here, so the rules keep guarding something.
    parts = [f"bert_trainer.{name}" for name in LIBRARY]
    stale = [name for name in (*FORBIDDEN_FOR_LIBRARY, *parts) if name not in MODULES]
    assert not stale, f"the rules name modules that are not in bert_trainer/: {stale}"
    assert {name for pair in SIBLINGS for name in pair} <= set(LIBRARY), SIBLINGS
    imported = {edge.target for edges in EDGES.values() for edge in edges}
    unused = [name for name in FORBIDDEN_THIRD_PARTY if name not in imported]
    assert not unused, f"no module of bert_trainer imports {unused}: the rule guards nothing"


def test_no_import_cycle_between_modules_at_import_time():
    cycles = _cycles(_graph(lambda m: m, deferred=False))
    assert not cycles, "import cycles:\n" + _describe(cycles, lambda m: m, deferred=False)


def test_no_import_cycle_between_modules_counting_function_level_imports():
    cycles = _cycles(_graph(lambda m: m, deferred=True))
    assert not cycles, "import cycles:\n" + _describe(cycles, lambda m: m, deferred=True)


def test_no_import_cycle_between_parts_of_the_package_at_import_time():
    # One level up: data, layers, training, model_dir, ... (a subpackage or a root module).
    cycles = _cycles(_graph(_part, deferred=False))
    assert not cycles, "import cycles between parts:\n" + _describe(cycles, _part, deferred=False)


def test_no_import_cycle_between_parts_of_the_package_counting_function_level_imports():
    graph = _graph(_part, deferred=True)
    cycles = _cycles(graph)
    assert not cycles, "import cycles between parts:\n" + _describe(cycles, _part, deferred=True)


@pytest.mark.parametrize("library", LIBRARY)
def test_the_layer_library_imports_nothing_above_it(library):
    above = tuple(f"bert_trainer.{name}" for name in LIBRARY[LIBRARY.index(library) + 1:]
                  if (library, name) not in SIBLINGS)
    siblings = tuple(f"bert_trainer.{b}" for a, b in SIBLINGS if a == library)
    forbidden = FORBIDDEN_FOR_LIBRARY + above + siblings
    bad = [edge for module, edges in EDGES.items()
           if _part(module) == f"bert_trainer.{library}"
           for edge in edges
           if edge.target in FORBIDDEN_THIRD_PARTY
           or any(edge.target == f or edge.target.startswith(f + ".") for f in forbidden)]
    assert not bad, f"bert_trainer.{library} imports what it must not:\n" + "\n".join(
        f"    {edge}" for edge in bad)


def test_only_the_command_line_imports_the_commands():
    # Runs are built by the library (bert_trainer/runs): no library module, benchmark or
    # script reaches into a command for them, and the commands stay thin.
    bad = [edge for module, edges in EDGES.items()
           if _part(module) not in ("bert_trainer.commands", "bert_trainer.cli")
           for edge in edges if _part(edge.target) == "bert_trainer.commands"]
    assert not bad, "\n".join(f"    {edge}" for edge in bad)
    scripts = [path for path in sorted((REPO / "scripts").rglob("*.py"))
               if "bert_trainer.commands" in path.read_text(encoding="utf-8")]
    assert not scripts, f"scripts that import a command module: {scripts}"
    assert {"bert_trainer.runs.finetuning", "bert_trainer.runs.pretraining"} <= set(MODULES)


def test_nothing_outside_the_demo_imports_it():
    # bert_trainer/demo holds what only `make demo` uses; the library must work without it.
    bad = [edge for module, edges in EDGES.items() if _part(module) != "bert_trainer.demo"
           for edge in edges if _part(edge.target) == "bert_trainer.demo"]
    assert not bad, "\n".join(f"    {edge}" for edge in bad)
    assert {"bert_trainer.demo.corpus", "bert_trainer.demo.task"} <= set(MODULES)


def _functions_reading_flags(source: str, module: str) -> list[str]:
    """"module:function" for each function of `source` but the top-level `main` that references
    the name `FLAGS` (the alias of `flags.FLAGS` a command module defines), in source order.

    A method is named "Class.method" and a nested function "outer.inner"; each answers for its
    own body only. `flags.FLAGS` spelled out (the dispatcher in commands/__init__.py parses the
    command line with it) is an attribute, not the name, and is not counted.
    """
    found = []

    def reads(function) -> bool:
        stack = list(ast.iter_child_nodes(function))
        while stack:
            node = stack.pop()
            if isinstance(node, ast.Name) and node.id == "FLAGS":
                return True
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                stack.extend(ast.iter_child_nodes(node))
        return False

    def visit(node, prefix: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if (not isinstance(child, ast.ClassDef) and name != "main"
                        and reads(child)):
                    found.append(f"{module}:{name}")
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def _command_modules() -> dict[str, str]:
    """{dotted name: source} of every module in bert_trainer/commands/ but FLAG_MACHINERY."""
    return {f"bert_trainer.commands.{path.stem}": path.read_text(encoding="utf-8")
            for path in sorted(COMMANDS.glob("*.py")) if path.name not in FLAG_MACHINERY}


def test_the_flag_rule_finds_a_read_below_main():
    # Guards the reader and the allow-list: a rule that finds nothing passes vacuously, and an
    # allow-listed module that no longer reads FLAGS should leave FLAG_MACHINERY.
    sample = (
        "def main(argv):\n"
        "    def inner():\n"
        "        return FLAGS.b\n"
        "    return FLAGS.a, inner\n"
        "class Settings:\n"
        "    @classmethod\n"
        "    def from_flags(cls, values=flags.FLAGS):\n"
        "        return cls(values.a)\n"
        "    def read(self):\n"
        "        return [name for name in FLAGS]\n"
        "def helper():\n"
        "    return FLAGS['d'].present\n")
    assert _functions_reading_flags(sample, "m") == ["m:main.inner", "m:Settings.read",
                                                     "m:helper"]
    for name in FLAG_MACHINERY:
        assert _functions_reading_flags((COMMANDS / name).read_text(encoding="utf-8"), name), (
            f"commands/{name} no longer reads FLAGS: drop it from FLAG_MACHINERY")
    assert len(_command_modules()) > 10 and "bert_trainer.commands.pretrain" in _command_modules()


def test_no_function_below_a_commands_main_reads_flags():
    # A flag is read once, in the command's `main` (into the run's settings where it has them,
    # e.g. finetune.settings_from_flags), and passed down as arguments.
    readers = [reader for module, source in _command_modules().items()
               for reader in _functions_reading_flags(source, module)]
    assert not readers, ("these functions read FLAGS below a command's main; read the flag in "
                         "main and pass its value down:\n"
                         + "\n".join(f"    {reader}" for reader in readers))


def _gin_queries(source: str) -> list[str]:
    """The names of gin's binding queries (`query_parameter`, `gin_is_bound`) `source` calls
    or imports, in source order."""
    queries = ("query_parameter", "gin_is_bound")
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in queries:
            found.append(node.attr)
        elif isinstance(node, ast.ImportFrom):
            found.extend(alias.name for alias in node.names if alias.name in queries)
    return found


def test_no_command_asks_gin_what_was_bound():
    # What the gin config set is the run builders' business (bert_trainer/runs): a command
    # reads its flags into settings, calls the library and prints.
    assert _gin_queries("import gin\nx = gin.query_parameter('A.b')\n") == ["query_parameter"]
    assert _gin_queries("from bert_trainer.runs.gin_config import gin_is_bound\n") == [
        "gin_is_bound"]
    bad = {module: found for module, source in _command_modules().items()
           if (found := _gin_queries(source))}
    assert not bad, f"command modules that query gin's bindings: {bad}"
