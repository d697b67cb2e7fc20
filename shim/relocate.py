"""``rollmux.relocation()`` and ``rollmux.relocate()``: honouring a regrouping directive in the job.

The coordinator may move a running job to another group when one leaves
(docs/concepts/relocation-and-migration.md). The directive reaches every rank of the job on its Attach stream (a rank that
attaches later gets it on attaching, while it is pending); the job honours it at an iteration
boundary, between its Sync and its next Rollout::

    if rollmux.relocation() is not None:
        rollmux.relocate(checkpoint=save, restore=load)   # outside any rollmux.phase

:func:`relocate` acknowledges the directive at the coordinator (through the sidecar). If the job is
at its boundary there, the coordinator switches the job's membership at once and answers with its
new nodes; this rank then runs ``checkpoint()``, detaches from its node's sidecar, attaches to the
sidecar of its new node (``ROLLMUX_SIDECAR_SOCKET_TEMPLATE``), and runs ``restore()``. Registered
state (``rollmux.register_state``) moves with the process: the next phase reloads it. Every rank of
the job calls it; the first to find the job at its boundary switches it, the others find it
switched and follow. A job that never calls it keeps its place when the directive expires.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

from rollmux.core.model import Relocation, RelocationState
from rollmux.shim import env
from rollmux.shim.runtime import Runtime
from rollmux.shim.transport import call
from rollmux.wire.errors import RankLeaseError, ShimConfigError

POLL_S = 0.05


def relocation() -> Relocation | None:
    """The job's relocation directive this rank has yet to act on, or None (always None when not opted in)."""
    from rollmux.shim import api as shim

    rt = shim._active()  # noqa: SLF001  (the shim's own package)
    d = None if rt is None else rt.relocation
    if d is None or rt is None or d.epoch in rt.relocated or d.state in (RelocationState.EXPIRED,
                                                                         RelocationState.CANCELLED):
        return None
    return d


def relocate(*, checkpoint: Callable[[], None] | None = None, restore: Callable[[], None] | None = None,
             wait_s: float = 0.0) -> bool:
    """Honour the pending directive now, at an iteration boundary (outside any phase).

    Args:
        checkpoint: called once the coordinator switched the job, before this rank leaves its node
            (state registered with ``rollmux.register_state`` is loaded while it runs).
        restore: called once this rank is attached on its new node (registered state loaded).
        wait_s: keep acknowledging this long while the coordinator has not yet seen the job reach
            its boundary (the rank that runs the Rollout passes a few seconds: the other rank's Sync
            release may still be on its way).

    Returns:
        True when this rank now runs on its new nodes; False when there is nothing to do, the job is
        not at a boundary yet (call again at the next one), or the directive expired or was cancelled
        (the job keeps its place).

    Raises:
        RankLeaseError: called inside a phase.
        ShimConfigError: this rank must move but ``ROLLMUX_SIDECAR_SOCKET_TEMPLATE`` is unset (start
            it on its new node from the checkpoint instead).
    """
    from rollmux.shim import api as shim

    rt = shim._active()  # noqa: SLF001
    d = relocation()
    if rt is None or d is None:
        return False  # not opted in (grpc never imported), or nothing to do
    if rt.current is not None:
        raise RankLeaseError(f"rollmux.relocate() inside phase {rt.current.phase!r}: call it at an iteration "
                             "boundary, outside rollmux.phase")
    deadline = time.monotonic() + wait_s
    while True:
        d = call(rt, "Relocate", rt.client.relocate, rt.rank_id, d.epoch, timeout_s=30.0)
        rt.relocation = d
        if d.state is not RelocationState.PENDING or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    if d.state is not RelocationState.SWITCHED:
        if d.state is not RelocationState.PENDING:
            rt.relocated.add(d.epoch)
        return False
    nodes = d.rollout_nodes if rt.pool == "rollout" else d.train_nodes
    target = rt.node_id if rt.node_id in nodes or not nodes else nodes[0]
    cache = rt.cache  # registered state is loaded while checkpoint and restore run, offloaded again after
    if cache is not None:
        cache.reload()
    if checkpoint is not None:
        checkpoint()
    old = rt.node_id
    if target != old:
        rt = _reattach(rt, target)
    rt.relocated.add(d.epoch)
    if restore is not None:
        restore()
    if cache is not None:
        cache.offload()
    _log(rt, d, old)
    return True


def _reattach(rt: object, node: str) -> object:
    """Detach from this node's sidecar and attach to `node`'s, keeping counters, state and directives."""
    from rollmux.shim import api as shim

    assert isinstance(rt, Runtime)
    template = os.environ.get(env.SIDECAR_SOCKET_TEMPLATE, "")
    if "{node}" not in template:
        raise ShimConfigError(f"job {rt.job!r} rank {rt.rank} was relocated to node {node!r}, but "
                              f"{env.SIDECAR_SOCKET_TEMPLATE} (a socket path with {{node}}) is not set, so it cannot "
                              "re-attach in place: set it, or start this rank on its new node from its checkpoint")
    cache, counters, known, done = rt.cache, dict(rt.counters), rt.relocation, set(rt.relocated)
    rt.cache = None  # moves with the process: not dropped by the detach below
    shim.shutdown(job_done=False)
    shim.init(socket=template.format(node=node), job=rt.job, job_token=rt.token, rank=rt.rank,
              permit_timeout_s=rt.timeout_s, event_log=rt.event_log, deployment=rt.deployment)
    new = shim._runtime  # noqa: SLF001
    assert new is not None
    new.cache, new.counters, new.relocation, new.relocated = cache, counters, known, done
    return new


def _log(rt: object, d: Relocation, old_node: str) -> None:
    assert isinstance(rt, Runtime)
    if not rt.event_log:
        return
    rec = {"job": rt.job, "rank": rt.rank, "event": "relocated", "epoch": d.epoch, "from_group": d.from_group,
           "to_group": d.to_group, "switched_epoch": d.switched_epoch, "from_node": old_node, "node": rt.node_id,
           "t": round(time.time(), 6)}
    fd = os.open(rt.event_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(rec) + "\n").encode())
    finally:
        os.close(fd)


__all__ = ["relocate", "relocation"]
