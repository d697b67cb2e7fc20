"""Seeded fault injection into a running deployment.

Kinds are dealt from a shuffled deck (every kind once per round, in a seeded order), with a seeded
pause between faults. Each fault is recorded as a ``fault`` event with the time it struck, the time
the faulty part served again (``ready_t``) and the nodes it took away.
"""

from __future__ import annotations

import random
import threading
import time
from enum import Enum
from typing import Any

from rollmux.testing.chaos.deployment import Deployment
from rollmux.testing.chaos.jobs import EventTail, Jobs, append_event


class FaultKind(str, Enum):
    COORDINATOR_RESTART = "coordinator_restart"  # SIGKILL the leader, start it again at once
    FAILOVER = "failover"  # SIGKILL the leader, the standby takes over, the old one comes back as standby
    SIDECAR_RESTART = "sidecar_restart"  # SIGKILL a node's sidecar, start it again
    RANK_KILL = "rank_kill"  # SIGKILL a job process mid-phase (holding its permit)
    REDIS_RESTART = "redis_restart"  # stop redis-server (append-only file), start it again


class Injector:
    """Runs in its own thread until `stop` or `max_faults`; `gap_s`: (min, max) pause between faults."""

    def __init__(self, deploy: Deployment, jobs: Jobs, tail: EventTail, *, seed: int, kinds: tuple[FaultKind, ...],
                 gap_s: tuple[float, float], max_faults: int | None = None) -> None:
        self.deploy, self.jobs, self.tail = deploy, jobs, tail
        self.rng = random.Random(seed)
        self.kinds, self.gap_s, self.max_faults = kinds, gap_s, max_faults
        self.stopped = threading.Event()
        self.injected = 0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._loop, name="chaos-faults", daemon=True)

    def start(self) -> Injector:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()

    def _loop(self) -> None:
        deck: list[FaultKind] = []
        while self.max_faults is None or self.injected < self.max_faults:
            if self.stopped.wait(self.rng.uniform(*self.gap_s)):
                return
            if not deck:
                deck = list(self.kinds)
                self.rng.shuffle(deck)
            kind = deck.pop()
            try:
                fault = getattr(self, f"_{kind.value}")()
            except Exception as exc:  # a fault that could not be injected is reported, the run goes on
                self.errors.append(f"{kind.value}: {exc!r}")
                continue
            if fault is not None:
                append_event(self.jobs.log, "fault", kind=kind.value, **fault)
                self.injected += 1

    # ----------------------------------------------------------------------------------- kinds
    def _coordinator_restart(self) -> dict[str, Any] | None:
        leader = self.deploy.wait_leader(20.0)
        if leader is None:
            return None
        leader.kill()
        t = time.time()
        time.sleep(self.rng.uniform(0.1, 0.5))
        leader.start(wait=False)
        served = self.deploy.wait_leader(60.0)  # the restarted one, or the standby if it is quicker
        ready_t = time.time()
        leader.wait_listening(60.0)
        return {"t": t, "ready_t": ready_t, "detail": f"{leader.instance_id} -> "
                f"{served.instance_id if served else 'none'}"}

    def _failover(self) -> dict[str, Any] | None:
        if len(self.deploy.coordinators) < 2:
            return self._coordinator_restart()
        leader = self.deploy.wait_leader(20.0)
        if leader is None:
            return None
        leader.kill()
        t = time.time()
        served = self.deploy.wait_leader(60.0, not_=leader)
        ready_t = time.time()
        leader.start()  # back as the standby
        # No takeover is a failed failover, not a slow one (the restart above would mask it).
        return {"t": t, "ready_t": ready_t, "failed": served is None,
                "detail": f"{leader.instance_id} -> {served.instance_id if served else 'none'}"}

    def _sidecar_restart(self) -> dict[str, Any]:
        node = self.rng.choice(sorted(self.deploy.sidecars))
        idle = not self._hosts_jobs(node)
        sidecar = self.deploy.sidecars[node]
        sidecar.kill()
        t = time.time()
        time.sleep(self.rng.uniform(0.2, 1.0))
        sidecar.start(wait=True, timeout_s=90.0)
        return {"t": t, "ready_t": time.time(), "nodes": [node], "idle": idle}

    def _hosts_jobs(self, node: str) -> bool:
        """Whether any registered job is placed on `node` (a fault on an idle node has nothing to recover)."""
        from rollmux.wire.client import CoordinatorClient
        from rollmux.wire.errors import ServiceError

        leader = self.deploy.wait_leader(5.0)  # a standby answers with an empty state
        if leader is None:
            return True  # unknown: not counted idle
        client = CoordinatorClient(leader.address, token=self.deploy.operator_token, retry_s=1.0)
        try:
            state = client.cluster_state()
        except ServiceError:
            return True
        finally:
            client.close()
        return not state.ready or any(node in (*j.rollout_nodes, *j.train_nodes) for j in state.jobs)

    def _rank_kill(self) -> dict[str, Any] | None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not self.stopped.is_set():
            self.tail.poll()
            with self.jobs.lock:
                with self.tail.lock:
                    mid = [(r, role, p, self.tail.last[p.pid]) for r, role, p in self.jobs.live()
                           if self.tail.last.get(p.pid, {}).get("ev") == "start"]
                if mid:
                    run, role, proc, ev = self.rng.choice(sorted(mid, key=lambda m: (m[0].name, m[1])))
                    self.jobs.kill(run, proc)
                    t = time.time()
                    self.tail.poll()  # everything it wrote before it died
                    with self.tail.lock:
                        late = self.tail.last.get(proc.pid) is not ev  # the body had ended: killed releasing
                    return {"t": t, "ready_t": t, "nodes": ev["nodes"], "run": run.name, "epoch": ev["epoch"],
                            "in_release": late, "detail": f"{run.name} {role} in {ev['phase']}({ev['it']})"}
            time.sleep(0.01)
        return None

    def _redis_restart(self) -> dict[str, Any]:
        self.deploy.redis.stop()
        t = time.time()
        time.sleep(self.rng.uniform(0.2, 1.0))
        self.deploy.redis.start()
        served = self.deploy.wait_leader(60.0)
        return {"t": t, "ready_t": time.time(), "detail": served.instance_id if served else "none"}
