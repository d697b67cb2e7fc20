"""The chart's generated TLS material works end to end: a real coordinator serves it, a real
`rollmux sidecar` process with the chart's --tls-ca and --secret-file joins, `rollmux status` reads it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollmux.coordinator.service.server import ServerOptions, ThreadedServer
from rollmux.wire.auth import operator_token

from .conftest import ROOT, name, render

CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("ROLLMUX_")}


@pytest.mark.timeout(120)
def test_generated_certificate_serves_grpc_and_the_sidecar_joins_with_the_ca(tmp_path: Path) -> None:
    r = render(sets=("tls.enabled=true", "tls.extraDnsNames={localhost}"))
    files = {}
    for key in ("tls.crt", "tls.key", "ca.crt"):
        files[key] = tmp_path / key
        files[key].write_text(r.secret_value(name("tls"), key))
    secret = r.secret_value(name("auth"), "bootstrap-secret")
    (tmp_path / "bootstrap-secret").write_text(secret)
    srv = ThreadedServer(ServerOptions(listen="127.0.0.1:0", http=None, secret=secret,
                                       tls_cert=str(files["tls.crt"]), tls_key=str(files["tls.key"])))
    proc = None
    try:
        assert srv.wait_ready(30)
        target = f"localhost:{srv.address.rsplit(':', 1)[1]}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "rollmux", "sidecar", f"--coordinator={target}", "--node-id=gpu-node-1",
             "--pool=train", "--no-nvml", f"--socket={tmp_path / 's.sock'}", f"--ready-file={tmp_path / 'ready'}",
             f"--secret-file={tmp_path / 'bootstrap-secret'}", f"--tls-ca={files['ca.crt']}"],
            cwd=ROOT, env=CLEAN_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready").exists():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the sidecar never connected over TLS"
            time.sleep(0.05)
        status = [sys.executable, "-m", "rollmux", "status", f"--coordinator={target}", "--json", "--timeout=5",
                  f"--token={operator_token(secret)}"]
        ok = subprocess.run([*status, f"--tls-ca={files['ca.crt']}"], cwd=ROOT, env=CLEAN_ENV, capture_output=True,
                            text=True, timeout=60)
        assert ok.returncode == 0, ok.stderr
        assert "gpu-node-1" in ok.stdout
        plain = subprocess.run(status[:-2] + ["--timeout=1", status[-1]], cwd=ROOT, env=CLEAN_ENV,
                               capture_output=True, text=True, timeout=60)
        assert plain.returncode != 0  # no CA: the TLS port does not answer a plaintext client
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(15)
        srv.stop()
