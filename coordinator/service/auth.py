"""Tokens: job tokens issued at registration, node and operator tokens derived from a secret.

- Job token: random, returned once by RegisterJob; the coordinator keeps only its SHA-256. Every
  job call must carry it, and it only opens its own job (another job's token -> PERMISSION_DENIED).
- Node token: HMAC-SHA256(bootstrap secret, "node:<node_id>"), so a sidecar given the secret (a
  Kubernetes Secret) derives its own token and a node cannot impersonate another.
- Operator token: HMAC-SHA256(bootstrap secret, "operator"); also required for RegisterJob.
Without a bootstrap secret node and operator calls are open (single-machine use); job tokens are
always enforced. Tokens travel as gRPC metadata ``authorization: Bearer <token>``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable

from rollmux.coordinator.service.api import PermissionDeniedError, UnauthenticatedError

METADATA_KEY = "authorization"
_NO_JOB = "0" * 64  # stands in for the token hash of a job that does not exist (matches no token)


def read_secret(path: str | None) -> str | None:
    """The bootstrap secret: from `path`, else the file `ROLLMUX_SECRET_FILE` names, else
    `ROLLMUX_BOOTSTRAP_SECRET`; None when none is configured.

    Raises:
        ValueError: the file cannot be read or holds only whitespace (the message names it).
    """
    import os

    from rollmux.coordinator.service import env

    path = path or os.environ.get(env.SECRET_FILE) or None
    if path is None:
        return os.environ.get(env.BOOTSTRAP_SECRET) or None
    try:
        with open(path) as f:
            secret = f.read().strip()
    except OSError as exc:
        raise ValueError(f"cannot read the bootstrap secret file {path}: {exc.strerror}") from None
    if not secret:
        raise ValueError(f"the bootstrap secret file {path} is empty: put the cluster's secret in it")
    return secret


def new_token() -> str:
    return secrets.token_urlsafe(32)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def derive_token(secret: str, subject: str) -> str:
    """HMAC-SHA256(secret, subject) as hex; subjects are ``node:<id>`` and ``operator``."""
    return hmac.new(secret.encode(), subject.encode(), hashlib.sha256).hexdigest()


def node_token(secret: str, node_id: str) -> str:
    return derive_token(secret, f"node:{node_id}")


def operator_token(secret: str) -> str:
    return derive_token(secret, "operator")


def bearer(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The bearer token in gRPC invocation metadata, if any."""
    for key, value in metadata or ():
        if key == METADATA_KEY:
            text = value.decode() if isinstance(value, bytes) else value
            return text[7:] if text.startswith("Bearer ") else text
    return None


class Authenticator:
    """Checks the token of each call against its subject.

    Args:
        secret: the bootstrap secret; None or "" disables node and operator checks.
    """

    def __init__(self, secret: str | None) -> None:
        self._secret = secret or ""
        self._verified: dict[str, tuple[str, bytes]] = {}  # job -> (token hash, token) last verified

    def verify_job(self, token: str | None, job: str, token_sha256: str | None) -> None:
        """`check_job` that remembers each job's last verified token, so repeat calls skip the hash.

        A hit needs the same stored hash (a re-registration rotates it) and a constant-time match
        of the token itself. `token_sha256` None means no such job: refused exactly like a wrong token.
        """
        if token_sha256 is None:
            self.check_job(token, job, _NO_JOB)
            return
        hit = self._verified.get(job)
        if hit is not None and token and hit[0] == token_sha256 and hmac.compare_digest(hit[1], token.encode()):
            return
        self.check_job(token, job, token_sha256)
        if len(self._verified) >= 100_000:
            self._verified.clear()
        self._verified[job] = (token_sha256, token.encode())  # type: ignore[union-attr]

    @property
    def enabled(self) -> bool:
        return bool(self._secret)

    def _derived(self, token: str | None, subject: str, who: str) -> None:
        if not self._secret:
            return
        if not token:
            raise UnauthenticatedError(f"{who} call without a token: send 'authorization: Bearer <token>'")
        if not hmac.compare_digest(token, derive_token(self._secret, subject)):
            raise PermissionDeniedError(f"token refused for {who}: derive it from the coordinator's bootstrap secret")

    def check_node(self, token: str | None, node_id: str) -> None:
        self._derived(token, f"node:{node_id}", f"node {node_id!r}")

    def check_operator(self, token: str | None) -> None:
        self._derived(token, "operator", "operator")

    @staticmethod
    def check_job(token: str | None, job: str, token_sha256: str) -> None:
        if not token:
            raise UnauthenticatedError(f"call for job {job!r} without its job token: send the token "
                                       "RegisterJob returned as 'authorization: Bearer <token>'")
        if not hmac.compare_digest(sha256_hex(token), token_sha256):
            raise PermissionDeniedError(f"the token is not the token of a registered job {job!r}: a job may only "
                                        "touch its own permits (register the job first and send the token "
                                        "RegisterJob returned)")
