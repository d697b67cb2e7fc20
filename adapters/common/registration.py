"""Opt-in, job registration through the node sidecar, and handing the job's identity to its Ray actors.

The opt-in is one variable, ``ROLLMUX_SIDECAR_SOCKET`` (``rollmux.shim.env``); :func:`opted_in`
reads it and imports nothing else, so an adapter module costs nothing when RollMux is off.

Registration happens once, in the process that starts the job (veRL's driver), before any worker
starts: :func:`check_sidecar` fails fast when the socket does not answer, then :func:`register` sends
the spec over the sidecar socket (the sidecar relays ``RegisterJob`` with its node credential) and
gets the job token back. An operator who registered the job already can instead set ``ROLLMUX_JOB``
and ``ROLLMUX_JOB_TOKEN`` (optional).

The job's Ray actors get the non-secret variables through the job's runtime environment
(:func:`job_env`, :func:`ray_init_with_env`). The token does not go there: Ray's runtime-env agent
writes every runtime environment, ``env_vars`` included, to its log file in the session folder. It
goes instead into the job's own Ray GCS key-value store, which lives in the GCS process's memory
(:func:`publish_token` in the driver after ``ray.init``, :func:`job_token` in the actor that
attaches ranks), so it is never printed, logged or written to disk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import socket as socketlib
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from rollmux.adapters.common import env as adapter_env
from rollmux.adapters.common.api import AdapterError
from rollmux.core.model import MAX_PHASE_S
from rollmux.shim import env
from rollmux.shim.registration import Registration

PROPAGATED = (env.EVENT_LOG, env.PERMIT_TIMEOUT_S, adapter_env.ROLLOUT_SIDECAR_SOCKET, adapter_env.SLO)
"""Non-secret variables copied from the driver into every Ray actor of the job (when set). Never
``ROLLMUX_SIDECAR_SOCKET``: each node's processes name their own node's sidecar (the platform sets it
in every pod or raylet of the node); a runtime environment would send every worker to the driver's."""

TOKEN_KV_NAMESPACE = "rollmux"
"""Namespace of the job token in the job's Ray GCS key-value store (key: ``job-token/<job>``)."""


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


def phase_times() -> tuple[float | None, float | None]:
    """``ROLLMUX_PHASE_S`` as (rollout, train) seconds; (None, None) when unset (the coordinator estimates).

    Raises:
        AdapterError: not two numbers > 0 and <= one day, separated by a comma.
    """
    raw = os.environ.get(adapter_env.PHASE_S, "").strip()
    if not raw:
        return None, None
    parts = raw.split(",")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != 2 or not all(0.0 < v <= MAX_PHASE_S for v in values):
        raise AdapterError(f"{adapter_env.PHASE_S}={raw!r} is invalid: expected ROLLOUT,TRAIN solo seconds, two numbers "
                           f"> 0 and <= {MAX_PHASE_S:g} (e.g. 40,95); unset it to let the coordinator estimate them")
    return values[0], values[1]


def register(spec: Any, *, timeout_s: float = 30.0) -> Registration:
    """Register the job for this process's opt-in and return its identity (its deployment mode filled in).

    By default the spec goes over the sidecar socket and the sidecar relays ``RegisterJob`` with its
    node credential (``rollmux.register``); the job needs no secret. Optionally, when an operator
    registered the job already and set ``ROLLMUX_JOB_TOKEN`` (and ``ROLLMUX_JOB``), that identity is
    used as is and nothing is sent.

    Args:
        spec: the job's ``rollmux.core.model.JobSpec``.
        timeout_s: how long to wait for the relayed registration.

    Raises:
        SidecarError: the sidecar could not be reached, or the coordinator refused the spec (the
            message says why, e.g. relayed registrations turned off).
    """
    token = os.environ.get(env.JOB_TOKEN, "")
    if token:
        return Registration(job=os.environ.get(env.JOB) or spec.name, token=token, relayed=False,
                            deployment=os.environ.get(env.DEPLOYMENT) or (
                                "disaggregated" if spec.deployment is None else spec.deployment.value))
    from rollmux.shim.registration import register as relay

    reg = relay(spec, socket=socket_path(), timeout_s=timeout_s)
    fixed = None if spec.deployment is None else spec.deployment.value
    return dataclasses.replace(reg, deployment=reg.deployment or fixed or "disaggregated")


def job_env(identity: Registration, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables every Ray actor of the job needs: the opt-in, the job's name, the rest. Never the
    token (Ray logs runtime environments): see :func:`publish_token`."""
    src = os.environ if environ is None else environ
    out = {k: src[k] for k in PROPAGATED if src.get(k)}
    out[env.JOB] = identity.job
    out[env.DEPLOYMENT] = identity.deployment or "disaggregated"
    return out


def _token_key(job: str) -> bytes:
    return f"job-token/{job}".encode()


def publish_token(identity: Registration) -> None:
    """Put the job token into the connected Ray instance's GCS key-value store (memory only). Call it in
    the driver right after ``ray.init``; :func:`job_token` reads it in the job's actors."""
    from ray.experimental import internal_kv

    if identity.token:
        internal_kv._internal_kv_put(_token_key(identity.job), identity.token.encode(), overwrite=True,
                                     namespace=TOKEN_KV_NAMESPACE)


def job_token(job: str) -> str:
    """The job token in a Ray actor of the job: ``ROLLMUX_JOB_TOKEN`` when an operator set it in this
    process's environment, else what the driver published (:func:`publish_token`).

    Raises:
        AdapterError: neither is there (the driver did not register the job in this Ray instance).
    """
    given = os.environ.get(env.JOB_TOKEN, "")
    if given:
        return given
    from ray.experimental import internal_kv

    raw = internal_kv._internal_kv_get(_token_key(job), namespace=TOKEN_KV_NAMESPACE) \
        if internal_kv._internal_kv_initialized() else None
    if not raw:
        raise AdapterError(f"RollMux: no job token for job {job!r} in this Ray instance: the job's driver registers "
                           "it (through the node sidecar) before any worker starts; run the job through its "
                           f"framework's entry point, or unset {env.SIDECAR_SOCKET} to run without RollMux")
    return bytes(raw).decode()


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

