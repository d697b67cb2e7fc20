"""The coordinator's paced collector, in a fresh interpreter each (it changes process-wide GC state).

What it must do: collect garbage cycles made between two passes (gRPC's per-RPC cycle among them,
against a real grpc.aio server), freeze what survives so no later pass visits it, run a full pass
when the frozen set grows past its limit, report how late the event loop ran it, and hand collection back to CPython when stopped.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import asyncio, gc, sys, weakref
    import grpc
    from grpc_health.v1 import _async as health_aio, health_pb2, health_pb2_grpc
    from rollmux.coordinator.service.gc_tuning import PacedCollector

    class Node:
        pass

    async def main():
        heard = []
        lags = []
        pacer = PacedCollector(interval_s=0.01, reclaim_growth=0.5, on_pause=lambda k, s: heard.append((k, s)),
                               on_lag=lags.append)
        pacer.start()
        assert not gc.isenabled()
        full0 = pacer.full_passes

        # cycles that die between two passes are collected, not frozen
        refs = []
        for _ in range(1000):
            a, b = Node(), Node()
            a.peer, b.peer = b, a
            refs.append(weakref.ref(a))
        del a, b
        await asyncio.sleep(0.1)
        assert pacer.passes > 0
        assert all(r() is None for r in refs), "cyclic garbage survived the paced passes"

        # survivors are frozen out of later passes
        keep = [Node() for _ in range(1000)]
        await asyncio.sleep(0.05)
        frozen = gc.get_freeze_count()
        assert gc.get_count()[0] < 1000 and frozen >= 1000

        # gRPC's per-RPC cycle (real grpc.aio server and channel) never reaches the frozen set
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health_aio.HealthServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for _ in range(300):
                await stub.Check(health_pb2.HealthCheckRequest())
                await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.unfreeze()
        gc.collect()
        leaked = sum(type(o).__name__ == "_HandlerCallDetails" for o in gc.garbage)
        gc.garbage.clear()
        gc.set_debug(0)
        gc.freeze()
        assert leaked == 0, f"{leaked} of 300 per-RPC cycles were frozen instead of collected"
        await server.stop(None)

        # a blocked loop shows as the lag of the pass that was due meanwhile
        await asyncio.sleep(0.05)
        before = len(lags)
        assert before > 0
        import time
        time.sleep(0.2)
        await asyncio.sleep(0.05)
        assert max(lags[before:]) >= 0.15, lags[before:]

        # growth past the limit triggers a full pass
        grow = [[Node()] for _ in range(int(sys.getallocatedblocks() * 0.6) + 1000)]
        await asyncio.sleep(0.1)
        assert pacer.full_passes > full0, (pacer.full_passes, full0)

        await pacer.stop()
        assert gc.isenabled() and gc.get_freeze_count() == 0
        kinds = {k for k, _ in heard}
        assert kinds == {"young", "full"} and all(s >= 0 for _, s in heard), kinds
        print("ok", pacer.passes, pacer.full_passes, len(keep), len(grow))

    asyncio.run(main())
    """
)


def test_paced_collector_collects_cycles_freezes_survivors_and_reclaims_on_growth() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok"), done.stdout


def test_paced_collector_refuses_nonsense_settings() -> None:
    from rollmux.coordinator.service.gc_tuning import PacedCollector

    for bad in ({"interval_s": 0}, {"reclaim_growth": -1}):
        try:
            PacedCollector(**bad)
        except ValueError as exc:
            assert "must be > 0" in str(exc)
        else:
            raise AssertionError(f"{bad} accepted")
