"""The permit hot path's shortcuts keep their guarantees: the raw Redis commit connection, the
callback-driven committer and the job-token cache."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from rollmux.coordinator.service.auth import Authenticator
from rollmux.coordinator.service.committer import Committer
from rollmux.coordinator.service.runtime.api import StaleFenceError, StoreUnavailableError
from rollmux.coordinator.service.store import EmbeddedStore
from rollmux.wire.auth import sha256_hex
from rollmux.wire.errors import NotReadyError, PermissionDeniedError


def test_token_cache_follows_rotation() -> None:
    auth = Authenticator(None)
    auth.verify_job("tok-a", "j", sha256_hex("tok-a"))
    auth.verify_job("tok-a", "j", sha256_hex("tok-a"))  # cached
    with pytest.raises(PermissionDeniedError):
        auth.verify_job("tok-b", "j", sha256_hex("tok-a"))  # another token, same job
    with pytest.raises(PermissionDeniedError):
        auth.verify_job("tok-a", "j", sha256_hex("tok-c"))  # re-registered: the cached token is void
    with pytest.raises(PermissionDeniedError):
        auth.verify_job("tok-a", "k", sha256_hex("tok-k"))  # a token only opens its own job
    auth.verify_job("tok-c", "j", sha256_hex("tok-c"))


def test_redis_commit_connection_recovers(redis_server) -> None:  # type: ignore[no-untyped-def]
    from rollmux.coordinator.service.redis_store import RedisStore

    async def go() -> dict[str, str]:
        store = RedisStore(redis_server.url, namespace="hot")
        try:
            fence = await store.acquire_leadership("a", 5.0)
            assert fence
            await store.commit({"k1": "1"}, fence=fence)
            # pipelined on one connection: applied in order
            await asyncio.gather(store.commit_future({"k2": "2", "k1": None}, fence=fence),
                                 store.commit_future({"k2": "3"}, fence=fence))
            await store._r.script_flush()  # the script cache is lost: that commit fails, the next reconnects
            with pytest.raises(StoreUnavailableError):
                await store.commit({"k3": "x"}, fence=fence)
            await store.commit({"k4": "4"}, fence=fence)
            with pytest.raises(StaleFenceError):
                await store.commit({"k5": "stale"}, fence=fence - 1)
            await store._r.client_kill_filter(_type="normal", skipme=True)  # the commit connection drops
            # sent on the dead connection (fails), or after the loss was seen (reconnects)
            with contextlib.suppress(StoreUnavailableError):
                await store.commit({"k6": "6"}, fence=fence)
            await store.commit({"k7": "7"}, fence=fence)
            return await store.load()
        finally:
            await store.close()

    records = asyncio.run(go())
    records.pop("k6", None)
    assert records == {"k2": "3", "k4": "4", "k7": "7"}


def test_committer_merges_orders_and_fails_queued_on_stop() -> None:
    async def go() -> None:
        store = EmbeddedStore()
        fence = await store.acquire_leadership("a", 5.0)
        failures: list[Exception] = []
        c = Committer(store, lambda: fence, failures.append)  # type: ignore[arg-type]
        c.start()
        await asyncio.gather(c.commit({"a": "1"}), c.commit({"a": "2", "b": "1"}), c.commit({}),
                             c.commit({"b": None}))
        assert store.records == {"a": "2"}
        assert c.batches == 1  # one loop pass, one batch
        store.available = False
        with pytest.raises(NotReadyError):
            await c.commit({"a": "3"})
        assert c.poisoned and len(failures) == 1
        with pytest.raises(NotReadyError):
            await c.commit({"a": "4"})
        store.available = True
        c.reset()
        await c.stop()
        with pytest.raises(NotReadyError):
            await c.commit({"a": "5"})
        c.start()
        await c.commit({"a": "6"})
        assert store.records == {"a": "6"}

    asyncio.run(go())


def test_gauge_pass_yields_to_the_event_loop_and_counts_every_node() -> None:
    """The once-a-second gauge pass walks every node, job and group; it must hand the loop back every
    GAUGE_SLICE items (one unbroken pass was an 11 ms stall at 2,000 jobs) and still count them all."""
    from rollmux.coordinator.service import core as core_mod
    from rollmux.core.model import Pool

    n_nodes = 3 * core_mod.GAUGE_SLICE + 1

    async def main() -> None:
        core = core_mod.Coordinator(EmbeddedStore())
        await core.start()
        assert await core.wait_ready(5.0)
        for i in range(n_nodes):
            await core.mutate(lambda rt, i=i: rt.register_node(
                node_id=f"t{i}", pool=Pool.TRAIN, gpu_type="H800", gpu_count=8, host_dram_bytes=10**12, nvml={}))
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        before = ticks
        await core._refresh_gauges(1.0)
        ran_meanwhile = ticks - before
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        states = {s.labels["state"]: s.value for m in core.metrics.nodes.collect() for s in m.samples}
        await core.stop()
        assert ran_meanwhile >= n_nodes // core_mod.GAUGE_SLICE, ran_meanwhile
        assert sum(states.values()) == n_nodes, states

    asyncio.run(main())
