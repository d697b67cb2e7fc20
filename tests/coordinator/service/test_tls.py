"""TLS on the gRPC port with a self-signed certificate generated at test time."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from rollmux.coordinator.service.server import ServerOptions, ThreadedServer
from rollmux.core.model import Phase
from rollmux.wire.client import CoordinatorClient
from rollmux.wire.errors import NotReadyError

from .conftest import FAST, add_nodes, close_node_streams, job_spec


def self_signed(tmp: Path) -> tuple[Path, Path]:
    """A throwaway key and certificate for 127.0.0.1 / localhost (openssl CLI, else skip)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl not found: cannot generate a self-signed certificate for the TLS test")
    key, cert = tmp / "key.pem", tmp / "cert.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    return key, cert


def test_tls_serves_verified_clients_and_refuses_plaintext(tmp_path: Path) -> None:
    key, cert = self_signed(tmp_path)
    srv = ThreadedServer(ServerOptions(config=FAST, http=None, tls_cert=str(cert), tls_key=str(key)))
    try:
        assert srv.wait_ready(10), srv.core.not_ready_reason
        client = CoordinatorClient(srv.address, retry_s=5, root_certificates=cert.read_bytes())
        add_nodes(client, 1, 1)
        job = client.register_job(job_spec("a", slo=1.0))
        permit = job.acquire(Phase.ROLLOUT, 0, timeout_s=5)
        assert job.advance(permit, 0.1, timeout_s=5).phase is Phase.TRAIN
        close_node_streams()
        client.close()
        plain = CoordinatorClient(srv.address, retry_s=0.5)  # no TLS: the handshake never completes
        with pytest.raises(NotReadyError):
            plain.cluster_state()
        plain.close()
    finally:
        srv.stop()
