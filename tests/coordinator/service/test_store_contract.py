"""One contract, two stores: the embedded store must behave like the Redis store."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import pytest

from rollmux.coordinator.service.runtime.api import StaleFenceError, StoreUnavailableError
from rollmux.coordinator.service.store import EmbeddedStore, Store

T = TypeVar("T")


@pytest.fixture(params=["embedded", "redis"])
def make_store(request: pytest.FixtureRequest) -> Iterator[Callable[[], Store]]:
    """A store factory (Redis connections belong to the event loop that opens them)."""
    if request.param == "embedded":
        yield EmbeddedStore
        return
    from rollmux.coordinator.service.redis_store import RedisStore

    r = request.getfixturevalue("redis_server")
    yield lambda: RedisStore(r.url, namespace="contract")


def run(make: Callable[[], Store], body: Callable[[Store], Awaitable[T]]) -> T:
    async def go() -> T:
        store = make()
        try:
            return await body(store)
        finally:
            await store.close()

    return asyncio.run(go())


def test_commit_sets_and_deletes_atomically(make_store: Callable[[], Store]) -> None:
    async def go(store: Store) -> dict[str, str]:
        fence = await store.acquire_leadership("a", 5.0)
        assert fence
        await store.commit({"job/x": "1", "job/y": "2"}, fence=fence)
        await store.commit({"job/x": None, "job/z": "3"}, fence=fence)
        return await store.load()

    assert run(make_store, go) == {"job/y": "2", "job/z": "3"}


def test_stale_fence_is_refused_and_writes_nothing(make_store: Callable[[], Store]) -> None:
    async def go(store: Store) -> dict[str, str]:
        f1 = await store.acquire_leadership("a", 5.0)
        await store.commit({"k": "old"}, fence=f1)
        f2 = await store.acquire_leadership("a", 5.0)  # the same owner restarted: new fence
        assert f2 > f1
        with pytest.raises(StaleFenceError):
            await store.commit({"k": "stale", "other": "x"}, fence=f1)
        assert not await store.renew_leadership("a", f1, 5.0)
        assert await store.renew_leadership("a", f2, 5.0)
        return await store.load()

    assert run(make_store, go) == {"k": "old"}


def test_another_owner_waits_for_the_lease_to_lapse(make_store: Callable[[], Store]) -> None:
    async def go(store: Store) -> None:
        assert await store.acquire_leadership("a", 0.3)
        assert await store.acquire_leadership("b", 0.3) is None
        await asyncio.sleep(0.4)
        fb = await store.acquire_leadership("b", 5.0)
        assert fb
        assert await store.acquire_leadership("a", 5.0) is None

    run(make_store, go)


def test_embedded_outage_raises_unavailable() -> None:
    s = EmbeddedStore()
    s.available = False
    with pytest.raises(StoreUnavailableError):
        asyncio.run(s.load())
