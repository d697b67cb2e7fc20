"""The documentation stays true to the tree: the generated reference is current; every relative link, every
repository path, every CLI subcommand and flag, environment variable, metric and Helm value the pages name
exists; the README's `rollmux place` example prints what the README shows; no page or code comment names a
commit, an issue or a work session; the license is declared the same everywhere; and the pages stay
readable (README under 200 lines, no page over ~25 KB)."""

from __future__ import annotations

import difflib
import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
REGENERATE = ".venv/bin/python scripts/gen_reference.py"
MAX_PAGE_BYTES = 25 * 1024
MAX_README_LINES = 200


def _pages() -> list[Path]:
    """Every Markdown page a user reads, plus the chart's install notes."""
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "charts" / "rollmux" / "README.md",
             ROOT / "charts" / "rollmux" / "templates" / "NOTES.txt"]
    for folder in ("docs", "benchmarks/results", "examples"):
        pages += sorted((ROOT / folder).rglob("*.md"))
    return pages


def _ids(pages: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in pages]


def _without_code_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", _without_code_fences(page.read_text()), re.M)}


def test_reference_is_generated_from_the_current_code(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLMUX_")}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_reference.py"), "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"scripts/gen_reference.py failed:\n{proc.stderr[-3000:]}"
    checked_in = {p.name: p.read_text() for p in (ROOT / "docs" / "reference").glob("*.md")}
    fresh = {p.name: p.read_text() for p in tmp_path.glob("*.md")}
    stale = sorted(n for n in checked_in.keys() | fresh.keys() if checked_in.get(n) != fresh.get(n))
    diff = "".join(line for n in stale[:3] for line in list(difflib.unified_diff(
        checked_in.get(n, "").splitlines(True), fresh.get(n, "").splitlines(True), f"docs/reference/{n}",
        f"generated/{n}", n=0))[:40])
    assert not stale, (f"docs/reference/ is stale ({', '.join(stale)}): run `{REGENERATE}` from the repository "
                       f"root and commit docs/reference/.\n{diff}")


@pytest.mark.parametrize("page", _pages(), ids=_ids(_pages()))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _without_code_fences(page.read_text())):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def _top_level() -> set[str]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return {n.split("/", 1)[0] for n in names if "/" in n}


PATH = re.compile(r"(?<![\w/.$-])((?:[\w.-]+/)+[\w.*{}<>-]*)")


@pytest.mark.parametrize("page", _pages(), ids=_ids(_pages()))
def test_repository_paths_named_exist(page: Path) -> None:
    """A path whose first folder is one of this repository's (docs/, charts/, coordinator/, ...) must exist,
    from the repository root or from the page's folder; other paths (a framework's modules, output
    folders, absolute paths, ``$ROLL/examples/...``) are not ours to check."""
    tops = _top_level()
    missing = []
    for raw in PATH.findall(page.read_text()):
        path = raw.rstrip(".,:;")
        if path.split("/", 1)[0] not in tops or re.search(r"[{}<>]", path):
            continue  # not a path of this repository, or a template (REGISTRY/..., {node})
        if not any(any(base.glob(path)) if "*" in path else (base / path).exists() for base in (ROOT, page.parent)):
            missing.append(path)
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {sorted(set(missing))}"


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines < MAX_README_LINES, f"README.md has {lines} lines; keep it under {MAX_README_LINES} (move detail to docs/)"


@pytest.mark.parametrize("page", _pages(), ids=_ids(_pages()))
def test_pages_are_small(page: Path) -> None:
    size = page.stat().st_size
    assert size <= MAX_PAGE_BYTES, f"{page.relative_to(ROOT)} is {size} bytes; split it (at most {MAX_PAGE_BYTES})"


