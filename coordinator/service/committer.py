"""Ordered group commit: the one writer between the runtime and the store.

Transitions happen in memory on the event loop, in order; each hands its dirty records to
`Committer.commit` and waits. A single worker merges everything queued while the previous batch
was in flight into one atomic store commit. Batches reach the store in transition order on one
connection, so whatever happens to the store, what it holds is the state after some prefix of the
transitions. After the first failure the committer is poisoned: every queued and later commit
fails until `reset()` (the shell then reloads state from the store).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from rollmux.coordinator.service.api import NotReadyError, StoreError
from rollmux.coordinator.service.store import Store


class Committer:
    """Args:
        store: where batches go.
        fence: returns the current leader fence.
        on_failure: called once with the exception that poisoned the committer.
    """

    def __init__(self, store: Store, fence: Callable[[], int], on_failure: Callable[[Exception], None]) -> None:
        self._store = store
        self._fence = fence
        self._on_failure = on_failure
        self._queue: list[tuple[Mapping[str, str | None], asyncio.Future[None]]] = []
        self._wakeup = asyncio.Event()
        self._poison: Exception | None = None
        self._task: asyncio.Task[None] | None = None
        self._in_flight = False  # a batch is being written now
        self.batches = 0  # store commits issued (for the load benchmark's report)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="rollmux-committer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def reset(self) -> None:
        """Accept commits again (after the shell reloaded state from the store)."""
        self._poison = None

    @property
    def poisoned(self) -> bool:
        return self._poison is not None

    async def commit(self, writes: Mapping[str, str | None]) -> None:
        """Durably apply `writes` after every earlier batch; an empty batch is a barrier.

        Raises:
            NotReadyError: the store failed (now or earlier); nothing after that point is durable.
        """
        if self._poison is not None:
            raise NotReadyError(f"coordinator is recovering its state store: {self._poison}; retry shortly")
        if not writes and not self._queue and not self._in_flight:
            return  # barrier with nothing pending: everything applied so far is durable
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((writes, fut))
        self._wakeup.set()
        await fut

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            batch, self._queue = self._queue, []
            if not batch:
                continue
            merged: dict[str, str | None] = {}
            for writes, _ in batch:
                merged.update(writes)
            error: Exception | None = self._poison
            if error is None and merged:
                self._in_flight = True
                try:
                    await self._store.commit(merged, fence=self._fence())
                    self.batches += 1
                except (StoreError, OSError) as exc:
                    error = exc
                    self._poison = exc
                    self._on_failure(exc)
                finally:
                    self._in_flight = False
            for _, fut in batch:
                if fut.done():
                    continue
                if error is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(NotReadyError(f"state store commit failed: {error}; retry shortly"))
