"""The layers of DESIGN.md ("Layers") hold: nothing imports upward, and the parts do not import in a circle.

Floors, from the ground up: the model (`rollmux.core.model`, `rollmux.core.errors`) with the pure policy on it
(the policy imports the model, never the reverse, and never a protobuf message) -> the wire (protobuf stubs,
the converter, the clients of both protocols) -> the coordinator service, the simulator, the node sidecar
(daemon) and the in-trainer shim (library), the sync plugin (side by side: none imports another) -> the
adapters -> the demo, the testing helpers (chaos harness) and the command line. Imports are read with `ast`
from the folders `pyproject.toml` maps into the ``rollmux`` namespace, function-level imports included.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]

# (floor, the parts on it); a part is a module prefix, the longest matching prefix decides
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("model and policy", ("rollmux.core", "rollmux.coordinator.policy", "rollmux.coordinator.__init__")),
    ("wire", ("rollmux.proto", "rollmux.wire")),
    ("service, simulator, sidecar, shim", ("rollmux.coordinator.service", "rollmux.coordinator.sim",
                                           "rollmux.coordinator.place_cli", "rollmux.coordinator.placement_run",
                                           "rollmux.sidecar", "rollmux.shim", "rollmux.sync_plugin",
                                           "rollmux.__init__", "rollmux.k8s")),
    ("adapters", ("rollmux.adapters",)),
    ("demo, testing, command line", ("rollmux.demo", "rollmux.testing", "rollmux.cli", "rollmux.__main__")),
)

MODEL = ("rollmux.core",)
"""The model: the policy stands on it beside, so the model imports nothing outside itself."""

PARTS: dict[str, str] = {  # module prefix -> the part it belongs to (side-by-side parts never import each other)
    "rollmux.coordinator.sim": "simulator",
    "rollmux.coordinator.service": "coordinator service",
    "rollmux.coordinator.place_cli": "placement command",
    "rollmux.coordinator.placement_run": "placement command",
    "rollmux.sidecar": "sidecar",
    "rollmux.shim": "shim",
    "rollmux.__init__": "shim",  # the public API re-exports the shim's
    "rollmux.sync_plugin": "sync plugin",
    "rollmux.k8s": "kubernetes scheduler",
}


@dataclass(frozen=True, slots=True)
class Import:
    importer: str  # module name
    path: Path  # its file
    imported: str  # the module it imports (resolved to a module of the tree)
    type_only: bool  # under `if TYPE_CHECKING:` (never executed)


def modules() -> dict[str, Path]:
    """Module name -> file, through the package-dir mapping (``rollmux.coordinator`` is ``coordinator/``).
    A package's own module is named ``<package>.__init__`` so that its floor can differ from its children's."""
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found: dict[str, Path] = {}
    for prefix, folder in sorted(package_dir.items(), key=lambda kv: len(kv[0])):
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            found[".".join((prefix, *parts))] = path  # deeper mappings (sub-folders) win
    return found


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    while name:
        if name in mods:
            return name
        if f"{name}.__init__" in mods:
            return f"{name}.__init__"
        name = name.rpartition(".")[0]
    return None


def imports(mods: dict[str, Path]) -> Iterator[Import]:
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        type_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                     and "TYPE_CHECKING" in ast.unparse(node.test) for stmt in node.body for n in ast.walk(stmt)}
        package = name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from pkg import sub` imports the module `sub` where there is one, else names of `pkg`
                targets = [f"{base}.{a.name}" if _resolve(f"{base}.{a.name}", mods) == f"{base}.{a.name}"
                           or f"{base}.{a.name}.__init__" in mods else base for a in node.names]
            else:
                continue
            for target in dict.fromkeys(targets):
                if target == "rollmux" or target.startswith("rollmux."):
                    imported = _resolve(target, mods)
                    if imported is not None and imported != name:
                        yield Import(name, path, imported, id(node) in type_only)


def _longest(name: str, prefixes: list[str]) -> str | None:
    hits = [p for p in prefixes if name == p or name.startswith(p + ".")]
    return max(hits, key=len, default=None)


def floor_of(name: str) -> int:
    prefix = _longest(name, [p for _, parts in FLOORS for p in parts])
    assert prefix is not None, f"module {name} is on no floor: add it to FLOORS in tests/test_layers.py"
    return next(i for i, (_, parts) in enumerate(FLOORS) if prefix in parts)


def part_of(name: str) -> str:
    """The unit the circle check runs over: a side-by-side part, else the module's top-level package."""
    prefix = _longest(name, list(PARTS))
    if prefix is not None:
        return PARTS[prefix]
    pieces = name.split(".")
    return ".".join(pieces[:3]) if pieces[1] in ("coordinator", "adapters") else ".".join(pieces[:2])


