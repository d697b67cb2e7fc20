"""Ordered group commit: the one writer between the runtime and the store.

Transitions happen in memory on the event loop, in order; each hands its dirty records to
`Committer.commit` and waits. Everything queued while the previous batch was in flight (or during
the current pass of the event loop) is merged into one atomic store commit. Batches reach the
store in transition order, one at a time, so whatever happens to the store, what it holds is the
state after some prefix of the transitions. After the first failure the committer is poisoned:
every queued and later commit fails until `reset()` (the shell then reloads state from the store).

The committer is driven by callbacks, not a worker task: a commit schedules a flush with
`call_soon` (so the transitions of one loop pass share a batch), and the store's answer, through
the done-callback of its future, resolves the batch's waiters and sends the next batch. A store
with a `commit_future(writes, fence=...)` method (Redis) answers without any task at all; any
other store's `commit` coroutine runs as one task per batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from rollmux.coordinator.service.runtime.api import NotReadyError, StoreError
from rollmux.coordinator.service.store import Store

_Batch = list[tuple[Mapping[str, str | None], "asyncio.Future[None]"]]


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
        self._send: Callable[..., Awaitable[object]] = getattr(store, "commit_future", None) or store.commit
        self._queue: _Batch = []
        self._poison: Exception | None = None
        self._running = False
        self._scheduled = False  # a flush is scheduled with call_soon
        self._in_flight = False  # a batch is being written now
        self._loop: asyncio.AbstractEventLoop | None = None
        self.batches = 0  # store commits issued (for the load benchmark's report)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._running = True
        if self._queue and not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    async def stop(self) -> None:
        """Stop sending: queued commits fail with NotReadyError (a batch already sent still ends)."""
        self._running = False
        batch, self._queue = self._queue, []
        self._fail(batch, NotReadyError("coordinator is reloading its state; retry shortly"))

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
        if not self._running:
            raise NotReadyError("coordinator is reloading its state; retry shortly")
        loop = self._loop or asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._queue.append((writes, fut))
        if not self._in_flight and not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        await fut

    def _flush(self) -> None:
        self._scheduled = False
        if self._in_flight or not self._queue or not self._running:
            return
        batch, self._queue = self._queue, []
        if self._poison is not None:
            self._fail(batch, self._poison)
            return
        if len(batch) == 1:
            merged = batch[0][0]
        else:
            merged = {}
            for writes, _ in batch:
                merged.update(writes)  # type: ignore[attr-defined]
        if not merged:  # only barriers, nothing in flight: all earlier batches are durable
            for _, fut in batch:
                if not fut.done():
                    fut.set_result(None)
            return
        self._in_flight = True
        try:
            sent = asyncio.ensure_future(self._send(merged, fence=self._fence()))
        except Exception as exc:  # noqa: BLE001 - the store refused before sending: fail the batch
            sent = (self._loop or asyncio.get_running_loop()).create_future()
            sent.set_exception(exc)
        sent.add_done_callback(lambda f, batch=batch: self._done(batch, f))  # type: ignore[misc]

    def _done(self, batch: _Batch, sent: asyncio.Future[object]) -> None:
        self._in_flight = False
        error = None if not sent.cancelled() else NotReadyError("state store commit was cancelled")
        if error is None:
            error = sent.exception()  # type: ignore[assignment]
        if error is None:
            self.batches += 1
            for _, fut in batch:
                if not fut.done():
                    fut.set_result(None)
        else:
            if self._poison is None:
                self._poison = error  # type: ignore[assignment]
                self._on_failure(error if isinstance(error, (StoreError, OSError)) else StoreError(repr(error)))
            self._fail(batch, error)  # type: ignore[arg-type]
        if self._queue and not self._scheduled:
            self._flush()

    @staticmethod
    def _fail(batch: _Batch, error: BaseException) -> None:
        for _, fut in batch:
            if not fut.done():
                fut.set_exception(NotReadyError(f"state store commit failed: {error}; retry shortly"))