# ------------------------------------------------------------------------------- names the pages use
@functools.cache
def _gen() -> object:
    """scripts/gen_reference.py as a module: its discovery of parsers and metric registries."""
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _named_pages() -> list[Path]:
    """Pages whose names are checked: every page a user reads except the generated reference itself."""
    return [p for p in _pages() if "reference" not in p.relative_to(ROOT).parts[:2]]


def _code(text: str) -> list[str]:
    """Command lines: each line of a code fence (continuations joined) and each inline code span."""
    lines = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S):
        lines += block.replace("\\\n", " ").splitlines()
    lines += re.findall(r"`([^`\n]+)`", _without_code_fences(text))
    return lines


def _commands(line: str) -> list[list[str]]:
    """The `rollmux ...` invocations in one command line, as token lists starting after `rollmux`."""
    out = []
    for part in re.split(r"&&|\|\||;|\||(?<!\S)#", line):
        tokens = part.split()
        while tokens and (re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0]) or tokens[0] in ("$", "sudo", "exec")):
            tokens = tokens[1:]
        if tokens and (tokens[0] == "rollmux" or tokens[0].endswith("/bin/rollmux")):
            out.append(tokens[1:])
    return out


@functools.cache
def _cli() -> dict[str, set[str]]:
    """Subcommand -> its option strings (and the root's under "")."""
    import argparse

    gen = _gen()
    root = gen.entry_parsers()["rollmux"]  # type: ignore[attr-defined]
    subs = gen._subcommands(root)  # type: ignore[attr-defined]
    flags = {"": {s for a in root._actions for s in a.option_strings}}
    for name, parser in subs.items():
        flags[name] = {s for a in parser._actions for s in a.option_strings
                       if not isinstance(a, argparse._SubParsersAction)}
    return flags


@pytest.mark.parametrize("page", _named_pages(), ids=_ids(_named_pages()))
def test_cli_subcommands_and_flags_named_exist(page: Path) -> None:
    cli, wrong = _cli(), []
    for line in _code(page.read_text()):
        for tokens in _commands(line):
            if not tokens or not re.fullmatch(r"[a-z][a-z-]*", tokens[0]):
                continue  # `rollmux --help`, `rollmux COMMAND`
            sub = tokens[0]
            if sub not in cli:
                wrong.append(f"rollmux {sub}: no such subcommand")
                continue
            for tok in tokens[1:]:
                flag = tok.split("=", 1)[0].rstrip(",.)`'\"")
                if re.fullmatch(r"--?[a-z][\w-]*", flag) and flag not in cli[sub] | cli[""]:
                    wrong.append(f"rollmux {sub} {flag}: no such flag")
    assert not wrong, f"{page.relative_to(ROOT)}: " + "; ".join(sorted(set(wrong)))


@functools.cache
def _metric_names() -> frozenset[str]:
    gen, names = _gen(), set()
    for module_name, path in gen.modules():  # type: ignore[attr-defined]
        if path.stem == "metrics" and "prometheus_client" in path.read_text():
            for registry in gen._registries(importlib.import_module(module_name)):  # type: ignore[attr-defined]
                for family in registry.collect():
                    names |= {family.name, *(s.name for s in family.samples)}
                    if family.type == "counter":
                        names.add(family.name + "_total")
    return frozenset(names)


@pytest.mark.parametrize("page", _named_pages(), ids=_ids(_named_pages()))
def test_metrics_named_exist(page: Path) -> None:
    known = _metric_names()
    named = {m for m in re.findall(r"\brollmux_[a-z0-9_]+\b(?![./\w-])", page.read_text())}
    named = {m for m in named if not m.startswith(("rollmux_v1", "rollmux_verl"))}  # the proto, a harness file
    assert named <= known, f"{page.relative_to(ROOT)} names metrics no registry has: {sorted(named - known)}"


