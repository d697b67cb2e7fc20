"""Pre-flight of the device check: rollmux's declared dependencies are installed at their bounds, grpcio
and protobuf are at least the versions the checked-in stubs were generated with, and everything each
stage imports is importable.

Standard library only, so it runs on a bare machine. It prints one line and exits 1 when anything is
missing (what, and for which stages), 0 otherwise; ``--out DIR`` also writes ``DIR/0-preflight.json``.
The versions are compared before any stub is imported: an older runtime makes the stubs' first import
raise, which would otherwise surface as a crash inside a stage.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import re
import sys
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "rollmux" / "proto"

COMMON = ("torch", "grpc", "google.protobuf")
STAGE_MODULES: dict[str, tuple[str, ...]] = {
    "1": ("rollmux.sidecar.gpu",),
    "2": ("pytest", "pytest_timeout", "rollmux.shim.state_cache", "rollmux.sidecar.gpu",
          "torch.distributed.fsdp", "rollmux.demo.tiny_grpo.job", "rollmux.sync_plugin.stream"),
    "3": ("rollmux.shim.state_cache",),
    "4": ("rollmux.demo.launch", "rollmux.demo.report", "rollmux.demo.tiny", "rollmux.demo.tiny_grpo.rollmux_rank",
          "rollmux.coordinator.service.server", "rollmux.sidecar.cli", "rollmux.sidecar.server", "grpc_health.v1",
          "prometheus_client", "rollmux.sidecar.gpu"),
    "5": ("rollmux.sync_plugin.stream",),
}
"""What each stage imports (its own modules and what they pull in is found by importing them)."""
GPU_MODULES: dict[str, tuple[str, ...]] = {"1": ("pynvml",), "3": ("pynvml",), "4": ("pynvml",)}
"""Imported on a GPU run only: NVML's per-process memory (nvidia-ml-py)."""

DISTRIBUTIONS = {"yaml": "pyyaml", "grpc": "grpcio", "grpc_health": "grpcio-health-checking", "google": "protobuf",
                 "pynvml": "nvidia-ml-py", "pytest_timeout": "pytest-timeout", "prometheus_client": "prometheus-client"}
"""Top-level module -> the package that installs it, where the names differ."""


@dataclass(slots=True)
class Verdict:
    """What the pre-flight found."""

    missing: dict[str, list[str]] = field(default_factory=dict)  # package -> stages that need it
    too_old: dict[str, dict[str, str]] = field(default_factory=dict)  # package -> {"installed", "needed"}
    broken: dict[str, str] = field(default_factory=dict)  # module -> its import error (not a missing module)
    versions: dict[str, str] = field(default_factory=dict)  # what was found installed

    @property
    def ok(self) -> bool:
        return not (self.missing or self.too_old or self.broken)

    def line(self) -> str:
        """The one line an operator reads."""
        if self.ok:
            return "gpu_check preflight: ok (" + ", ".join(f"{k} {v}" for k, v in self.versions.items()) + ")"
        parts = []
        by_stages: dict[str, list[str]] = {}
        for package, stages in self.missing.items():
            by_stages.setdefault(",".join(sorted(stages)), []).append(package)
        if by_stages:
            parts.append("missing " + ", ".join(f"{', '.join(ps)} (stage {st})" for st, ps in by_stages.items()))
        parts += [f"{p} {v['installed']} is older than {v['needed']} (the stubs' or rollmux's bound)"
                  for p, v in self.too_old.items()]
        parts += [f"{m} fails to import: {e}" for m, e in self.broken.items()]
        return ("gpu_check preflight: FAIL: " + "; ".join(parts) + ". Run `bash scripts/gpu_check.sh "
                "--prepare-wheels` on a machine with network and send out/gpu-check-wheels along")


