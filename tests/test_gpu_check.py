"""The device check (``scripts/gpu_check.sh``) without a GPU: its pre-flight, its verdicts, and its CPU
twin run in a virtualenv holding only what the GPU machine has plus the prepared wheels."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
sys.path.insert(0, str(ROOT / "scripts" / "gpu_check"))

import preflight  # noqa: E402
from nvml_facts import device_facts, env_checks, listed_pids  # noqa: E402
from run import markdown, state_cache_checks  # noqa: E402
from stage_sync import nccl_outcome  # noqa: E402

BOX = ("torch==2.13.0", "grpcio==1.74.0", "protobuf==6.31.1", "nvidia-ml-py")
"""What the GPU image holds of what the check needs (older grpcio and protobuf than the stubs want)."""


# ------------------------------------------------------------------------------------ the pre-flight


def _standins(tmp_path: Path, absent: tuple[str, ...] = (), old: dict[str, str] | None = None) -> dict[str, str]:
    """An environment where each of `absent` fails to import as if not installed, and each package of
    `old` reports the given version (a stand-in dist-info ahead of the real one on the path)."""
    d = tmp_path / "standins"
    for m in absent:
        (d / m).mkdir(parents=True, exist_ok=True)
        (d / m / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{m}'\", name={m!r})\n")
    for dist, version in (old or {}).items():
        info = d / f"{dist}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    d.mkdir(exist_ok=True)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(d), os.environ.get("PYTHONPATH", "")])}


def _preflight(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check" / "preflight.py"), "--cpu", "--stages",
                           "1"], env=env, capture_output=True, text=True, timeout=300, cwd="/")


@pytest.mark.parametrize(("absent", "old", "says"), [
    (("numpy",), None, "missing numpy (stage 1)"),
    (("rich",), None, "missing rich (stage 1)"),
    ((), {"protobuf": "5.26.1"}, "protobuf 5.26.1 is older than 7.35.1"),
], ids=["numpy", "rich", "old-protobuf"])
def test_preflight_fails_with_one_line(tmp_path: Path, absent: tuple[str, ...], old: dict[str, str] | None,
                                       says: str) -> None:
    proc = _preflight(_standins(tmp_path, absent, old))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check preflight: FAIL: "), lines
    assert says in lines[0] and "--prepare-wheels" in lines[0]


def test_declared_lower_bounds_are_the_stubs_versions() -> None:
    tomllib = pytest.importorskip("tomllib")
    stubs = preflight.stub_versions()
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bounds = {m.group(1): m.group(2) for d in deps["dependencies"] + deps["optional-dependencies"]["dev"]
              for m in [re.match(r"([a-z-]+)>=([0-9.]+)", d)] if m}
    assert bounds["grpcio"] == stubs["grpcio"] and bounds["grpcio-tools"] == stubs["grpcio"]
    assert bounds["protobuf"] == stubs["protobuf"]


# ------------------------------------------------------------------------------ every stage can fail

GB = 2_000_000_000


def _bench(**over: object) -> dict:
    fig = {"state_bytes": GB, "bitwise_identical": True, "pcie_peak_gbps": {"offload": 52.0, "reload": 53.0},
           "pcie_fraction": {"offload": 0.85, "reload": 0.9}, "cache_vs_plain_copy": {"offload": 0.97, "reload": 0.99},
           "freed": {"cache_bytes": GB, "allocator_bytes": GB, "nvml_bytes": GB, "host_bytes": GB}}
    fig.update(over)
    return fig


def _failed(checks: list) -> list[str]:
    return [c.name for c in checks if c.ok is False]


def test_state_cache_stage_passes_good_figures_and_fails_each_bad_one() -> None:
    assert _failed(state_cache_checks(_bench(), gpu=True)) == []
    slow = _failed(state_cache_checks(_bench(pcie_fraction={"offload": 0.1, "reload": 0.9}), gpu=True))
    assert slow == ["offload vs the measured PCIe peak"]  # a copy path at 10% of PCIe fails
    plain = _failed(state_cache_checks(_bench(cache_vs_plain_copy={"offload": 0.95, "reload": 0.5}), gpu=True))
    assert plain == ["reload cache_vs_plain_copy"]
    kept = _failed(state_cache_checks(_bench(freed={"cache_bytes": GB, "allocator_bytes": GB, "nvml_bytes": 0}),
                                      gpu=True))
    assert len(kept) == 1 and kept[0].startswith("NVML bytes freed")  # empty_cache missing, or a PID namespace
    assert _failed(state_cache_checks(_bench(bitwise_identical=False), gpu=True))
    cpu = state_cache_checks(_bench(pcie_fraction=None, pcie_peak_gbps=None,
                                    cache_vs_plain_copy={"offload": 0.2, "reload": 0.2}), gpu=False)
    assert _failed(cpu) == [] and [c.ok for c in cpu if "cache_vs_plain_copy" in c.name] == [None, None]


def test_env_stage_fails_for_exclusive_mode_mig_and_an_unseen_pid() -> None:
    good = {"compute_mode": "DEFAULT", "mig_current": False, "persistence": True, "pcie_gen": 5, "pcie_width": 16,
            "pcie_gen_max": 5}
    assert _failed(env_checks(good, pid_seen=True)) == []
    assert _failed(env_checks({**good, "compute_mode": "EXCLUSIVE_PROCESS"}, True)) == [
        "compute mode lets several processes share the GPU"]
    assert len(_failed(env_checks({**good, "mig_current": True}, True))) == 1
    unseen = _failed(env_checks(good, pid_seen=False))
    assert len(unseen) == 1 and "PID namespace?" in unseen[0]


class StandInNvml:
    """A stand-in for pynvml (no GPU here): an H100 in EXCLUSIVE_PROCESS mode without MIG support,
    listing host PIDs 7 and 9."""

    class NotSupported(Exception):
        pass

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetComputeMode(self, h: int) -> int:
        return 3

    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:
        raise self.NotSupported("Not Supported")

    def nvmlDeviceGetPersistenceMode(self, h: int) -> int:
        return 1

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return 5

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return 16

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list:
        return [type("P", (), {"pid": 7})(), type("P", (), {"pid": 9})()]


def test_env_stage_reads_nvml_facts_and_names_what_blocks_multiplexing() -> None:
    nv = StandInNvml()
    facts = device_facts(nv, 0)
    assert facts == {"name": "NVIDIA H100 80GB HBM3", "compute_mode": "EXCLUSIVE_PROCESS", "mig_current": None,
                     "mig_pending": None, "persistence": True, "pcie_gen": 5, "pcie_gen_max": 5, "pcie_width": 16}
    assert listed_pids(nv, [0]) == {7, 9}
    assert _failed(env_checks(facts, pid_seen=8 in listed_pids(nv, [0]))) == [
        "compute mode lets several processes share the GPU",
        "NVML lists this process's child by its PID (if not: PID namespace?)"]


def test_nccl_outcome_accepts_a_refusal_with_its_text_but_not_a_hang() -> None:
    refused = [{"rank": 0, "error": "torch.distributed.DistBackendError: NCCL error ...\nLast error:\n"
                                    "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 1000"},
               {"rank": 1, "error": "..."}]
    text, ok = nccl_outcome(refused)
    assert ok and text.startswith("not possible on one GPU:") and "Duplicate GPU detected" in text
    assert nccl_outcome([{"rank": 0}, {"rank": 1, "bitwise": True}]) == (
        "accepted: the rollout received the model bit for bit", True)
    assert not nccl_outcome([{"rank": 0}, {"rank": 1, "bitwise": False}])[1]
    assert not nccl_outcome([{"rank": 0}, {"rank": 1, "error": "no result within 45s"}])[1]
    text, ok = nccl_outcome([refused[0], {"rank": 1, "error": "no result within 30s"}])  # its peer waited on it
    assert ok and "Duplicate GPU detected" in text


def test_summary_table_has_a_row_per_check_with_its_threshold() -> None:
    from dataclasses import asdict

    checks = [asdict(c) for c in state_cache_checks(_bench(pcie_fraction={"offload": 0.1, "reload": 0.9}), True)]
    table = markdown({"mode": "gpu", "small": False, "ok": False, "stages": [
        {"stage": "3-state-cache", "ok": False, "wall_s": 40.0, "timeout_s": 75, "checks": checks, "notes": []}]})
    assert "| 3-state-cache | offload vs the measured PCIe peak | 0.1 | >= 0.7 | FAIL |" in table
    assert table.startswith("# gpu_check (gpu): FAIL")


def test_a_failing_stage_fails_the_run(tmp_path: Path) -> None:
    """Stage 1 on a machine without CUDA and without --cpu fails, and so does the script."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: stage 1 would pass")
    out = tmp_path / "gpu-check"
    proc = subprocess.run(["bash", str(SCRIPT), "--stages", "1", "--out", str(out), "--work", str(tmp_path / "work")],
                          cwd=tmp_path,
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert not summary["ok"] and summary["stages"][0]["stage"] == "1-env"
    assert summary["preflight"]["ok"] and re.fullmatch(r"gpu_check preflight: ok \(torch \S+, grpcio \S+, protobuf \S+\)",
                                                          summary["preflight"]["line"])
    assert "[FAIL] 1-env" in proc.stdout and "torch sees a CUDA device" in proc.stdout
    assert "| 1-env | torch sees a CUDA device | false |" in (out / "summary.md").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["details.tar.gz", "gpu_check.log", "summary.json", "summary.md"]


# ---------------------------------------------------------------------------- the CPU twin, in CI

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rollmux" / "gpu-check-twin"


def _key(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _box_venv() -> Path:
    """A virtualenv holding only what the GPU image has (cached outside the checkout, keyed by it)."""
    base = CACHE / f"box-{sys.version_info.major}.{sys.version_info.minor}-{_key(*BOX)}"
    if not (base / ".complete").exists():
        shutil.rmtree(base, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(base)], check=True, timeout=300)
        subprocess.run([str(base / "bin" / "python"), "-m", "pip", "install", "-q", *BOX], check=True, timeout=900)
        (base / ".complete").write_text("")
    return base


def _wheels() -> Path:
    """The prepared wheels for this interpreter (cached, keyed by the declared dependencies)."""
    inputs = (ROOT / "pyproject.toml").read_text() + SCRIPT.read_text()
    folder = CACHE / f"wheels-{sys.version_info.major}.{sys.version_info.minor}-{_key(inputs)}"
    if not (folder / ".complete").exists():
        proc = subprocess.run(["bash", str(SCRIPT), "--prepare-wheels", "--for-this-python", "--wheels", str(folder)],
                              env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        (folder / ".complete").write_text("")
    return folder


def _twin(tmp_path: Path) -> Path:
    """A fresh virtualenv whose packages are the box venv's (one .pth line): what the check installs lands
    here and in --site, never in the cached box."""
    base = _box_venv()
    twin = tmp_path / "twin"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(twin)], check=True, timeout=120)
    lib = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (twin / "lib" / lib / "site-packages" / "box.pth").write_text(
        f"import site; site.addsitedir({str(base / 'lib' / lib / 'site-packages')!r})\n")
    return twin / "bin" / "python"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_cpu_twin_passes_in_a_venv_holding_only_what_the_gpu_box_has(tmp_path: Path) -> None:
    python = _twin(tmp_path)
    wheels = _wheels()
    mib = sum(f.stat().st_size for f in wheels.glob("*.whl")) / (1 << 20)
    assert mib < 60, f"the prepared wheels take {mib:.0f} MiB"
    bare = subprocess.run([str(python), str(ROOT / "scripts" / "gpu_check" / "preflight.py"), "--cpu"],
                          capture_output=True, text=True, timeout=300, cwd="/")
    missing = re.search(r"FAIL: missing ([^;]*)", bare.stderr)
    assert bare.returncode == 1 and missing and {"numpy", "rich"} <= set(re.findall(r"[\w-]+", missing.group(1)))
    assert "grpcio 1.74.0 is older than" in bare.stderr and "protobuf 6.31.1 is older than" in bare.stderr
    out = tmp_path / "gpu-check"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLMUX_", "PYTHON", "VIRTUAL_ENV"))}
    proc = subprocess.run(["bash", str(SCRIPT), "--cpu", "--small", "--out", str(out), "--wheels", str(wheels),
                           "--site", str(tmp_path / "site"), "--work", str(tmp_path / "work")], cwd=tmp_path,
                          env={**env, "PYTHON": str(python)},
                          capture_output=True, text=True, timeout=1200)
    log = (out / "gpu_check.log").read_text() if (out / "gpu_check.log").exists() else ""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:] + log[-4000:]
    assert proc.stdout.startswith("gpu_check preflight: FAIL: missing ")  # before the offline install
    summary = json.loads((out / "summary.json").read_text())
    stages = {s["stage"]: s for s in summary["stages"]}
    assert summary["ok"] and summary["preflight"]["ok"]
    assert list(stages) == ["1-env", "2-cuda-tests", "3-state-cache", "4-multiplex", "5-sync"]
    assert stages["1-env"]["figures"]["memory_provider"] == "StandInMemoryProvider"
    assert stages["3-state-cache"]["figures"]["bitwise_identical"]
    mux = stages["4-multiplex"]["figures"]
    assert mux["not_freed_pids"] == [mux["control_pid"]]  # the positive control, and only it
    assert mux["overlapping_phases"] == 0 and mux["order_violations"] == 0
    assert stages["5-sync"]["figures"]["bitwise_identical"]
    assert "[FAIL]" not in proc.stdout and (out / "summary.md").read_text().startswith("# gpu_check (cpu, small): PASS")
