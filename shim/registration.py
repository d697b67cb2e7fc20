"""Job registration through the node's sidecar: ``rollmux.shim.api.register``.

A job's driver sends its :class:`~rollmux.core.model.JobSpec` over the sidecar socket; the sidecar
relays ``RegisterJob`` to the coordinator with its node credential and answers with the job token,
so no secret ever sits in the job's configuration. The token lives only in memory: it is never
printed, logged or written to disk (``repr`` hides it); hand it to the job's other processes
through their environment (``ROLLMUX_JOB_TOKEN``) or ``rollmux.init(job_token=...)``. A process that
registered can call ``rollmux.init()`` without any token variable.
"""

from __future__ import annotations

import os
import secrets
import threading
from dataclasses import dataclass, field

from rollmux.core.model import JobSpec
from rollmux.shim import env
from rollmux.wire.errors import PermitWaitTimeoutError, ShimConfigError, SidecarError, SidecarUnreachableError


@dataclass(frozen=True, slots=True, kw_only=True)
class Registration:
    """A registered job: the one identity the shim and the adapters pass on (the token hidden from ``repr``).

    Made by :func:`register` (relayed through the sidecar) and by the adapters' registration, which also
    takes an identity an operator registered already (``ROLLMUX_JOB`` and ``ROLLMUX_JOB_TOKEN``).
    """

    job: str  # the registered job name
    token: str = field(repr=False)  # the job token: authenticates every permit call of the job
    deployment: str | None = None  # deployment mode the coordinator chose (None: not decided / default)
    relayed: bool = False  # True when this process registered the job through its node's sidecar

    def __post_init__(self) -> None:
        if not self.job or not self.token:
            raise ValueError("Registration needs a job name and a token")

    def __repr__(self) -> str:
        return (f"Registration(job={self.job!r}, token=<hidden>, deployment={self.deployment!r}, "
                f"relayed={self.relayed})")

    __str__ = __repr__


class JobRegistrationError(SidecarError):
    """The coordinator (through the sidecar) refused the registration; the message says why."""


_current: Registration | None = None
_lock = threading.Lock()


def current() -> Registration | None:
    """The registration this process made with :func:`register` (None when it made none)."""
    return _current


def _clear() -> None:
    """Forget this process's registration (tests)."""
    global _current
    with _lock:
        _current = None


def register(spec: JobSpec, *, socket: str | None = None, timeout_s: float = 30.0) -> Registration:
    """Register `spec` with the coordinator through the node's sidecar.

    Args:
        spec: the job (name, GPUs per pool, model size, tokens, batch, turns, SLO, ...).
        socket: the sidecar's socket (default ``ROLLMUX_SIDECAR_SOCKET``).
        timeout_s: longest wait for the answer (the sidecar retries a restarting coordinator).

    Returns:
        The registration; ``rollmux.init()`` in this process then uses it.

    Raises:
        ShimConfigError: no socket given and ``ROLLMUX_SIDECAR_SOCKET`` unset, or a bad argument.
        SidecarUnreachableError: no sidecar answers on the socket (the message names it).
        JobRegistrationError: the coordinator refused the spec (invalid, name taken, relaying disabled).
    """
    global _current
    if not isinstance(spec, JobSpec):
        raise ShimConfigError(f"register() takes a rollmux.core.model.JobSpec, not {type(spec).__name__}")
    if not (timeout_s > 0):
        raise ShimConfigError(f"timeout_s={timeout_s!r} is invalid: expected a positive number of seconds")
    path = socket if socket is not None else os.environ.get(env.SIDECAR_SOCKET, "")
    if not path:
        raise ShimConfigError(f"rollmux.register needs the node sidecar's socket: set {env.SIDECAR_SOCKET} "
                              "(the platform does this in job pods) or pass socket=")
    reg = _call(path, spec, timeout_s)
    with _lock:
        _current = reg
    return reg


def _unreachable(path: str, why: str) -> SidecarUnreachableError:
    return SidecarUnreachableError(
        f"cannot register through the node sidecar at {path}: {why}. Start it there (`rollmux sidecar "
        f"--coordinator HOST:PORT --pool rollout|train --socket {path}`), or unset {env.SIDECAR_SOCKET} to run "
        "without RollMux")


def _call(path: str, spec: JobSpec, timeout_s: float) -> Registration:
    from rollmux.wire.sidecar_client import SidecarClient

    if not os.path.exists(path):
        raise _unreachable(path, "no socket exists at that path")
    client = SidecarClient(path)
    try:
        job, token, deployment = client.register(spec, secrets.token_urlsafe(24), timeout_s=timeout_s)
    except SidecarUnreachableError as exc:
        raise _unreachable(path, str(exc) or "the sidecar did not answer") from None
    except PermitWaitTimeoutError:
        raise _unreachable(path, f"no answer within {timeout_s:g}s") from None
    except SidecarError as exc:
        raise JobRegistrationError(f"job {spec.name!r} was not registered: {exc}") from None
    finally:
        client.close()
    return Registration(job=job, token=token, deployment=deployment, relayed=True)


__all__ = ["Registration", "JobRegistrationError", "current", "register"]
