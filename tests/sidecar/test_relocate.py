"""Relocation directives through real sidecars (node agents on their sockets, a real gRPC coordinator)
and the real shim in a job process: ``rollmux.relocation()`` / ``rollmux.relocate()``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rollmux.core.model import JobSpec, Pool, RelocationState
from rollmux.shim import env
from rollmux.sidecar.gpu import host_dram_bytes
from rollmux.wire.client import CoordinatorClient

from .conftest import run_python
from .test_agent import Rank

WAIT_S = 30.0  # generous: CI machines are shared

# The rank attaches, waits for the directive, honours it and says where it runs now.
LATE_RANK = r"""
import time
import rollmux
assert rollmux.init()
deadline = time.monotonic() + 10.0
while rollmux.relocation() is None:
    assert time.monotonic() < deadline, "the directive issued before this rank attached never reached it"
    time.sleep(0.02)
d = rollmux.relocation()
assert rollmux.relocate(), d
assert rollmux.relocation() is None
print(d.epoch)
rollmux.shutdown()
"""


def spec(name: str, train_state_bytes: int) -> JobSpec:
    return JobSpec(name=name, n_rollout_gpus=1, n_train_gpus=1, t_roll_s=10.0, t_train_s=10.0, slo=3.0,
                   rollout_state_bytes=1 << 20, train_state_bytes=train_state_bytes)


@pytest.mark.parametrize("sibling", [False, True], ids=["first-rank-of-its-job-on-the-node", "job-already-attached"])
def test_a_rank_attaching_after_the_directive_is_handed_it_and_relocates(coordinator, make_node, sockdir,
                                                                        tmp_path: Path, sibling: bool) -> None:
    """The directive reached the node's sidecar before this rank of the job attached there (a trainer
    that starts late): the sidecar replays it on attach, and the rank moves to the job's new group.
    With `sibling`, another rank of the job was attached on the node all along (it heard the directive
    live), so the late rank's attach does not ask the coordinator about the job again."""
    nodes = {n: make_node(n, pool) for n, pool in (("r0", Pool.ROLLOUT), ("r1", Pool.ROLLOUT),
                                                    ("t0", Pool.TRAIN), ("t1", Pool.TRAIN))}
    client = CoordinatorClient(coordinator.address)
    big = int(0.6 * host_dram_bytes())  # A and B cannot share a training node: B opens g1, C packs with A
    jobs = {n: client.register_job(spec(n, s)) for n, s in (("A", big), ("B", big), ("C", 1 << 20))}
    assert [jobs[n].status().group_id for n in "ABC"] == ["g0", "g1", "g0"]
    assert jobs["C"].status().rollout_nodes == ("r0",)

    other = Rank(str(sockdir / "r0.sock"), "C", jobs["C"].token, 1) if sibling else None
    jobs["A"].deregister()  # C alone holds g0: the coordinator directs it to g1
    deadline = time.monotonic() + WAIT_S
    while (directive := jobs["C"].status().relocation) is None:
        assert time.monotonic() < deadline, "no relocation directive"
        time.sleep(0.02)
    assert (directive.to_group, directive.state) == ("g1", RelocationState.PENDING)
    time.sleep(0.5)  # the directive went out on r0's stream before the late rank attached

    log = tmp_path / "events.jsonl"
    res = run_python(LATE_RANK, {env.SIDECAR_SOCKET: str(sockdir / "r0.sock"), env.JOB: "C",
                                 env.JOB_TOKEN: jobs["C"].token, env.RANK: "0", env.EVENT_LOG: str(log),
                                 env.SIDECAR_SOCKET_TEMPLATE: str(sockdir / "{node}.sock")}, timeout=WAIT_S)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [str(directive.epoch)]
    moved = [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "relocated"]
    assert [(e["from_node"], e["node"], e["to_group"]) for e in moved] == [("r0", "r1", "g1")]
    info = jobs["C"].status()
    assert (info.group_id, info.rollout_nodes, info.relocation.state) == ("g1", ("r1",), RelocationState.SWITCHED)
    attached = [json.loads(e) for e in nodes["r1"].agent.status()["events"]]
    assert any(e["event"] == "rank_attached" and e["job"] == "C" for e in attached)  # re-attached on r1
    if other is not None:
        other.channel.close()
    client.close()
