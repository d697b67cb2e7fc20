"""The driver side: register the job through the node sidecar before Ray starts, and hand the job's
identity to every Ray actor through the job's runtime environment.

``verl.trainer.main_ppo.run_ppo`` asks ``get_ppo_ray_runtime_env(config)`` for the runtime
environment right before its ``ray.init``; that call is our hook (``main_ppo`` runs as ``__main__``
under ``python -m``, so its own functions cannot be hooked). The wrapper fails fast when the sidecar
does not answer, derives the spec from the config, registers, and adds the non-secret variables to
the runtime environment (never the token: Ray logs runtime environments). Right after the next
``ray.init`` the token goes into that Ray instance's in-memory key-value store, where the TaskRunner
reads it. That ``ray.init`` also gets ``address="local"`` unless the user named a cluster: every job
keeps its own Ray instance.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from rollmux.adapters.common import AdapterError, registration
from rollmux.adapters.common import relocation as common_relocation
from rollmux.adapters.verl import memory, relocation, sync_backend
from rollmux.adapters.verl import spec as verl_spec
from rollmux.shim import env
from rollmux.shim.registration import Registration

log = logging.getLogger(__name__)

_identity: Registration | None = None


def identity() -> Registration | None:
    """The job registered by this process (None before registration or outside the driver)."""
    return _identity


def register_from_config(config: Any) -> Registration:
    """Refuse a trainer mode the adapter cannot gate, fail fast without a sidecar, then register the job
    described by the veRL `config` (once).

    Raises:
        AdapterError: an unsupported trainer mode, or no sidecar on the socket.
    """
    global _identity
    if _identity is not None:
        return _identity
    reason = verl_spec.unsupported(config)
    if reason is not None:
        raise AdapterError(f"RollMux veRL adapter: {reason}, or unset {env.SIDECAR_SOCKET} to run "
                           "this job without RollMux")
    registration.check_sidecar(registration.socket_path())
    restarted = relocation.restart_name(config)  # a relocated self-registered job: re-attach under its name
    name = restarted or registration.job_name(verl_spec.get(config, "trainer.project_name"),
                                              verl_spec.get(config, "trainer.experiment_name"))
    job = verl_spec.job_spec(config, name=name, slo=registration.slo(), phase_s=registration.phase_times())
    _identity = common_relocation.register(job, marker=relocation.marker_path(config), restarted=restarted is not None)
    plan = memory.sleep_plan(config)
    log.warning("RollMux: job %s registered (%s, %s trainer; %d train GPUs, %d rollout GPUs, %.4fB params; "
                "rollout engine %s sleeps at level %s between phases)", _identity.job, _identity.deployment,
                verl_spec.trainer_mode(config), job.n_train_gpus, job.n_rollout_gpus, job.model_params_b,
                plan.engine, plan.level)
    return _identity


def runtime_env_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Wraps ``get_ppo_ray_runtime_env(config)``: register, then extend the runtime environment."""
    runtime_env = wrapped(*args, **kwargs)
    config = args[0] if args else kwargs.get("config")
    if config is None:
        return runtime_env
    ident = register_from_config(config)
    sync_backend.choose_default(config)  # before veRL pickles the config for its TaskRunner
    memory.ensure_memory_freed(config)
    runtime_env.setdefault("env_vars", {}).update(registration.job_env(ident))
    runtime_env["env_vars"].update(relocation.driver_env(config, ident.job, ident.relayed))
    _hook_next_ray_init(ident)
    return runtime_env


def _hook_next_ray_init(ident: Registration) -> None:
    """On the next ``ray.init`` (one shot): keep the job on its own local Ray instance unless an address
    was given, then publish the job token in that instance's memory for the TaskRunner."""
    import ray

    original = ray.init

    def init(*args: Any, **kwargs: Any) -> Any:
        ray.init = original  # one shot
        if not args and not kwargs.get("address") and not os.environ.get("RAY_ADDRESS"):
            kwargs["address"] = "local"
        context = original(*args, **kwargs)
        registration.publish_token(ident)
        return context

    ray.init = init
