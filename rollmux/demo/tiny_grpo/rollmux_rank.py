"""Run one rank of the tiny GRPO job as its own process, pinned to CPUs, optionally under RollMux.

    python -m rollmux.demo.tiny_grpo.rollmux_rank --rank 0 --init-method tcp://127.0.0.1:29500 --cpus 1 \
        --iterations 20 --log-file job.jsonl [any JobConfig flag]

``job.py`` starts both ranks from one parent; the RollMux demo and benchmark instead start each rank
itself so each pool's processes can be pinned to that pool's core. With ``ROLLMUX_SIDECAR_SOCKET``
set (plus ``ROLLMUX_JOB`` / ``ROLLMUX_JOB_TOKEN``) the phases are gated through the shim:

* :func:`phase_hook` maps the job's loop onto the coordinator's on-policy order. The loop runs
  ``sync -> rollout -> train`` per iteration; the coordinator's order is
  ``Rollout(i) -> Train(i) -> Sync(i)``, so the job's sync at iteration ``i`` is ``Sync(i - 1)`` and
  the very first one (initial weights, identical on both sides) runs ungated.
* The policy returned by ``build_policy`` is registered with ``rollmux.register_state`` (offloaded
  between phases). The trainer's Adam state stays resident (``job.py`` builds it inside
  ``trainer_main``) unless ``--register-optimizer`` registers it as well.
* Relocation: before each gated phase the hook honours a pending regrouping directive
  (``rollmux.relocate``): the rollout rank at its iteration boundary (before its Rollout), the
  trainer following once the coordinator switched the job. Each rank checkpoints its policy and
  iteration counters to ``--checkpoint-dir``, re-attaches on its new node
  (``ROLLMUX_SIDECAR_SOCKET_TEMPLATE``) and reloads the checkpoint, checking it came back intact.
* Negative control of the sidecar's memory check (``--hold-mib N --hold-at train:1``): in that phase
  the rank allocates N MiB on its ``--device`` outside the state cache and keeps it until its next
  phase begins, so the node's release finds it still held. On a machine without a GPU,
  ``--gpu-memory-standin DIR`` makes the rank report those bytes in ``DIR/<pid>`` (the sidecar's
  stand-in for NVML, ``rollmux sidecar --gpu-memory-standin DIR``) instead of allocating them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

_counts = {"sync": 0, "rollout": 0, "train": 0}
_held: dict[str, Any] = {}  # what a relocation checkpoints: "policy" (the registered one), "path"
_leak: dict[str, Any] = {}  # the memory-check control: "at" (phase, n), "nbytes", "device", "standin", "tensor"
BOUNDARY_WAIT_S = 5.0
"""How long the rollout rank keeps acknowledging a directive while the trainer's Sync release is on its way."""


def _honour_relocation(name: str) -> None:
    """Move this rank to the job's new nodes if the coordinator directs it (see the module docstring)."""
    import rollmux

    if rollmux.relocation() is None or "policy" not in _held:
        return
    import torch

    policy, path = _held["policy"], _held["path"]

    def checkpoint() -> None:
        torch.save({"policy": policy.state_dict(), "counts": dict(_counts)}, path)

    def restore() -> None:
        saved = torch.load(path)
        policy.load_state_dict(saved["policy"])
        if saved["counts"] != _counts:
            raise RuntimeError(f"relocation checkpoint {path} holds counters {saved['counts']}, not {_counts}")

    rollmux.relocate(checkpoint=checkpoint, restore=restore, wait_s=BOUNDARY_WAIT_S if name == "rollout" else 0.0)


@contextlib.contextmanager
def _ungated() -> Iterator[None]:
    yield


def _set_held_bytes(nbytes: int) -> None:
    if _leak.get("standin"):
        from rollmux.sidecar.gpu import write_standin_bytes

        write_standin_bytes(_leak["standin"], os.getpid(), nbytes)


@contextlib.contextmanager
def _keeping_memory(gate: AbstractContextManager[Any], name: str, n: int) -> Iterator[None]:
    """Run the gated phase; in the ``--hold-at`` phase, leave ``--hold-mib`` allocated past its end."""
    if _leak.pop("tensor", None) is not None:  # the previous phase's: freed as this one begins
        if str(_leak["device"]).startswith("cuda"):
            import torch

            torch.cuda.empty_cache()  # back to the driver, so NVML sees it gone
        _set_held_bytes(0)
    with gate:
        yield
        if _leak.get("at") == (name, n):
            if _leak.get("standin"):  # no GPU: the bytes are only reported to the stand-in, never allocated
                _leak["tensor"] = _leak["nbytes"]
            else:
                import torch

                _leak["tensor"] = torch.ones(_leak["nbytes"], dtype=torch.uint8, device=_leak["device"])
            _set_held_bytes(_leak["nbytes"])


