"""The state store contract and the embedded (in-process) store.

A store keeps the coordinator's records (key -> JSON text, see `records.py`) and a leadership
lease. Writes come as batches that are applied atomically or not at all, guarded by a fence: the
number handed out when the writer became leader. A commit whose fence is no longer the latest is
refused (`StaleFenceError`), so a deposed coordinator can never overwrite its successor's state.
`EmbeddedStore` is the fake for `RedisStore`; one contract suite (tests/.../test_store_contract.py)
runs against both.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from rollmux.coordinator.service.runtime.api import StaleFenceError, StoreUnavailableError


class Store(Protocol):
    """Durable coordinator state plus a leadership lease."""

    async def ping(self) -> None:
        """Raise `StoreUnavailableError` unless the store answers."""

    async def load(self) -> dict[str, str]:
        """Every record, key -> JSON text."""

    async def commit(self, writes: Mapping[str, str | None], *, fence: int) -> None:
        """Apply `writes` (None deletes the key) atomically if `fence` is the current leader fence.

        Raises:
            StaleFenceError: another leader took over since `fence` was issued; nothing was written.
            StoreUnavailableError: the store cannot be reached (the batch may or may not be applied).
        """

    async def acquire_leadership(self, owner: str, ttl_s: float) -> int | None:
        """Become leader if nobody else (another `owner`) holds an unexpired lease.

        Returns:
            The new fence (a number greater than every earlier one), or None if another owner leads.
        """

    async def renew_leadership(self, owner: str, fence: int, ttl_s: float) -> bool:
        """Extend the lease; False when `fence` is no longer the current one (deposed)."""

    async def close(self) -> None: ...


class EmbeddedStore:
    """Records in a dict of this process: the `--embedded` single-machine mode and the test fake.

    Args:
        clock: monotonic seconds; injectable so tests can expire the leadership lease.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:  # noqa: D107
        self._now = clock
        self.records: dict[str, str] = {}
        self.fence = 0
        self._leader: tuple[str, int, float] | None = None  # owner, fence, expires_at
        self.available = True  # tests flip it to simulate an outage

    def _check(self) -> None:
        if not self.available:
            raise StoreUnavailableError("embedded store is marked unavailable (simulated outage)")

    async def ping(self) -> None:
        self._check()

    async def load(self) -> dict[str, str]:
        self._check()
        return dict(self.records)

    async def commit(self, writes: Mapping[str, str | None], *, fence: int) -> None:
        self._apply(writes, fence)

    def commit_future(self, writes: Mapping[str, str | None], *, fence: int) -> asyncio.Future[None]:
        """`commit` as an already-resolved future (the committer's hot path: no task per batch)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        try:
            self._apply(writes, fence)
        except Exception as exc:  # noqa: BLE001 - handed to the committer through the future
            fut.set_exception(exc)
        else:
            fut.set_result(None)
        return fut

    def _apply(self, writes: Mapping[str, str | None], fence: int) -> None:
        self._check()
        if fence != self.fence:
            raise StaleFenceError(f"commit with fence {fence} refused: the current leader fence is {self.fence}")
        for key, value in writes.items():
            if value is None:
                self.records.pop(key, None)
            else:
                self.records[key] = value

    async def acquire_leadership(self, owner: str, ttl_s: float) -> int | None:
        self._check()
        now = self._now()
        if self._leader is not None and self._leader[0] != owner and self._leader[2] > now:
            return None
        self.fence += 1
        self._leader = (owner, self.fence, now + ttl_s)
        return self.fence

    async def renew_leadership(self, owner: str, fence: int, ttl_s: float) -> bool:
        self._check()
        if fence != self.fence:
            return False
        self._leader = (owner, fence, self._now() + ttl_s)
        return True

    async def close(self) -> None:
        return None
