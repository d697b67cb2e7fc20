from __future__ import annotations

from rollmux.core.model import Phase

from .conftest import add_nodes, job_spec


def test_one_job_cycles_through_phases_in_order(client, coordinator) -> None:
    add_nodes(client, 1, 1)
    job = client.register_job(job_spec("a"))
    assert job.registration.state == "admitted"
    phase, it = Phase.ROLLOUT, 0
    seen = []
    for _ in range(6):
        p = job.acquire(phase, it, timeout_s=5)
        seen.append((p.phase, p.iteration))
        phase, it = job.release(p, 0.01)
    assert seen == [(Phase.ROLLOUT, 0), (Phase.TRAIN, 0), (Phase.SYNC, 0),
                    (Phase.ROLLOUT, 1), (Phase.TRAIN, 1), (Phase.SYNC, 1)]