@functools.cache
def _env_names() -> frozenset[str]:
    """Every ROLLMUX_* variable some source, script or chart file reads or sets (docs excluded)."""
    files = subprocess.run(["git", "ls-files", "*.py", "*.sh", "*.yaml", "*.tpl", "*.txt", "Dockerfile"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    names: set[str] = set()
    for f in files:
        names |= set(re.findall(r"\bROLLMUX_[A-Z0-9_]+\b", (ROOT / f).read_text(errors="replace")))
    return frozenset(names)


@pytest.mark.parametrize("page", _named_pages(), ids=_ids(_named_pages()))
def test_environment_variables_named_exist(page: Path) -> None:
    named = set(re.findall(r"\bROLLMUX_[A-Z0-9_]*[A-Z0-9]\b", page.read_text()))
    assert named <= _env_names(), f"{page.relative_to(ROOT)} names variables nothing reads: {sorted(named - _env_names())}"


@functools.cache
def _helm_schema() -> dict[str, object]:
    return json.loads((ROOT / "charts" / "rollmux" / "values.schema.json").read_text())


def _helm_value_exists(path: str) -> bool:
    """Whether `a.b.c` is a value of the chart: a path through the schema's properties (a map value's keys
    are free; a placeholder such as `<pool>` stands for any property)."""
    schema = _helm_schema()
    defs = schema.get("definitions", {})  # type: ignore[union-attr]

    def walk(node: dict, keys: list[str]) -> bool:  # type: ignore[type-arg]
        while "$ref" in node and "properties" not in node:
            node = defs[node["$ref"].rsplit("/", 1)[1]]  # type: ignore[index]
        if not keys:
            return True
        key, rest, props = keys[0], keys[1:], node.get("properties") or {}
        if key in props:
            return walk(props[key], rest)
        if key.startswith("<") and props:
            return any(walk(sub, rest) for sub in props.values())
        extra = node.get("additionalProperties")
        return isinstance(extra, dict) and walk(extra, rest) or extra is True

    return walk(schema, path.split("."))  # type: ignore[arg-type]


@pytest.mark.parametrize("page", _named_pages(), ids=_ids(_named_pages()))
def test_helm_values_named_exist(page: Path) -> None:
    """A dotted name whose first part is a top-level chart value (`scheduler.enabled`, `--set redis.enabled=false`)
    must be a value of the chart."""
    tops = set(_helm_schema()["properties"])  # type: ignore[arg-type]
    text = page.read_text()
    named = set(re.findall(r"--set(?:-string|-json)?[ =]['\"]?([A-Za-z][\w.<>-]*)=", text))
    named |= {c for c in re.findall(r"`([A-Za-z][\w<>-]*(?:\.[\w<>-]+)+)`", text)}
    named = {n for n in named if n.split(".")[0] in tops and not re.search(r"\.(ya?ml|json|md|py|sh|txt)$", n)}
    missing = sorted(n for n in named if not _helm_value_exists(n))
    assert not missing, f"{page.relative_to(ROOT)} names Helm values the chart does not have: {missing}"


# ------------------------------------------------------------------------------ the README's example
PLACE_EXAMPLES = ("README.md", "docs/how-to/plan-capacity.md")


def _place_example(page: str) -> list[str]:
    """The lines of the text block that follows the page's plain `rollmux place` command."""
    text = (ROOT / page).read_text()
    m = re.search(r"^rollmux place\s+#[^\n]*\n.*?^```\n+(?:[^`]*\n)?```text\n(.*?)^```", text, flags=re.M | re.S)
    assert m, f"{page}: no `rollmux place` example followed by a ```text block of its output"
    return [line.rstrip() for line in m.group(1).splitlines() if line.strip()]


@functools.cache
def _place_output() -> tuple[str, ...]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ROLLMUX_")}, "COLUMNS": "400"}
    proc = subprocess.run([sys.executable, "-m", "rollmux", "place"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return tuple(line.rstrip() for line in proc.stdout.splitlines())


@pytest.mark.parametrize("page", PLACE_EXAMPLES)
def test_the_place_example_prints_what_the_page_shows(page: str) -> None:
    """Every line the page shows (but `...`) is a line `rollmux place` prints now, the summary included."""
    printed, shown = _place_output(), _place_example(page)
    missing = [line for line in shown if line != "..." and line not in printed]
    summary = [line for line in printed if line.startswith("RollMux $")]
    assert not missing, f"{page}: its `rollmux place` output differs from what it prints now:\n" + "\n".join(
        f"  shown:   {line}" for line in missing) + "\n  printed: " + "\n  printed: ".join(summary)
    assert shown[-1].startswith("RollMux $") and shown[-1] in printed, f"{page} must show the summary line"


# --------------------------------------------------------------------------------- no history words
HISTORY = re.compile(r"\b(?:issue|PR|pull request) ?#?\d+\b|#\d{2,}\b|\b(?:first|second|third|fourth|fifth|sixth|"
                     r"earlier|previous|last|next) (?:session|round)s?\b|\bround of\b|\bcommit [0-9a-f]{7,40}\b",
                     re.I)
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}\b")
UPSTREAM_COMMITS = {"8eb27cc2"}  # ROLL's supported commit (an upstream project's, not ours)


def _comments(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring line of a Python file, and every comment of another file."""
    lines = path.read_text(errors="replace").splitlines()
    if path.suffix != ".py":
        return [(i, ln) for i, ln in enumerate(lines, 1) if re.match(r"\s*(#|//)", ln)]
    import ast
    import io
    import tokenize

    out = []
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and \
                (doc := ast.get_docstring(node, clean=False)):
            first = node.body[0].lineno
            out += [(first + i, ln) for i, ln in enumerate(doc.splitlines())]
    return out


def _history_hits(text: str, *, commits: bool) -> list[str]:
    hits = HISTORY.findall(text)
    if commits:
        hits += [c for c in COMMIT.findall(text) if c not in UPSTREAM_COMMITS]
    return hits


@pytest.mark.parametrize("page", _named_pages(), ids=_ids(_named_pages()))
def test_pages_name_no_issue_session_or_commit(page: Path) -> None:
    """Pages describe the product as it is. Benchmark result pages may name the commit that measured them."""
    text = re.sub(r"https?://\S+", "", page.read_text())
    if "benchmarks" in page.relative_to(ROOT).parts:  # its one provenance line may name the measuring commit
        text = re.sub(r"^(Measured at (?:the tree of )?|Commit: )commit [0-9a-f]{7,40}\b|^Commit: [0-9a-f]{7,40}\b",
                      "", text, count=1, flags=re.M)
    hits = _history_hits(text, commits=True)
    assert not hits, f"{page.relative_to(ROOT)} names history (move it to git): {sorted(set(hits))}"


def test_code_comments_name_no_issue_session_or_commit() -> None:
    files = subprocess.run(["git", "ls-files", "*.py", "*.sh", "*.proto", "*.yaml", "Dockerfile"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for f in files:
        path = ROOT / f
        if not path.exists() or f.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        if not _history_hits(path.read_text(errors="replace"), commits=True):
            continue  # nothing anywhere in the file: no need to find its comments
        for line, text in _comments(path):
            hits += [f"{f}:{line}: {h}" for h in _history_hits(text, commits=True)]
    assert not hits, "comments name history (say why instead, or move it to git):\n" + "\n".join(hits[:30])


# --------------------------------------------------------------------------------------- the license
def test_the_license_is_declared_the_same_everywhere() -> None:
    import tomllib

    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text  # the full text, not a pointer
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    chart = yaml.safe_load((ROOT / "charts" / "rollmux" / "Chart.yaml").read_text())
    labels = dict(re.findall(r'(org\.opencontainers\.image\.\w+)="([^"]+)"', (ROOT / "Dockerfile").read_text()))
    assert project["license"] == {"text": "Apache-2.0"}
    assert chart["annotations"]["artifacthub.io/license"] == "Apache-2.0"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.version"] == project["version"] == chart["appVersion"]