def test_every_module_is_on_a_floor() -> None:
    mods = modules()
    assert "rollmux.wire.client" in mods and "rollmux.coordinator.service.servicer" in mods  # the mapping was read
    for name in mods:
        floor_of(name)


def test_no_module_imports_a_higher_floor() -> None:
    mods = modules()
    upward = []
    for imp in imports(mods):
        low, high = floor_of(imp.importer), floor_of(imp.imported)
        if high > low:
            upward.append(f"{imp.path.relative_to(ROOT)} imports {imp.imported}: floor '{FLOORS[low][0]}' "
                          f"imports floor '{FLOORS[high][0]}' above it")
    assert not upward, "\n".join(upward)


def test_side_by_side_parts_do_not_import_each_other() -> None:
    crossing = []
    for imp in imports(modules()):
        a, b = part_of(imp.importer), part_of(imp.imported)
        if a != b and floor_of(imp.importer) == floor_of(imp.imported) and {a, b} <= set(PARTS.values()):
            crossing.append(f"{imp.path.relative_to(ROOT)} imports {imp.imported}: part '{a}' imports part '{b}' "
                            f"on the same floor '{FLOORS[floor_of(imp.importer)][0]}'")
    assert not crossing, "\n".join(crossing)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def folder_of(name: str) -> str:
    """The folder (package) a module sits in: ``rollmux.coordinator.policy.baselines`` for its modules."""
    return name.removesuffix(".__init__") if name.endswith(".__init__") else name.rpartition(".")[0]


def _circles(unit_of: Callable[[str], str]) -> list[str]:
    """Import circles between the units `unit_of` maps modules to, each with the imports that close it."""
    edges: dict[str, set[str]] = defaultdict(set)
    why: dict[tuple[str, str], str] = {}
    for imp in imports(modules()):
        if imp.type_only:
            continue  # never executed
        a, b = unit_of(imp.importer), unit_of(imp.imported)
        edges[a]
        edges[b]
        if a != b:
            edges[a].add(b)
            why.setdefault((a, b), f"{imp.path.relative_to(ROOT)} imports {imp.imported}")
    return [f"{' <-> '.join(c)}: " + "; ".join(why[(a, b)] for a in c for b in c if (a, b) in why)
            for c in _cycles(edges)]


def test_no_import_circle_between_packages() -> None:
    circles = _circles(part_of)
    assert not circles, "\n".join(circles)


def test_no_import_circle_between_folders() -> None:
    """Finer than the packages: no folder imports one that imports it back (a reader can take the folders
    in order, as the project's drawing shows them)."""
    circles = _circles(folder_of)
    assert not circles, "\n".join(circles)


def test_the_layering_check_finds_an_upward_import(tmp_path: Path) -> None:
    """The checks above can fail: an upward import in a module is reported with both floors."""
    mods = {"rollmux.wire.fake": tmp_path / "fake.py", "rollmux.sidecar.agent": tmp_path / "agent.py"}
    (tmp_path / "fake.py").write_text("def f():\n    from rollmux.sidecar.agent import NodeAgent\n")
    (tmp_path / "agent.py").write_text("")
    (imp,) = imports(mods)
    assert (imp.importer, imp.imported) == ("rollmux.wire.fake", "rollmux.sidecar.agent")
    assert (FLOORS[floor_of(imp.importer)][0], FLOORS[floor_of(imp.imported)][0]) == \
        ("wire", "service, simulator, sidecar, shim")


def test_the_model_imports_nothing_outside_itself() -> None:
    outside = [f"{imp.path.relative_to(ROOT)} imports {imp.imported}: the model imports nothing outside itself"
               for imp in imports(modules()) if _longest(imp.importer, list(MODEL))
               and not _longest(imp.imported, list(MODEL))]
    assert not outside, "\n".join(outside)


