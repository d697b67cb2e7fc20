"""The veRL plugin in fresh interpreters against the real veRL 0.9.1: silent and patch-free when not
opted in, patches at import when opted in, unpatch restores, and fail-fast without a sidecar."""

from __future__ import annotations

from pathlib import Path

from tests.adapters.conftest import run_fresh


def test_not_opted_in_imports_nothing_and_patches_nothing() -> None:
    res = run_fresh('''
import sys
import verl, verl.checkpoint_engine.base as ceb
from rollmux.adapters.common import is_patched
assert "rollmux.adapters.verl.plugin" in sys.modules          # veRL loaded our entry point
assert not is_patched(ceb.CheckpointEngineManager.__dict__["update_weights"])
assert "grpc" not in sys.modules, "grpc imported without the opt-in"
''')
    assert res.returncode == 0, res.stderr[-3000:]


def test_opted_in_patches_on_import_and_unpatch_restores(tmp_path: Path) -> None:
    res = run_fresh('''
import verl.checkpoint_engine.base as ceb
from rollmux.adapters.common import is_patched
from rollmux.adapters.verl import plugin
raw = ceb.CheckpointEngineManager.__dict__["sleep_replicas"]
assert is_patched(raw) and is_patched(ceb.CheckpointEngineManager.__dict__["update_weights"])
assert plugin.load() and plugin.patcher().patch() is False      # idempotent
import verl.trainer.ppo.v1.trainer_base as tb
assert is_patched(tb.PPOTrainer.__dict__["_update_actor"])
plugin.unpatch()
assert not is_patched(ceb.CheckpointEngineManager.__dict__["sleep_replicas"])
assert not is_patched(tb.PPOTrainer.__dict__["_update_actor"])
''', env={"ROLLMUX_SIDECAR_SOCKET": str(tmp_path / "none.sock")})
    assert res.returncode == 0, res.stderr[-3000:]


def test_opted_in_without_sidecar_fails_fast_naming_the_socket(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "harness"))
    from assets import build
    from job import VerlJob

    sock = str(tmp_path / "missing.sock")
    job = VerlJob(name="nosidecar", assets=build(tmp_path / "assets"), workdir=tmp_path / "job", steps=1)
    proc = job.start({"ROLLMUX_SIDECAR_SOCKET": sock})
    assert proc.wait(timeout=180) != 0
    log = (tmp_path / "job" / "job.log").read_text(errors="replace")
    assert "no sidecar socket exists at that path" in log and sock in log
    assert "ray init kwargs" not in log and "pid=" not in log, "Ray or a worker started before the check"


def _shadow_version(root: Path, version: str) -> Path:
    """A folder whose ``verl-<version>.dist-info`` shadows the installed veRL's metadata when it comes
    first on the path: the code imported is still the real veRL 0.9.1, only its declared version differs."""
    dist = root / f"verl-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: verl\nVersion: {version}\n")
    return root


def test_unsupported_verl_version_opted_in_fails_with_a_clear_error_before_ray(tmp_path: Path) -> None:
    import os
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "harness"))
    from assets import build
    from job import HARNESS, REPO, VerlJob

    shadow = _shadow_version(tmp_path / "shadow", "0.8.5")
    path = os.pathsep.join(map(str, (shadow, HARNESS, REPO)))
    probe = run_fresh('''
import importlib.metadata as m, verl, verl.trainer.ppo.ray_trainer
print(m.version("verl"), "site-packages" in verl.__file__)
''', env={"PYTHONPATH": path})
    assert probe.returncode == 0 and probe.stdout.split() == ["0.8.5", "True"], probe.stderr[-2000:]
    assert "[rollmux]" not in probe.stderr, "not opted in: the adapter must stay silent on any version"

    job = VerlJob(name="oldverl", assets=build(tmp_path / "assets"), workdir=tmp_path / "job", steps=1,
                  env={"PYTHONPATH": path})
    proc = job.start({"ROLLMUX_SIDECAR_SOCKET": str(tmp_path / "sidecar.sock")})
    assert proc.wait(timeout=180) != 0
    log = (tmp_path / "job" / "job.log").read_text(errors="replace")
    assert "supports verl>=0.9,<0.10, found 0.8.5" in log and "unset ROLLMUX_SIDECAR_SOCKET" in log, log[-3000:]
    assert "ray init kwargs" not in log and "pid=" not in log, "Ray or a worker started before the refusal"