def stub_versions(proto: Path = PROTO) -> dict[str, str]:
    """The grpcio and protobuf versions the checked-in stubs were generated with (read, not imported)."""
    grpc = {m.group(1) for f in proto.glob("*_pb2_grpc.py")
            for m in [re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", f.read_text())] if m}
    pb = {".".join(m.groups()) for f in proto.glob("*_pb2.py")
          for m in [re.search(r"ValidateProtobufRuntimeVersion\(\s*\S+,\s*(\d+),\s*(\d+),\s*(\d+),", f.read_text())]
          if m}
    return {"grpcio": max(grpc, key=release), "protobuf": max(pb, key=release)}


def release(version: str) -> tuple[int, ...]:
    """The numeric release part of a version ("1.85.4rc1" -> (1, 85, 4)). Pure."""
    out = []
    for part in version.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        out.append(int(digits.group()))
        if digits.group() != part:
            break
    return tuple(out)


def installed(dist: str) -> str | None:
    """The installed version of a distribution (the first on sys.path, as an import would find it)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def declared(pyproject: Path = ROOT / "pyproject.toml", platform: str = sys.platform) -> dict[str, str]:
    """rollmux's declared dependencies that apply on `platform`: name -> lower bound ("" if none)."""
    try:
        import tomllib

        requirements = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    except ModuleNotFoundError:  # Python 3.10: the installed rollmux's metadata says the same
        try:
            requirements = [r for r in importlib.metadata.requires("rollmux") or [] if "extra ==" not in r]
        except importlib.metadata.PackageNotFoundError:
            requirements = []  # not installed yet: the stages' imports below still find what is missing
    out = {}
    for req in requirements:
        spec, _, marker = req.partition(";")
        m = re.match(r"\s*(sys_platform)\s*(==|!=)\s*['\"]([^'\"]+)['\"]\s*$", marker) if marker else None
        if marker and (m is None or (platform == m.group(3)) != (m.group(2) == "==")):
            continue  # a marker that excludes this platform (or one this reader does not evaluate)
        name = re.match(r"\s*([A-Za-z0-9_.-]+)", spec)
        bound = re.search(r">=\s*([0-9][0-9.]*)", spec)
        if name:
            out[name.group(1).lower()] = bound.group(1) if bound else ""
    return out


def check(stages: list[str], gpu: bool) -> Verdict:
    """Versions first (the stubs' and rollmux's declared bounds), then every module each stage imports."""
    v = Verdict()
    needs = declared()
    for dist, needed in stub_versions().items():
        needs[dist] = max(needed, needs.get(dist, ""), key=lambda x: release(x) if x else ())
    modules = {package: module for module, package in DISTRIBUTIONS.items()} | {"protobuf": "google.protobuf"}
    for dist, needed in needs.items():
        have = installed(dist)
        try:
            importlib.import_module(modules.get(dist, dist.replace("-", "_")))
        except ModuleNotFoundError:
            have = None
        except Exception:  # noqa: BLE001 - installed but broken (an old protobuf under new stubs): the
            pass  # version comparison and the stage imports below say what is wrong
        if have is None:
            v.missing.setdefault(dist, []).extend(stages)
        elif needed and release(have) < release(needed):
            v.too_old[dist] = {"installed": have, "needed": needed}
        if dist in ("grpcio", "protobuf"):
            v.versions[dist] = have or "absent"
    torch = installed("torch")
    v.versions = {"torch": torch or "absent", **v.versions}
    for stage in stages:
        for module in (*COMMON, *STAGE_MODULES.get(stage, ()), *(GPU_MODULES.get(stage, ()) if gpu else ())):
            if any(module.startswith(m + ".") or module == m for m in ("grpc", "google.protobuf")) and v.too_old:
                continue  # importing them now would only restate the version mismatch
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                top = (exc.name or module).split(".")[0]
                if top == "rollmux":  # one entry, not one per module
                    v.broken["rollmux"] = "not installed (pip install -e . from this checkout)"
                    continue
                package = DISTRIBUTIONS.get(top, top)
                if package not in v.too_old and stage not in v.missing.setdefault(package, []):
                    v.missing[package].append(stage)
            except Exception as exc:  # noqa: BLE001 - reported, not raised: the operator reads one line
                v.broken.setdefault(module, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return v


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="the CPU run: NVML is not needed")
    p.add_argument("--stages", default="", help="comma-separated stage numbers (default: all)")
    p.add_argument("--out", type=Path, default=None, help="folder for 0-preflight.json")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")  # an import's warning (torch without numpy warns) would break the one line
    stages = [s.strip() for s in args.stages.split(",") if s.strip()] or sorted(STAGE_MODULES)
    verdict = check(stages, gpu=not args.cpu)
    line = verdict.line()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "0-preflight.json").write_text(json.dumps({"ok": verdict.ok, "line": line, **asdict(verdict)},
                                                              indent=2))
    print(line, file=sys.stdout if verdict.ok else sys.stderr, flush=True)
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