def test_the_policy_importing_the_wire_is_reported(tmp_path: Path) -> None:
    """The policy never sees a protobuf message: a policy module importing the wire or the stubs is an
    upward import."""
    mods = {"rollmux.coordinator.policy.fake": tmp_path / "fake.py", "rollmux.proto.rollmux_v1_pb2": tmp_path / "pb.py",
            "rollmux.wire.convert": tmp_path / "convert.py"}
    (tmp_path / "fake.py").write_text("from rollmux.proto import rollmux_v1_pb2\nfrom rollmux.wire import convert\n")
    (tmp_path / "pb.py").write_text("")
    (tmp_path / "convert.py").write_text("")
    found = sorted((imp.imported, FLOORS[floor_of(imp.importer)][0], FLOORS[floor_of(imp.imported)][0])
                   for imp in imports(mods) if floor_of(imp.imported) > floor_of(imp.importer))
    assert found == [("rollmux.proto.rollmux_v1_pb2", "model and policy", "wire"),
                     ("rollmux.wire.convert", "model and policy", "wire")]


def test_the_shim_importing_the_sidecar_is_reported(tmp_path: Path) -> None:
    """The shim runs in the trainer, the sidecar is the node's daemon: neither imports the other."""
    mods = {"rollmux.shim.fake": tmp_path / "fake.py", "rollmux.sidecar.agent": tmp_path / "agent.py"}
    (tmp_path / "fake.py").write_text("from rollmux.sidecar.agent import NodeAgent\n")
    (tmp_path / "agent.py").write_text("")
    (imp,) = imports(mods)
    assert (part_of(imp.importer), part_of(imp.imported), floor_of(imp.importer) == floor_of(imp.imported)) == \
        ("shim", "sidecar", True)


SIDECAR_STUBS = "rollmux.proto.sidecar_v1_pb2"
MESSAGE_OWNERS = ("rollmux.wire", "rollmux.proto")
"""Where sidecar messages may be built: the converter, the typed client and the stubs themselves."""


def built_sidecar_messages(mods: dict[str, Path], root: Path = ROOT) -> Iterator[str]:
    """`path:line builds spb.Name(...)` for every sidecar message a module outside MESSAGE_OWNERS constructs
    (a call of an upper-case name of the sidecar stubs, through whatever alias the module imported them as)."""
    for name, path in mods.items():
        text = path.read_text()
        if _longest(name, list(MESSAGE_OWNERS)) or SIDECAR_STUBS.rpartition(".")[2] not in text:
            continue
        tree = ast.parse(text, str(path))
        aliases = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                aliases |= {a.asname for a in node.names if a.name == SIDECAR_STUBS and a.asname}
            elif isinstance(node, ast.ImportFrom) and node.module == "rollmux.proto":
                aliases |= {a.asname or a.name for a in node.names if a.name == SIDECAR_STUBS.rpartition(".")[2]}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in aliases
                    and node.func.attr[:1].isupper()):
                yield f"{path.relative_to(root)}:{node.lineno} builds {node.func.value.id}.{node.func.attr}(...)"


def test_only_the_wire_builds_sidecar_messages() -> None:
    """DESIGN.md: the converter and the typed clients are the only code touching messages; the sidecar's
    server answers through the converter, the shim asks through the client."""
    built = list(built_sidecar_messages(modules()))
    assert not built, "\n".join(built)


def test_a_hand_built_sidecar_response_is_reported(tmp_path: Path) -> None:
    """The check above can fail: a sidecar module that builds its own response is named with the line."""
    (tmp_path / "fake.py").write_text("from rollmux.proto import sidecar_v1_pb2 as spb\n\n\n"
                                      "def answer():\n    return spb.DetachResponse()\n")
    (tmp_path / "convert.py").write_text("from rollmux.proto import sidecar_v1_pb2 as spb\n"
                                         "x = spb.DetachResponse()\n")
    mods = {"rollmux.sidecar.fake": tmp_path / "fake.py", "rollmux.wire.convert": tmp_path / "convert.py"}
    assert list(built_sidecar_messages(mods, tmp_path)) == ["fake.py:5 builds spb.DetachResponse(...)"]


def test_every_package_folder_ships_in_the_wheel() -> None:
    """pyproject lists packages by hand (the folders map into ``rollmux.*``): a folder missing from the list
    imports in the checkout but not from an installed wheel."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    folders = {name.removesuffix(".__init__") for name in modules() if name.endswith(".__init__")}
    assert folders - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
