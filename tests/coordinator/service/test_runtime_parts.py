"""The runtime's parts stay composed: no part subclasses another, and none imports a part above it."""

from __future__ import annotations

import ast
from pathlib import Path

import rollmux.coordinator.service.runtime as runtime_pkg

PACKAGE = "rollmux.coordinator.service.runtime"
VOCABULARY = ["api", "states", "records"]
"""The service's states, config, errors and stored records: what the parts share, beneath them all."""
LAYERS = [*VOCABULARY, "state", "nodes", "learning", "grants", "leases", "migration", "directives", "admission",
          "relocation", "stored", "facade", "views", "__init__"]
"""Bottom to top: a module may import only modules before it."""


def _modules() -> dict[str, ast.Module]:
    folder = Path(runtime_pkg.__file__).parent
    return {p.stem: ast.parse(p.read_text()) for p in sorted(folder.glob("*.py"))}


def _imported_parts(tree: ast.Module) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module is not None and node.module.startswith(PACKAGE):
            rest = node.module[len(PACKAGE):].lstrip(".")
            out |= {rest} if rest else {alias.name for alias in node.names}
    return out


def test_every_module_has_a_layer() -> None:
    assert sorted(_modules()) == sorted(LAYERS)


def test_no_part_imports_a_part_above_it() -> None:
    upward = {(name, imported) for name, tree in _modules().items() for imported in _imported_parts(tree)
              if imported in LAYERS and LAYERS.index(imported) >= LAYERS.index(name)}
    assert not upward, f"modules importing a layer at or above their own: {sorted(upward)}"


def test_no_part_subclasses_another() -> None:
    modules = {name: tree for name, tree in _modules().items() if name not in VOCABULARY}  # errors may subclass
    defined = {n.name for tree in modules.values() for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    inherited = {(cls.name, base.id) for tree in modules.values() for cls in ast.walk(tree)
                 if isinstance(cls, ast.ClassDef) for base in cls.bases
                 if isinstance(base, ast.Name) and base.id in defined}
    assert not inherited, f"runtime classes built by inheritance, not composition: {sorted(inherited)}"
