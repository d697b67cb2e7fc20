"""A small Kubernetes API client: list, watch, get, create, patch, over HTTPS with a bearer token.

The standard library only, so the scheduler runs from the slim install (`pip install rollmux`). One
connection per thread (`http.client` connections are not thread-safe); a watch holds its own.
In a pod, `KubeClient.in_cluster()` reads the service account's token and CA, as client-go does.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import ssl
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollmux.core.errors import RollMuxError

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where Kubernetes mounts a pod's service-account token and the cluster's CA."""


class KubeError(RollMuxError):
    """The API server answered with an error status (`status` holds it; 0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class GoneError(KubeError):
    """410 Gone: the watch's resourceVersion is too old; list again."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeConfig:
    server: str  # https://host:port
    token: str = ""
    token_file: str = ""  # read again when it changes (bound service-account tokens rotate); wins over token
    ca_file: str = ""  # "" with insecure=False: the system's CAs
    insecure: bool = False  # skip TLS verification (a loopback test server's self-signed pair)


class KubeClient:
    """JSON over HTTPS to one API server.

    Raises (every method):
        KubeError: a non-2xx answer, or the connection failed (status 0).
    """

    def __init__(self, config: KubeConfig, *, timeout_s: float = 30.0) -> None:
        self.config = config
        url = urllib.parse.urlsplit(config.server)
        self._host, self._port = url.hostname or "127.0.0.1", url.port or 443
        self._ctx = ssl.create_default_context(cafile=config.ca_file or None)
        if config.insecure:
            self._ctx.check_hostname = False
            self._ctx.verify_mode = ssl.CERT_NONE
        self._timeout_s = timeout_s
        self._local = threading.local()
        self._token, self._token_stamp = config.token, (0, 0)
        self._token_lock = threading.Lock()

    @classmethod
    def in_cluster(cls) -> KubeClient:
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        return cls(KubeConfig(server=f"https://{host}:{port}", token_file=str(SA_DIR / "token"),
                              ca_file=str(SA_DIR / "ca.crt")))

    def token(self) -> str:
        """The bearer token: the token file's content, read again whenever the file changes."""
        if not self.config.token_file:
            return self._token
        st = os.stat(self.config.token_file)
        stamp = (st.st_mtime_ns, st.st_ino)
        with self._token_lock:
            if stamp != self._token_stamp:
                self._token = Path(self.config.token_file).read_text().strip()
                self._token_stamp = stamp
            return self._token

    # ------------------------------------------------------------------------------ plumbing
    def _conn(self, timeout_s: float | None = None) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self._host, self._port, context=self._ctx,
                                           timeout=timeout_s or self._timeout_s)

    def _headers(self, content_type: str = "application/json") -> dict[str, str]:
        h = {"Accept": "application/json", "Content-Type": content_type}
        token = self.token()
        if token:
            h["Authorization"] = f"Bearer {token}"
        return h

    def request(self, method: str, path: str, body: Any = None, *, params: Mapping[str, Any] | None = None,
                content_type: str = "application/json") -> Any:
        """One call; returns the decoded JSON answer (retries once on a dropped keep-alive connection)."""
        if params:
            path = f"{path}?{urllib.parse.urlencode(params)}"
        data = None if body is None else json.dumps(body).encode()
        for attempt in (0, 1):
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = self._conn()
            try:
                conn.request(method, path, body=data, headers=self._headers(content_type))
                resp = conn.getresponse()
                raw = resp.read()
                break
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                self._local.conn = None
                if attempt:
                    raise KubeError(0, f"{method} {path}: {exc}") from None
        if resp.status >= 300:
            message = raw.decode(errors="replace")
            with contextlib.suppress(ValueError, AttributeError):
                message = json.loads(raw).get("message", message)
            raise (GoneError if resp.status == 410 else KubeError)(resp.status, message)
        return json.loads(raw) if raw else {}

    # ------------------------------------------------------------------------------ verbs
    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def list(self, path: str, **params: Any) -> tuple[list[dict[str, Any]], str]:
        """Every item and the list's resourceVersion (to watch from)."""
        got = self.request("GET", path, params=params or None)
        return got.get("items") or [], (got.get("metadata") or {}).get("resourceVersion", "")

    def create(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def patch(self, path: str, body: Any, *, kind: str = "merge") -> Any:
        """`kind`: merge (RFC 7386), strategic (strategic-merge) or json (RFC 6902)."""
        types = {"merge": "application/merge-patch+json", "strategic": "application/strategic-merge-patch+json",
                 "json": "application/json-patch+json"}
        return self.request("PATCH", path, body, content_type=types[kind])

    def delete(self, path: str, **params: Any) -> Any:
        return self.request("DELETE", path, params=params or None)

    def watch(self, path: str, resource_version: str, *, timeout_s: int = 300, bookmarks: bool = False,
              **params: Any) -> Iterator[tuple[str, dict[str, Any]]]:
        """(type, object) from a watch until the server ends it; BOOKMARKs (only a resourceVersion) are
        yielded when `bookmarks`, else skipped.

        Raises:
            GoneError: the resourceVersion expired (in the stream's ERROR event or the answer).
            KubeError: another error.
        """
        query = {"watch": "1", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                 "timeoutSeconds": str(timeout_s), **params}
        conn = self._conn(timeout_s + 30)
        try:
            conn.request("GET", f"{path}?{urllib.parse.urlencode(query)}", headers=self._headers())
            resp = conn.getresponse()
            if resp.status >= 300:
                raise (GoneError if resp.status == 410 else KubeError)(resp.status, resp.read().decode(errors="replace"))
            for line in resp:
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type", ""), event.get("object") or {}
                if kind == "ERROR":
                    code = int(obj.get("code", 0))
                    raise (GoneError if code == 410 else KubeError)(code, obj.get("message", ""))
                if kind != "BOOKMARK" or bookmarks:
                    yield kind, obj
        except (OSError, http.client.HTTPException) as exc:
            raise KubeError(0, f"watch {path}: {exc}") from None
        finally:
            conn.close()