def phase_hook(name: str) -> AbstractContextManager[Any]:
    """The ``--phase-hook`` factory: this process's n-th call of `name` -> ``rollmux.phase``."""
    import rollmux

    n = _counts[name]
    if name != "sync" or n > 0:
        _honour_relocation(name)
    _counts[name] = n + 1
    if name == "sync":
        return _ungated() if n == 0 else _keeping_memory(rollmux.phase("sync", iteration=n - 1), name, n - 1)
    return _keeping_memory(rollmux.phase(name, iteration=n), name, n)


def _register_adam(torch: Any, rollmux: Any) -> None:
    """Every ``torch.optim.Adam`` this process builds registers itself (``trainer_main`` builds one)."""
    base = torch.optim.Adam

    class RegisteredAdam(base):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            rollmux.register_state(self, name="optimizer")

    torch.optim.Adam = RegisteredAdam


def _parser() -> argparse.ArgumentParser:
    from rollmux.demo.tiny_grpo.job import JobConfig

    p = argparse.ArgumentParser(prog="python -m rollmux.demo.tiny_grpo.rollmux_rank", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rank", type=int, required=True, help="0 = trainer, 1 = rollout worker")
    p.add_argument("--init-method", required=True, help="gloo rendezvous, e.g. tcp://127.0.0.1:29500")
    p.add_argument("--cpus", default="", help="comma-separated CPU ids to pin this process to ('' = no pinning)")
    p.add_argument("--checkpoint-dir", default="", help="where a relocation checkpoints this rank ('' = the temp dir)")
    p.add_argument("--hold-mib", type=int, default=0,
                   help="memory-check control: MiB this rank keeps allocated after its --hold-at phase")
    p.add_argument("--hold-at", default="", help="PHASE:ITERATION whose end leaves --hold-mib held (e.g. train:1)")
    p.add_argument("--gpu-memory-standin", default="",
                   help="no GPU: write the bytes held outside the state cache to DIR/<pid> (the sidecar's stand-in)")
    p.add_argument("--register-optimizer", action="store_true",
                   help="also register the trainer's Adam with rollmux.register_state, so its state is offloaded too")
    for f in dataclasses.fields(JobConfig):
        if f.name == "phase_hook":
            continue
        kind = {"int": int, "float": float}.get(str(f.type), str)
        p.add_argument("--" + f.name.replace("_", "-"), type=kind, default=f.default)
    return p


def main(argv: list[str] | None = None) -> int:
    """Pin, opt in (if configured), rendezvous, run this rank's loop, detach."""
    args = _parser().parse_args(argv)
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    import rollmux
    from rollmux.demo.tiny_grpo import job

    fields = {f.name for f in dataclasses.fields(job.JobConfig)}
    cfg = job.JobConfig(**{k: v for k, v in vars(args).items() if k in fields})
    if args.hold_mib and args.hold_at:
        phase, _, it = args.hold_at.partition(":")
        _leak.update(at=(phase, int(it or 0)), nbytes=args.hold_mib << 20, device=cfg.device,
                     standin=args.gpu_memory_standin)
    if args.gpu_memory_standin:
        _leak["standin"] = args.gpu_memory_standin
        _set_held_bytes(0)
    gated = rollmux.init(rank=args.rank)
    _held["path"] = os.path.join(args.checkpoint_dir or tempfile.gettempdir(),
                                 f"{cfg.job_id}-rank{args.rank}-{os.getpid()}.pt")
    if gated:
        cfg = dataclasses.replace(cfg, phase_hook=f"{__name__}:phase_hook")
        build = job.build_policy

        def build_and_register(c: job.JobConfig) -> Any:
            policy = build(c)
            rollmux.register_state(policy, name="policy")
            _held["policy"] = policy
            return policy

        job.build_policy = build_and_register  # the loops call it once, first thing
        if args.register_optimizer:
            _register_adam(torch, rollmux)
    torch.set_num_threads(cfg.threads)
    dist.init_process_group("gloo", init_method=args.init_method, rank=args.rank, world_size=2)
    hook = job.resolve_phase_hook(cfg.phase_hook)
    ok = False
    try:
        if args.rank == job.TRAINER:
            out = open(cfg.log_file, "a", encoding="utf-8") if cfg.log_file else sys.stdout  # noqa: SIM115
            try:
                job.trainer_main(cfg, hook, out)
            finally:
                if out is not sys.stdout:
                    out.close()
        else:
            job.rollout_main(cfg, hook)
        ok = True
    finally:
        rollmux.shutdown(job_done=ok and args.rank == job.TRAINER)
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
