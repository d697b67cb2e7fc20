"""The job's rank board (``rollmux.adapters.common.ranks.Board``) on its own event loop: ranks follow the
controller's commands in order, a rank joining mid-phase joins the open phase, the controller's wait
ends only once every rank carried a command out, and the placement names each pool's attach nodes."""

from __future__ import annotations

import asyncio

from rollmux.adapters.common.ranks import Action, Board


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_ranks_follow_commands_and_the_wait_covers_every_rank() -> None:
    async def scenario() -> None:
        b = Board()
        assert await b.join("n1/10", "n1", "train", 10, "WorkerDict", {}) == 0
        assert await b.join("n2/20", "n2", "train", 20, "WorkerDict", {}) == 0
        seq = await b.post(Action.OPEN, "rollout", 0)
        assert await b.next(0, timeout_s=1) == (1, (Action.OPEN, "rollout", 0))
        waiting = asyncio.ensure_future(b.wait(seq, timeout_s=5))
        await b.done("n1/10", seq, lease_nodes=("n1", "n2"))
        await asyncio.sleep(0.05)
        assert not waiting.done(), "the wait ended before n2's rank entered"
        await b.done("n2/20", seq, lease_nodes=("n1", "n2"))
        out = await waiting
        assert out == {"errors": {}, "missing": [], "nodes": ["n1", "n2"], "placement": {"train": ["n1", "n2"]}}
        # a rank attaching while the phase is open joins it: its first command is that open
        late = await b.join("n2/21", "n2", "train", 21, "HFCPUServer", {})
        assert await b.next(late, timeout_s=1) == (1, (Action.OPEN, "rollout", 0))
        close = await b.post(Action.CLOSE)
        out = await b.wait(close, timeout_s=0.1)
        assert out["missing"] == ["n1/10", "n2/20", "n2/21"]
        for key in ("n1/10", "n2/20"):
            await b.done(key, close)
        await b.done("n2/21", close, error="RankLeaseError: not granted here")
        out = await b.wait(close, timeout_s=1)
        assert out["errors"] == {"n2/21": "RankLeaseError: not granted here"} and not out["missing"]
        # after the close, a new rank has nothing to catch up with
        assert await b.join("n1/11", "n1", "train", 11, "HFCPUServer", {}) == close
        assert await b.next(close, timeout_s=0.05) is None
        assert await b.placement() == {"train": ["n1", "n2"]}

    run(scenario())


def test_placement_is_per_pool() -> None:
    async def scenario() -> dict[str, list[str]]:
        b = Board()
        await b.join("r0/1", "r0", "rollout", 1, "vLLMHttpServer", {})
        await b.join("t1/2", "t1", "train", 2, "WorkerDict", {})
        await b.join("t0/3", "t0", "train", 3, "WorkerDict", {})
        await b.leave("r0/1")
        return await b.placement()

    assert run(scenario()) == {"train": ["t0", "t1"]}
