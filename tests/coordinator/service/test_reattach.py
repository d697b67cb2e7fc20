"""A self-registered job re-attaching after its relocation, against the real gRPC coordinator on a real Redis.

Its token lived in its old driver's Ray instance, so its restarted driver registers again through a
sidecar of one of its new nodes (a relayed `RegisterJob` naming the job): once, after the switch, with
the spec it registered with. Scenario as in test_relocation_live: A leaves g0, so C (relayed by r0)
is directed to g1 (nodes r1, t1).
"""

from __future__ import annotations

import asyncio
import json

import pytest

from rollmux.coordinator.service.redis_store import RedisStore
from rollmux.core.model import Phase, RelocationState
from rollmux.testing.chaos.procs import RedisProcess
from rollmux.wire.auth import sha256_hex
from rollmux.wire.client import CoordinatorClient
from rollmux.wire.errors import AlreadyExistsError, FailedPreconditionError, PermissionDeniedError

from .test_relocation_live import TB, four_nodes, run_phase, spec, wait_for


@pytest.mark.parametrize("coordinator", ["redis"], indirect=True)
def test_a_switched_self_registered_job_reattaches_once_through_a_node_of_its_new_group(
        client: CoordinatorClient, redis_server: RedisProcess) -> None:
    four_nodes(client)
    a, b = (client.register_job(spec(n, int(0.6 * TB))) for n in "AB")
    c = client.register_job(spec("C", 1 << 20), relay_node="r0")
    assert [j.status().group_id for j in (a, b, c)] == ["g0", "g1", "g0"]

    a.deregister()
    directive = wait_for("a directive", lambda: c.status().relocation)
    with pytest.raises(AlreadyExistsError, match="not switched"):  # pending: nothing to re-attach to yet
        client.register_job(spec("C", 1 << 20), relay_node="r1")
    for _ in range(3):  # iteration 0: Rollout, Train, Sync
        run_phase(c)
    assert c.ack_relocation(directive.epoch)[0].state is RelocationState.SWITCHED
    before = c.status()
    assert (before.group_id, before.next_phase, before.next_iteration) == ("g1", Phase.ROLLOUT, 1)

    with pytest.raises(AlreadyExistsError, match="not one of its nodes"):  # its old node
        client.register_job(spec("C", 1 << 20), relay_node="r0")
    with pytest.raises(AlreadyExistsError, match="operator token"):  # B was not self-registered
        client.register_job(spec("B", int(0.6 * TB)), relay_node="r1")
    with pytest.raises(FailedPreconditionError, match="train_state_bytes"):  # not the spec it registered
        client.register_job(spec("C", 2 << 20), relay_node="r1")

    again = client.register_job(spec("C", 1 << 20), relay_node="r1")
    assert again.token != c.token
    info = again.status()
    assert (info.group_id, info.next_phase, info.next_iteration) == ("g1", Phase.ROLLOUT, 1)
    with pytest.raises(PermissionDeniedError):  # the old token stopped working
        c.status()
    stored = asyncio.run(_load(redis_server.url))  # in the registration's commit: new token, one-shot mark
    assert json.loads(stored["job/C"])["token_sha256"] == sha256_hex(again.token)
    assert json.loads(stored["relocation/C"])["reattached_by"] == "r1"
    permit = again.acquire(Phase.ROLLOUT, 1, timeout_s=10)
    assert permit.nodes == ("r1",)
    again.release(permit, 0.0)

    with pytest.raises(AlreadyExistsError, match="already re-attached"):  # one-shot
        client.register_job(spec("C", 1 << 20), relay_node="t1")
    jobs = {j.job: j for j in client.cluster_state().jobs}
    assert jobs["C"].relayed_by == "r1"


async def _load(url: str) -> dict[str, str]:
    store = RedisStore(url)
    try:
        return await store.load()
    finally:
        await store.close()
