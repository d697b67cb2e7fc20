"""Tokens: job tokens issued at registration, node and operator tokens derived from a secret.

- Job token: random, returned once by RegisterJob; the coordinator keeps only its SHA-256. Every
  job call must carry it, and it only opens its own job (another job's token -> PERMISSION_DENIED).
- Node token: HMAC-SHA256(bootstrap secret, "node:<node_id>"), so a sidecar given the secret (a
  Kubernetes Secret) derives its own token and a node cannot impersonate another.
- Operator token: HMAC-SHA256(bootstrap secret, "operator"); also required for RegisterJob.
Without a bootstrap secret node and operator calls are open (single-machine use); job tokens are
always enforced. Tokens travel as gRPC metadata ``authorization: Bearer <token>``. The coordinator
checks them (`rollmux.coordinator.service.auth.Authenticator`); this module is what both ends share.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable

METADATA_KEY = "authorization"


def read_secret(path: str | None) -> str | None:
    """The bootstrap secret: from `path`, else the file `ROLLMUX_SECRET_FILE` names, else
    `ROLLMUX_BOOTSTRAP_SECRET`; None when none is configured.

    Raises:
        ValueError: the file cannot be read or holds only whitespace (the message names it).
    """
    import os

    from rollmux.wire import env

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


def bearer_metadata(token: str) -> tuple[str, str]:
    """The metadata entry that carries `token`."""
    return (METADATA_KEY, f"Bearer {token}")


def bearer(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The bearer token in gRPC invocation metadata, if any."""
    for key, value in metadata or ():
        if key == METADATA_KEY:
            text = value.decode() if isinstance(value, bytes) else value
            return text[7:] if text.startswith("Bearer ") else text
    return None
