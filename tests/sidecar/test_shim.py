"""The shim without the opt-in (no-op, cheap, torch never imported) and opted in but unreachable."""

from __future__ import annotations

from pathlib import Path

from rollmux.shim import env

from .conftest import run_python

NOOP = r"""
import sys, time
import rollmux
assert rollmux.init() is False
calls = []

@rollmux.phase("train")
def step(x):
    calls.append(x)
    return x + 1

assert step(1) == 2 and calls == [1]
with rollmux.phase("rollout") as ctx:
    assert ctx is None
assert rollmux.runtime_hook(3, 10) is None
assert rollmux.relocation() is None and rollmux.relocate() is False
rollmux.register_state(object())
rollmux.shutdown()
assert "torch" not in sys.modules and "grpc" not in sys.modules, sorted(m for m in sys.modules if "grpc" in m)[:3]

def plain(x):
    return x + 1

n = 200_000
t = time.perf_counter(); [plain(i) for i in range(n)]; base = time.perf_counter() - t
t = time.perf_counter(); [step(i) for i in range(n)]; dec = time.perf_counter() - t
t = time.perf_counter()
for _ in range(n):
    with rollmux.phase("sync"):
        pass
cm = time.perf_counter() - t
print(f"no-op overhead per call: decorator {(dec - base) / n * 1e9:.0f} ns, context manager {cm / n * 1e9:.0f} ns")
"""


def test_without_opt_in_everything_is_a_no_op() -> None:
    res = run_python(NOOP)
    assert res.returncode == 0, res.stderr
    print(res.stdout.strip())  # overhead figure, for the record (not asserted: shared CI machines)


def test_opted_in_without_sidecar_fails_fast_naming_the_socket(tmp_path: Path) -> None:
    missing = tmp_path / "nope.sock"
    code = ("import rollmux\n"
            "from rollmux.wire.errors import SidecarUnreachableError\n"
            "try:\n    rollmux.init()\nexcept SidecarUnreachableError as e:\n    print(e)\nelse:\n    raise SystemExit(3)\n")
    res = run_python(code, {env.SIDECAR_SOCKET: str(missing), env.JOB: "j", env.JOB_TOKEN: "t"})
    assert res.returncode == 0, res.stderr
    assert str(missing) in res.stdout and env.SIDECAR_SOCKET in res.stdout and "rollmux sidecar" in res.stdout


def test_stale_socket_file_fails_fast(tmp_path: Path) -> None:
    import socket

    path = str(tmp_path / "s.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)  # bound, never listening: connection refused
    try:
        code = ("import rollmux\n"
                "from rollmux.wire.errors import SidecarUnreachableError\n"
                "try:\n    rollmux.init(connect_timeout_s=1.0)\nexcept SidecarUnreachableError as e:\n    print(e)\n"
                "else:\n    raise SystemExit(3)\n")
        res = run_python(code, {env.SIDECAR_SOCKET: path, env.JOB: "j", env.JOB_TOKEN: "t"})
    finally:
        s.close()
    assert res.returncode == 0, res.stderr
    assert path in res.stdout and "did not accept" in res.stdout


def test_opted_in_without_job_token_names_the_variables(tmp_path: Path) -> None:
    code = ("import rollmux\nfrom rollmux.wire.errors import ShimConfigError\n"
            "try:\n    rollmux.init()\nexcept ShimConfigError as e:\n    print(e)\nelse:\n    raise SystemExit(3)\n")
    res = run_python(code, {env.SIDECAR_SOCKET: str(tmp_path / "x.sock")})
    assert res.returncode == 0, res.stderr
    assert env.JOB in res.stdout and env.JOB_TOKEN in res.stdout
