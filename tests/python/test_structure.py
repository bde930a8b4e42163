"""The package's structure, read from its source (AST only: no torch, no extension):

- no import cycle between python/pagestash's modules, counting every import, at module level or
  inside a function (`from . import x`, `from .x import y`, `import pagestash.x`);
- no module uses another module's private names. The rule: a name `_x` (not a dunder) belongs to
  the module that defines it: a module-level `_x`, a class attribute or method `_x`, or an
  attribute assigned as `obj._x = ...` anywhere in it. A module may not import another package
  module's `_x` (`from .m import _x`, `m._x`), and may touch `obj._x` (read, write, or through
  getattr/setattr/hasattr with a constant name) on anything but `self` or `cls` only when `_x` is
  its own and no other package module's. Private names that no package module defines (torch's:
  `counts._version`, `torch._dynamo`) are outside the rule; torch.distributed.pipelining's ones
  are touched in one class of pipelining.py (_TorchPrivate), which the third test holds.

Run as a script with a directory (`python3 tests/python/test_structure.py DIR`) to print what it
finds in another copy of the package (e.g. an older commit's)."""

from __future__ import annotations

import ast
import os
import sys
from typing import Dict, List, Set, Tuple

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "pagestash")
PACKAGE_NAME = "pagestash"


def _modules(package: str) -> Dict[str, ast.Module]:
    out = {}
    for name in sorted(os.listdir(package)):
        if name.endswith(".py"):
            with open(os.path.join(package, name)) as f:
                out[name[:-3]] = ast.parse(f.read(), filename=name)
    return out


def _constant_name(call: ast.Call):
    """getattr/setattr/hasattr(obj, "name")'s name when it is a constant string, else None."""
    if len(call.args) >= 2 and isinstance(call.args[1], ast.Constant) and isinstance(call.args[1].value, str):
        return call.args[1].value
    return None


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _imports(module: str, tree: ast.Module, names: Set[str]) -> List[Tuple[str, List[str], int]]:
    """(imported package module, the names taken from it, line) for every import in `tree`, anywhere."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0 and not (node.module or "").split(".")[0] == PACKAGE_NAME:
                continue
            parts = (node.module or "").split(".")
            target = parts[1] if node.level == 0 and len(parts) > 1 else (node.module if node.level else None)
            if not target:  # `from . import a, b`: each a submodule (_C, the extension, is none of the graph's)
                out += [(alias.name, [], node.lineno) for alias in node.names]
            else:
                out.append((target.split(".")[0], [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == PACKAGE_NAME:
                    out.append((parts[1] if len(parts) > 1 else "__init__", [], node.lineno))
    return [(m, taken, line) for m, taken, line in out if m in names and m != module]


def import_cycles(package: str = PACKAGE) -> List[List[str]]:
    """Every simple cycle of the import graph, each from its smallest module name."""
    trees = _modules(package)
    graph = {m: sorted({t for t, _, _ in _imports(m, tree, set(trees))}) for m, tree in trees.items()}
    cycles = set()

    def walk(start: str, node: str, path: List[str]) -> None:
        for nxt in graph[node]:
            if nxt == start:
                cycles.add(tuple(path))
            elif nxt > start and nxt not in path:
                walk(start, nxt, path + [nxt])

    for start in graph:
        walk(start, start, [start])
    return [list(c) for c in sorted(cycles)]


def _defined(tree: ast.Module) -> Set[str]:
    """The private names a module defines: module level, class level, and `obj._x = ...` anywhere."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(item.name)
                elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                    for target in (item.targets if isinstance(item, ast.Assign) else [item.target]):
                        names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            name = _constant_name(node)
            if name is not None:
                names.add(name)
    return {n for n in names if _private(n)}


def _attribute_uses(tree: ast.Module):
    """(receiver expression, attribute name, line) for every `obj.name` and getattr/setattr/hasattr(obj, "name")."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            yield node.value, node.attr, node.lineno
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            yield node.args[0], node.args[1].value, node.lineno


def private_reads(package: str = PACKAGE) -> List[str]:
    """Each use of another package module's private name, as 'module:line: what'."""
    trees = _modules(package)
    defined = {m: _defined(tree) for m, tree in trees.items()}
    owners: Dict[str, Set[str]] = {}
    for m, names in defined.items():
        for n in names:
            owners.setdefault(n, set()).add(m)
    found = set()
    for m, tree in trees.items():
        modules = {}  # local names bound to package modules: `from . import te as _te`
        for target, taken, line in _imports(m, tree, set(trees)):
            for name in taken:
                if _private(name) and target in defined and name in defined[target]:
                    found.add(f"{m}:{line}: imports {target}.{name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and not node.module:
                for alias in node.names:
                    if alias.name in trees:
                        modules[alias.asname or alias.name] = alias.name
        for receiver, attr, line in _attribute_uses(tree):
            if not _private(attr) or attr not in owners:
                continue  # public, or no package module's (torch's own)
            if isinstance(receiver, ast.Name) and receiver.id in modules:
                if attr in defined[modules[receiver.id]]:
                    found.add(f"{m}:{line}: {receiver.id}.{attr} (module {modules[receiver.id]}'s)")
                continue
            if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
                continue
            if owners[attr] != {m}:
                others = ", ".join(sorted(owners[attr] - {m}))
                found.add(f"{m}:{line}: {ast.unparse(receiver)}.{attr} ({others}'s)")
    return sorted(found, key=lambda s: (s.split(":")[0], int(s.split(":")[1])))


def torch_pipeline_privates(package: str = PACKAGE) -> List[str]:
    """Private names no package module defines, used in pipelining.py outside its _TorchPrivate class."""
    trees = _modules(package)
    if "pipelining" not in trees:
        return []
    ours = set().union(*(_defined(t) for t in trees.values()))
    tree = trees["pipelining"]
    allowed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "_TorchPrivate":
            allowed.update(id(n) for n in ast.walk(node))
    out = []
    for node in ast.walk(tree):
        if id(node) in allowed:
            continue
        if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in ours:
            out.append(f"pipelining:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            name = _constant_name(node)
            if name is not None and _private(name) and name not in ours:
                out.append(f"pipelining:{node.lineno}: getattr {name!r}")
    return out


def test_no_import_cycles():
    assert import_cycles() == []


def test_no_module_reads_another_modules_private_names():
    assert private_reads() == []


def test_torch_pipeline_privates_in_one_place():
    assert torch_pipeline_privates() == []


def test_the_checks_find_what_they_look_for(tmp_path):
    """A cycle through a function-level import, and a private read, in a made-up package, are found."""
    (tmp_path / "a.py").write_text("from .b import thing\n"
                                   "class A:\n    def __init__(self):\n        self._secret = 1\n")
    (tmp_path / "b.py").write_text("thing = 1\ndef f(a):\n    from .a import A\n    return a._secret\n")
    assert import_cycles(str(tmp_path)) == [["a", "b"]]
    assert private_reads(str(tmp_path)) == ["b:4: a._secret (a's)"]


if __name__ == "__main__":
    where = sys.argv[1] if len(sys.argv) > 1 else PACKAGE
    cycles, reads, torch_reads = import_cycles(where), private_reads(where), torch_pipeline_privates(where)
    print(f"{len(cycles)} import cycles:")
    for c in cycles:
        print("  " + " -> ".join(c + [c[0]]))
    print(f"{len(reads)} uses of another module's private name:")
    for r in reads:
        print("  " + r)
    print(f"{len(torch_reads)} torch pipeline private names outside _TorchPrivate:")
    for r in torch_reads:
        print("  " + r)
