"""The package's layering (docs/design.md, "Map"), checked from the source without importing it.

Every module of ``ort_torch_compat`` is parsed with ``ast``; every import in it (absolute or
relative, at the top or deferred inside a function, under ``TYPE_CHECKING`` too) is an edge
from the module's *unit* (its top-level module or subpackage: ``engine``, ``capi_session``...)
to the imported unit.  The unit graph has no cycle, no unit imports a unit of a higher layer
(``LAYERS``), and no two modules with the same file name define the same public name.
"""

from __future__ import annotations

import ast
import collections
import pathlib
from typing import Dict, Iterator, List, Set, Tuple

PACKAGE = "ort_torch_compat"
PACKAGE_DIR = pathlib.Path(__file__).resolve().parents[1] / PACKAGE

#: Highest first.  A unit may import units of its own layer (the cycle check keeps those one
#: way) and of lower layers, never of a higher one.
LAYERS: List[Tuple[str, Set[str]]] = [
    ("shared test and benchmark code", {"testing"}),
    (
        "surfaces",
        {
            "__init__",
            "__main__",
            "api",
            "capi_session",
            "session",
            "legacy",
            "cli",
            "switch",
            "migrate",
            "federated",
            "values",
        },
    ),
    ("engine", {"engine"}),
    (
        "conversion, codec, kernels, artifact building",
        {"graph", "codec", "optim", "ortformat", "artifacts", "onnxblock", "gradient"},
    ),
    ("shared base", {"errors", "atomic_files"}),
]
LAYER_OF: Dict[str, int] = {unit: len(LAYERS) - rank for rank, (_, units) in enumerate(LAYERS) for unit in units}


def _modules() -> Dict[str, pathlib.Path]:
    """Dotted module name -> file, for every module of the package."""
    found = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _unit(module: str) -> str:
    """``ort_torch_compat.engine.state`` -> ``engine``; the package itself -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(module: str, tree: ast.AST) -> Iterator[Tuple[str, int]]:
    """(imported module of this package, line) for every import in `tree`, wherever it is.

    ``from P import name`` imports the module ``P.name`` where that is a module, else ``P``."""
    is_package = MODULES[module].name == "__init__.py"
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                yield (submodule if submodule in MODULES else base), node.lineno


def unit_edges() -> Dict[Tuple[str, str], List[str]]:
    """(importing unit, imported unit) -> where ("module:line"), between different units only."""
    edges: Dict[Tuple[str, str], List[str]] = collections.defaultdict(list)
    for module, path in MODULES.items():
        for target, line in imports_of(module, ast.parse(path.read_text(), str(path))):
            if target.split(".")[0] != PACKAGE:
                continue
            source_unit, target_unit = _unit(module), _unit(target)
            if source_unit != target_unit:
                edges[(source_unit, target_unit)].append(f"{module}:{line}")
    return edges


def _cycles(edges) -> List[List[str]]:
    """One cycle through each strongly connected component of more than one unit."""
    graph: Dict[str, Set[str]] = collections.defaultdict(set)
    for source, target in edges:
        graph[source].add(target)
    cycles, done = [], set()
    for start in sorted(graph):
        if start in done:
            continue
        stack, on_path = [(start, iter(sorted(graph[start])))], [start]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                on_path.pop()
                done.add(node)
            elif child in on_path:
                cycles.append(on_path[on_path.index(child) :] + [child])
            elif child not in done:
                stack.append((child, iter(sorted(graph[child]))))
                on_path.append(child)
    return cycles


def test_every_unit_has_a_layer():
    units = {_unit(module) for module in MODULES}
    assert sorted(units - set(LAYER_OF)) == [], "put the new module or subpackage in LAYERS (and docs/design.md)"
    assert sorted(set(LAYER_OF) - units) == [], "LAYERS names a unit that does not exist"


def test_no_import_cycle_between_units():
    edges = unit_edges()
    assert [
        " -> ".join(cycle) + "  (" + ", ".join(edges[(cycle[0], cycle[1])][:2]) + ")" for cycle in _cycles(edges)
    ] == []


def test_no_upward_import():
    upward = [
        f"{source} ({LAYERS[len(LAYERS) - LAYER_OF[source]][0]}) imports {target} "
        f"({LAYERS[len(LAYERS) - LAYER_OF[target]][0]}) at {', '.join(where)}"
        for (source, target), where in sorted(unit_edges().items())
        if source in LAYER_OF and target in LAYER_OF and LAYER_OF[source] < LAYER_OF[target]
    ]
    assert upward == []


def test_testing_is_imported_by_nothing_in_the_package_and_imports_no_pytest():
    assert [pair for pair in unit_edges() if pair[1] == "testing"] == []
    pytest_users = [
        module
        for module, path in MODULES.items()
        if _unit(module) == "testing"
        for target, _ in imports_of(module, ast.parse(path.read_text()))
        if target.split(".")[0] in ("pytest", "_pytest")
    ]
    assert pytest_users == []  # the scripts import ort_torch_compat.testing without pytest installed


def _defined_names(tree: ast.Module) -> Set[str]:
    """Public names a module defines at its top level (re-exports by import do not count)."""
    names: Set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return {name for name in names if not name.startswith("_")}


def test_no_two_same_named_modules_define_the_same_public_name():
    by_file_name: Dict[str, List[str]] = collections.defaultdict(list)
    for module, path in MODULES.items():
        if path.name != "__init__.py":
            by_file_name[path.name].append(module)
    clashes = []
    for file_name, modules in sorted(by_file_name.items()):
        owners: Dict[str, List[str]] = collections.defaultdict(list)
        for module in modules:
            for name in _defined_names(ast.parse(MODULES[module].read_text())):
                owners[name].append(module)
        clashes += [f"{name}: {', '.join(where)}" for name, where in sorted(owners.items()) if len(where) > 1]
    assert clashes == []


def test_the_checks_see_deferred_relative_imports():
    """The checks are not vacuous: a deferred upward import is an edge they would report."""
    tree = ast.parse("def f():\n    from ..api import Module\n")
    assert list(imports_of(f"{PACKAGE}.engine.state", tree)) == [(f"{PACKAGE}.api", 2)]
    assert LAYER_OF["engine"] < LAYER_OF["api"]
    assert _cycles({("a", "b"): [], ("b", "c"): [], ("c", "a"): []}) == [["a", "b", "c", "a"]]
