"""Driver-side wrappers: the job's own Ray instance, registration, permit gates and span gating.

All of them run in the ROLL driver process (the one that builds the pipeline and calls ``run()``):

* :func:`wrap_init` (``roll.distributed.scheduler.initialize.init``): a single-node job gets a
  private local Ray instance instead of ROLL's ``ray start --head`` on a fixed port (which joins any
  cluster on the host, where fixed actor names and the "roll" namespace collide between jobs);
* :func:`wrap_pipeline_init` (``RLVRPipeline.__init__`` / ``AgenticPipeline.__init__``): checks the
  sidecar and registers the job before ROLL builds a worker, then starts the job's gate actors;
* :func:`wrap_get_tracer` (the pipeline modules' ``get_tracer``): the "driver" tracer that ``run()``
  opens its phase spans with gates each span on the job's permits;
* :func:`wrap_run` (``run``): binds the job's session to the loop, releases and detaches at the end.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rollmux.adapters.common import env as adapter_env
from rollmux.adapters.common.api import AdapterError
from rollmux.adapters.common.registration import (
    PROPAGATED,
    check_sidecar,
    job_env,
    publish_token,
    socket_path,
)
from rollmux.adapters.common.relocation import register
from rollmux.adapters.roll import relocation
from rollmux.adapters.roll.gate import Gates, start_gates
from rollmux.adapters.roll.phases import SPAN_PHASES, STEP_SPAN, Action, PhaseTracker
from rollmux.adapters.roll.spec import job_spec
from rollmux.shim import env
from rollmux.shim.registration import Registration

log = logging.getLogger(__name__)
_SESSION_ATTR = "_rollmux_session"
_active: contextvars.ContextVar[Session | None] = contextvars.ContextVar("rollmux_roll_session", default=None)
REMEDY = f"unset {env.SIDECAR_SOCKET} to run this job without RollMux"


@dataclass(slots=True, kw_only=True)
class Session:
    """One opted-in pipeline: its registration, gates and span -> phase tracker."""

    identity: Registration
    gates: Gates | None = None
    tracker: PhaseTracker = field(default_factory=PhaseTracker)
    gate_log: list[tuple[str, str, int, float]] = field(default_factory=list)
    """Every permit open/close the driver ran: (action, phase, iteration, seconds waited)."""
    progress_log: list[tuple[int, int, str | None]] = field(default_factory=list)
    """Every rollout progress report the sidecar answered: (finished, total, phase the gate held)."""
    relocator: relocation.Relocator | None = None  # relocation directives (relocation.py)

    def begin(self, span: str, attributes: Any) -> None:
        step = attributes.get("global_step") if span == STEP_SPAN and isinstance(attributes, dict) else None
        self._run(self.tracker.begin(span, step))

    def end(self, span: str) -> None:
        steps = self.tracker.end(span)
        r = self.relocator
        if r is not None and r.pending is not None and SPAN_PHASES.get(span) == "sync" and self.gates is not None:
            cut = next((i for i, s in enumerate(steps) if s.action is Action.OPEN), len(steps))
            self._run(steps[:cut])  # Sync released; the next Rollout not asked for: the iteration boundary
            nxt = steps[cut].iteration if cut < len(steps) else -1
            steps = steps[cut:]
            relocation.at_boundary(r, self.gates, nxt)  # may stop run() (JobRelocated)
        self._run(steps)

    def finish(self, *, job_done: bool) -> None:
        try:
            self._run(self.tracker.finish())
        finally:
            if self.gates is not None:
                gates, self.gates = self.gates, None
                self.gate_log = gates.log
                gates.shutdown(job_done=job_done)
                self.progress_log = gates.progress

    def _run(self, steps: list[Any]) -> None:
        if steps and self.gates is not None:
            self.gates.run(steps)
            r = self.relocator
            if r is not None and r.resumed is not None:
                for s in steps:
                    if s.action is Action.OPEN and s.phase == "rollout":
                        relocation.resumed(r, s.iteration)


def permit_log(pipeline: Any) -> list[tuple[str, str, int, float]] | None:
    """The permit opens/closes an opted-in pipeline's driver ran, with the seconds each took
    (the gate round trip, plus any wait for another job's phase); None when not opted in."""
    session: Session | None = getattr(pipeline, _SESSION_ATTR, None)
    if session is None:
        return None
    return list(session.gates.log if session.gates is not None else session.gate_log)


def progress_log(pipeline: Any) -> list[tuple[int, int, str | None]] | None:
    """The rollout progress an opted-in pipeline reported, once its ``run()`` returned: (finished, total,
    the phase whose permit was held then) for every report the sidecar answered; None when not opted in."""
    session: Session | None = getattr(pipeline, _SESSION_ATTR, None)
    return None if session is None else list(session.progress_log)


# ------------------------------------------------------------------------------------------ Ray


def worker_env() -> dict[str, str]:
    """Non-secret variables every Ray worker of the job gets (the opt-in, so the worker-side hooks
    load there too). The job token goes only to the gate actors, as an argument."""
    return {k: os.environ[k] for k in (env.SIDECAR_SOCKET, *PROPAGATED) if os.environ.get(k)}


def wrap_init(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``initialize.init()``: give a single-node job its own local Ray instance."""
    import ray
    from roll.distributed.scheduler import driver_utils, initialize
    from roll.platforms import current_platform
    from roll.utils.constants import RAY_NAMESPACE

    check_sidecar(socket_path())  # before any Ray process starts
    if ray.is_initialized():
        return wrapped(*args, **kwargs)
    if driver_utils.get_driver_world_size() > 1:
        # Multi-node: ROLL starts its own head at MASTER_ADDR:MASTER_PORT; MULTI_TENANT=1 makes it look
        # for a running cluster only there, so each job needs its own MASTER_PORT / DASHBOARD_PORT.
        os.environ.setdefault("MULTI_TENANT", "1")
        return wrapped(*args, **kwargs)
    key, count = current_platform.ray_device_key, int(current_platform.device_count() or 0)
    resources = {"num_gpus": count} if key == "GPU" else ({"resources": {key: count}} if key != "CPU" else {})
    ray.init(address="local", namespace=RAY_NAMESPACE, include_dashboard=False, log_to_driver=True,
             runtime_env={"env_vars": {**current_platform.get_custom_env_vars(), **worker_env()}}, **resources)
    saved = initialize.start_ray_cluster
    initialize.start_ray_cluster = lambda: False
    try:
        return wrapped(*args, **kwargs)
    finally:
        initialize.start_ray_cluster = saved


# ------------------------------------------------------------------------------------- pipeline


def _partial_gpu(cfg: Any) -> bool:
    """Whether AgenticPipeline would run partial-GPU mode: its ``partial_gpu_mode`` flag (default True)
    only derives it, and it is on when actor_train's devices are a proper subset of actor_infer's."""
    train = set(getattr(getattr(cfg, "actor_train", None), "device_mapping", None) or [])
    infer = set(getattr(getattr(cfg, "actor_infer", None), "device_mapping", None) or [])
    return bool(train) and train < infer


def _check_config(cfg: Any) -> None:
    if getattr(cfg, "async_pipeline", False) or float(getattr(cfg, "async_generation_ratio", 0) or 0) > 0:
        raise AdapterError("RollMux ROLL adapter: async_generation_ratio > 0 overlaps rollout with training, "
                           "which phase multiplexing cannot gate; set async_generation_ratio: 0 or " + REMEDY)
    if getattr(cfg, "partial_gpu_mode", False) and _partial_gpu(cfg):
        raise AdapterError("RollMux ROLL adapter: partial_gpu_mode shrinks and expands actor_infer inside a "
                           "step, which the adapter does not gate yet; disable it or " + REMEDY)


def _node_of(cluster: Any) -> str | None:
    """Ray node id of a ROLL cluster's first worker (None when it has none)."""
    import ray

    workers = getattr(cluster, "workers", None) or []
    if not workers:
        return None
    return str(ray.get(workers[0].__ray_call__.remote(lambda _self: ray.get_runtime_context().get_node_id())))


def _worker_configs(cfg: Any) -> list[Any]:
    """Every cluster's worker config of a pipeline config (actor_train, actor_infer, reference, critic,
    rewards, env managers: whatever carries ``system_envs``)."""
    out = []
    for value in vars(cfg).values():
        for item in value.values() if isinstance(value, dict) else (value,):
            if isinstance(getattr(item, "system_envs", None), dict) and hasattr(item, "device_mapping"):
                out.append(item)
    return out


def _pass_job_to_workers(cfg: Any, identity: Registration) -> None:
    """Before ROLL builds its clusters: the job's name (and the non-secret variables) go to every worker
    through its cluster's ``system_envs`` (ROLL's per-worker runtime environment), the token into the
    job's Ray instance (``publish_token``), so each GPU worker can attach as a rank on its own node.
    The sidecar socket never goes there: each worker's raylet names its own node's."""
    variables = job_env(identity)
    for worker in _worker_configs(cfg):
        worker.system_envs.update(variables)
    publish_token(identity)


def wrap_pipeline_init(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> Any:
    """Register before ROLL builds any worker; start the gates once the clusters exist."""
    if getattr(instance, _SESSION_ATTR, None) is not None:  # a subclass's __init__ already did
        return wrapped(*args, **kwargs)
    cfg = kwargs.get("pipeline_config", args[0] if args else None)
    _check_config(cfg)
    check_sidecar(socket_path())
    rollout_socket = os.environ.get(adapter_env.ROLLOUT_SIDECAR_SOCKET) or socket_path()
    if rollout_socket != socket_path():
        check_sidecar(rollout_socket)
    restarted = relocation.restart_name(cfg)  # a relocated self-registered job: re-attach under its name
    identity = register(job_spec(cfg, name=restarted), marker=relocation.marker_path(cfg),
                        restarted=restarted is not None)
    session = Session(identity=identity)
    object.__setattr__(instance, _SESSION_ATTR, session)
    log.info("rollmux: ROLL job %s registered (deployment %s)", session.identity.job, session.identity.deployment)
    session.relocator = relocation.prepare(cfg, session.identity.job, session.identity.relayed, session.tracker)
    _pass_job_to_workers(cfg, identity)
    result = wrapped(*args, **kwargs)
    relocation.check_resumed(session.relocator, instance)
    relocation.resume_rollout(session.relocator, instance)  # agentic: before the first rollout
    timeout = os.environ.get(env.PERMIT_TIMEOUT_S)
    session.gates = start_gates(
        # a gate attaches on its own node's sidecar; a rollout socket the job names is a single-host layout's
        sockets={"rollout": rollout_socket if rollout_socket != socket_path() else None}, job=session.identity.job,
        token=session.identity.token, permit_timeout_s=float(timeout) if timeout else None,
        deployment=session.identity.deployment, env_vars=job_env(identity),
        node_ids={"rollout": _node_of(getattr(instance, "actor_infer", None)),
                  "train": _node_of(getattr(instance, "actor_train", None))})
    return result


def wrap_do_checkpoint(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> Any:
    """``do_checkpoint`` at a step's end: a pending relocation directive is honoured here (relocation.py)."""
    session: Session | None = getattr(instance, _SESSION_ATTR, None)
    if session is None or session.gates is None or session.relocator is None or _active.get() is not session:
        return wrapped(*args, **kwargs)
    return relocation.at_checkpoint(session.relocator, session.gates, wrapped, instance, args, kwargs)


def check_spans(run: Callable[..., Any]) -> None:
    """Version guard on the loop itself: every span the adapter gates on must be opened by `run`.

    Raises:
        AdapterError: a span name is missing (ROLL changed its loop; the gates would silently not fire).
    """
    try:
        source = inspect.getsource(run)
    except (OSError, TypeError):
        return  # no source (zipped install): the version check alone guards
    gated = [s for s in SPAN_PHASES if f'"{s}"' in source]
    phases = {SPAN_PHASES[s] for s in gated}
    if STEP_SPAN not in source or phases != {"sync", "rollout", "train"}:
        raise AdapterError(f"RollMux ROLL adapter: {run.__qualname__} no longer opens the spans the adapter gates on "
                           f"(found {gated or 'none'} and needs pipeline_step, model_update, a rollout span and a "
                           "train span); this ROLL version is not supported: install the commit named in "
                           "rollmux.adapters.roll.SUPPORTED_COMMITS or " + REMEDY)


def wrap_run(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``run()``: gate its spans through the job's session; release and detach when it returns."""
    session: Session | None = getattr(instance, _SESSION_ATTR, None)
    if session is None or _active.get() is not None:
        return wrapped(*args, **kwargs)
    check_spans(type(instance).run)
    token = _active.set(session)
    done = False
    try:
        result = wrapped(*args, **kwargs)
        done = True
        return result
    finally:
        _active.reset(token)
        session.finish(job_done=done)


# --------------------------------------------------------------------------------------- tracer


class _GatedSpan:
    """``tracer.start_as_current_span(name)`` whose entry waits for the phase's permit."""

    __slots__ = ("_inner", "_session", "_name", "_attributes")

    def __init__(self, inner: Any, session: Session, name: str, attributes: Any) -> None:
        self._inner, self._session, self._name, self._attributes = inner, session, name, attributes

    def __enter__(self) -> Any:
        self._session.begin(self._name, self._attributes)
        return self._inner.__enter__()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        suppressed = self._inner.__exit__(exc_type, exc, tb)
        if exc_type is None:
            self._session.end(self._name)
        return suppressed


class _GatedTracer:
    """An OpenTelemetry tracer whose ``start_as_current_span`` gates the pipeline's phase spans."""

    def __init__(self, inner: Any, session: Session) -> None:
        self._inner, self._session = inner, session

    def start_as_current_span(self, name: str, *args: Any, **kwargs: Any) -> Any:
        attributes = kwargs.get("attributes", args[1] if len(args) > 1 else None)
        return _GatedSpan(self._inner.start_as_current_span(name, *args, **kwargs), self._session, name, attributes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def wrap_get_tracer(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
    """The pipeline module's ``get_tracer``: the "driver" tracer of an opted-in ``run()`` is gated."""
    tracer = wrapped(*args, **kwargs)
    name = kwargs.get("name", args[0] if args else "roll")
    session = _active.get()
    return _GatedTracer(tracer, session) if session is not None and name == "driver" else tracer
