"""The container build file: hadolint clean, non-root, and the package it installs needs no torch."""

from __future__ import annotations

import re
import subprocess
import zipfile
from pathlib import Path

from .conftest import BIN, ROOT, need

DOCKERFILE = ROOT / "Dockerfile"


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(need(BIN / "hadolint")), "--no-color", str(path)], capture_output=True, text=True,
                          timeout=60)


def test_hadolint_passes_on_the_dockerfile() -> None:
    proc = hadolint(DOCKERFILE)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_flags_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\nUSER root\n")
    proc = hadolint(bad)
    assert proc.returncode != 0 and "DL3007" in proc.stdout and "DL3002" in proc.stdout, proc.stdout


def test_the_image_runs_as_the_non_root_user_the_chart_expects() -> None:
    text = DOCKERFILE.read_text()
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users == ["10001:10001"]  # the last USER wins; the chart's coordinator runs as 10001
    assert re.findall(r'^ENTRYPOINT \["rollmux"\]', text, re.M)


def test_the_wheel_the_image_installs_does_not_require_torch(tmp_path: Path) -> None:
    subprocess.run([str(BIN / "python"), "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "--wheel-dir", str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("rollmux-*.whl")
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    torch = [r for r in requires if re.match(r"torch\b", r)]
    assert torch and all("extra ==" in r for r in torch), torch  # torch only behind an extra
    assert any(r.startswith("grpcio") and "extra" not in r for r in requires)


def test_the_dockerfile_copies_every_source_folder_the_package_maps() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = set(project["tool"]["setuptools"]["package-dir"].values())
    copied = set(re.findall(r"^COPY (\S+)/ ", DOCKERFILE.read_text(), re.M))
    assert folders <= copied, f"Dockerfile does not COPY {sorted(folders - copied)}"
    readme = project["project"]["readme"]
    assert re.search(rf"^COPY pyproject.toml {readme} ", DOCKERFILE.read_text(), re.M)
