"""HTTP probes and metrics: ``/livez`` (process alive), ``/readyz`` (leader, store reachable, state
loaded; 503 otherwise, with the reason) and ``/metrics`` (Prometheus text format)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class ProbeServer:
    """Serve the probes on `host:port` from a daemon thread.

    Args:
        ready: returns (ready, reason).
        registry: the metrics to expose.
    """

    def __init__(self, host: str, port: int, ready: Callable[[], tuple[bool, str]],
                 registry: CollectorRegistry) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                path = self.path.split("?", 1)[0]
                if path == "/livez":
                    self._send(200, b"ok\n", "text/plain")
                elif path == "/readyz":
                    ok, reason = ready()
                    self._send(200 if ok else 503, (b"ok\n" if ok else f"not ready: {reason}\n".encode()),
                               "text/plain")
                elif path == "/metrics":
                    self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                else:
                    self._send(404, b"not found: try /livez, /readyz or /metrics\n", "text/plain")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                return

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="rollmux-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
