"""Opt-in, job registration through the node sidecar, and handing the job's identity to its Ray actors.

The opt-in is one variable, ``ROLLMUX_SIDECAR_SOCKET`` (``rollmux.sidecar.env``); :func:`opted_in`
reads it and imports nothing else, so an adapter module costs nothing when RollMux is off.

Registration happens once, in the process that starts the job (veRL's driver), before any worker
starts: :func:`check_sidecar` fails fast when the socket does not answer, then :func:`register` sends
the spec over the sidecar socket (the sidecar relays ``RegisterJob`` with its node credential) and
gets the job token back. An operator who registered the job already can instead set ``ROLLMUX_JOB``
and ``ROLLMUX_JOB_TOKEN``. The token then travels only in memory and in the job's Ray runtime
environment (:func:`job_env`, :func:`ray_init_with_env`), never in a log line or a file.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket as socketlib
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rollmux.adapters.common import env as adapter_env
from rollmux.adapters.common.api import AdapterError
from rollmux.sidecar import env

PROPAGATED = (env.SIDECAR_SOCKET, env.EVENT_LOG, env.PERMIT_TIMEOUT_S, adapter_env.ROLLOUT_SIDECAR_SOCKET,
              adapter_env.SLO)
"""Non-secret variables copied from the driver into every Ray actor of the job (when set)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobIdentity:
    """The registered job as the adapter passes it on (the token is a secret: never print it)."""

    job: str  # the registered name
    token: str = ""  # job token (never logged, never written to disk)
    deployment: str = "disaggregated"  # the coordinator's deployment mode for the job
    relayed: bool = False  # True when registered through the sidecar by this process

    def __repr__(self) -> str:  # keep the token out of any accidental print
        return f"JobIdentity(job={self.job!r}, deployment={self.deployment!r}, relayed={self.relayed})"


def opted_in() -> bool:
    """True when ``ROLLMUX_SIDECAR_SOCKET`` is set (and non-empty) in this process."""
    return bool(os.environ.get(env.SIDECAR_SOCKET))


def socket_path() -> str:
    """The sidecar socket of the opt-in (empty when not opted in)."""
    return os.environ.get(env.SIDECAR_SOCKET, "")


def check_sidecar(path: str, *, timeout_s: float = 5.0) -> None:
    """Fail fast unless a process accepts connections on the sidecar socket `path`.

    Raises:
        AdapterError: no socket file, or nothing accepts on it within `timeout_s`.
    """
    remedy = (f"start the node sidecar there (`rollmux sidecar --coordinator HOST:PORT --pool rollout|train "
              f"--socket {path}`) or unset {env.SIDECAR_SOCKET} to run without RollMux (a job never runs "
              "unscheduled on shared GPUs)")
    if not os.path.exists(path):
        raise AdapterError(f"RollMux is opted in ({env.SIDECAR_SOCKET}={path}) but no sidecar socket exists at "
                           f"that path: {remedy}")
    with socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        try:
            s.connect(path)
        except OSError as exc:
            raise AdapterError(f"RollMux is opted in ({env.SIDECAR_SOCKET}={path}) but the sidecar socket refused "
                               f"the connection ({exc.strerror or exc}): {remedy}") from None


_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


def job_name(*parts: str | None) -> str:
    """``ROLLMUX_JOB`` if set, else the non-empty `parts` joined with "-" plus a short unique suffix."""
    given = os.environ.get(env.JOB, "")
    if given:
        return given
    base = "-".join(_NAME_CHARS.sub("_", p).strip("_") for p in parts if p) or "job"
    return f"{base[:48]}-{uuid.uuid4().hex[:6]}"


def slo(default: float = 1.5) -> float:
    """``ROLLMUX_SLO`` as a float (default 1.5).

    Raises:
        AdapterError: the value is not a number >= 1.
    """
    raw = os.environ.get(adapter_env.SLO, "")
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value < 1.0:
        raise AdapterError(f"{adapter_env.SLO}={raw!r} is invalid: expected a number >= 1.0 (1.5 = at most 50% "
                           "slower than alone); unset it for the default 1.5")
    return value


def register(spec: Any, *, timeout_s: float = 30.0) -> JobIdentity:
    """Register the job for this process's opt-in and return its identity.

    With ``ROLLMUX_JOB_TOKEN`` set (an operator registered the job), that identity is used as is.
    Otherwise the spec goes over the sidecar socket and the sidecar relays ``RegisterJob``.

    Args:
        spec: the job's ``rollmux.model.JobSpec``.
        timeout_s: how long to wait for the relayed registration.

    Raises:
        AdapterError: this RollMux build cannot relay registrations and no token is set.
        SidecarError: the sidecar or the coordinator refused or could not be reached.
    """
    token = os.environ.get(env.JOB_TOKEN, "")
    if token:
        return JobIdentity(job=os.environ.get(env.JOB) or spec.name, token=token, relayed=False)
    from rollmux.sidecar import shim

    relay = getattr(shim, "register", None)
    if relay is None:
        raise AdapterError(f"RollMux is opted in ({env.SIDECAR_SOCKET}={socket_path()}) but this RollMux build "
                           f"cannot register jobs through the sidecar: set {env.JOB} and {env.JOB_TOKEN} from an "
                           "operator's registration, or upgrade rollmux")
    reg = relay(spec, socket=socket_path(), timeout_s=timeout_s)
    deployment = getattr(reg, "deployment", None)
    return JobIdentity(job=reg.job, token=reg.token, deployment=str(getattr(deployment, "value", deployment)
                                                                     or "disaggregated"), relayed=True)


def job_env(identity: JobIdentity, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables every Ray actor of the job needs: the opt-in, the job's name and token, the rest."""
    src = os.environ if environ is None else environ
    out = {k: src[k] for k in PROPAGATED if src.get(k)}
    out[env.JOB] = identity.job
    out[adapter_env.DEPLOYMENT] = identity.deployment
    if identity.token:
        out[env.JOB_TOKEN] = identity.token
    return out


def merge_runtime_env(runtime_env: Mapping[str, Any] | None, env_vars: Mapping[str, str]) -> dict[str, Any]:
    """`runtime_env` with `env_vars` added to its ``env_vars`` (ours win)."""
    merged = dict(runtime_env or {})
    merged["env_vars"] = {**dict(merged.get("env_vars") or {}), **env_vars}
    return merged


@contextlib.contextmanager
def ray_init_with_env(env_vars: Mapping[str, str]) -> Iterator[None]:
    """While open, every ``ray.init`` in this process adds `env_vars` to the job's runtime environment.

    The job-level runtime environment reaches every task and actor the job starts (Ray merges a
    child's own ``env_vars`` over it), which is how the token reaches workers without a file. The
    framework prints its ``ray.init`` arguments before the call; we add ours inside the call.
    """
    import ray

    original = ray.init

    def init(*args: Any, **kwargs: Any) -> Any:
        kwargs["runtime_env"] = merge_runtime_env(kwargs.get("runtime_env"), env_vars)
        return original(*args, **kwargs)

    ray.init = init  # type: ignore[assignment]
    try:
        yield
    finally:
        ray.init = original  # type: ignore[assignment]

