"""The coordinator's token checks (`Authenticator`); the tokens themselves are `rollmux.wire.auth`'s."""

from __future__ import annotations

import hmac

from rollmux.wire.auth import derive_token, sha256_hex
from rollmux.wire.errors import PermissionDeniedError, UnauthenticatedError

_NO_JOB = "0" * 64  # stands in for the token hash of a job that does not exist (matches no token)


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
