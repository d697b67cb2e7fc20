"""The documentation stays true to the tree: the generated reference is current, every relative link and
every repository path the pages name exists, and the pages stay readable (README under 200 lines, no
page over ~25 KB)."""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REGENERATE = ".venv/bin/python scripts/gen_reference.py"
MAX_PAGE_BYTES = 25 * 1024
MAX_README_LINES = 200


def _pages() -> list[Path]:
    """Every Markdown page a user reads, plus the chart's install notes."""
    pages = [ROOT / "README.md", ROOT / "charts" / "rollmux" / "README.md",
             ROOT / "charts" / "rollmux" / "templates" / "NOTES.txt"]
    for folder in ("docs", "benchmarks/results"):
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
