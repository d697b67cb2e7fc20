"""The scheduler's HTTP endpoint: Prometheus metrics on /metrics, and /livez and /readyz that answer
from the scheduler's own watchdog (informer threads alive and progressing, the loop cycling), so a
dead informer turns the probes red instead of a TCP check staying green."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class HealthServer:
    """Serves until `close()`; `health()` returns "" when healthy, else why not (the 503 body)."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry, health: Callable[[], str]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._answer(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif path in ("/livez", "/readyz", "/healthz"):
                    why = health()
                    self._answer(503 if why else 200, (why or "ok").encode() + b"\n", "text/plain")
                else:
                    self._answer(404, b"not found\n", "text/plain")

            def _answer(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:  # probes every few seconds: not worth a log line
                return

        self._server = ThreadingHTTPServer((host, port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="health", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
