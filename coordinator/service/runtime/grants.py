"""Per-node FIFO queues and grants: which queued phase gets its nodes, and the lease it gets.

A job's phase waits in the FIFO queue of every node it needs: Rollout on the job's pinned rollout
nodes, Train and Sync on the group's training nodes. Sync continues Train: it goes to the head of the
training queues, so nothing interleaves with it. A job is enqueued on all its nodes in one step, so
any two jobs are in the same relative order in every queue they share: no cyclic wait. A grant holds
every needed node with a lease (cluster-wide increasing epoch + TTL); at most one permit holds a node.
"""

from __future__ import annotations

from collections.abc import Iterable

from rollmux.coordinator.service.api import NodeState, PermitState
from rollmux.coordinator.service.records import JobRecord, PermitRecord
from rollmux.coordinator.service.runtime.state import Notice, NoticeKind, RuntimeState
from rollmux.coordinator.service.states import NODE_TRANSITIONS, PERMIT_TRANSITIONS, transition
from rollmux.model import Phase


class GrantQueues(RuntimeState):
    """Queueing phases on their nodes and granting queue heads whose nodes are all free."""

    def _grantable(self, node_id: str) -> bool:
        node = self.nodes.get(node_id)
        if node is None or node_id in self.holder:
            return False
        if node.state is not NodeState.READY:
            return False
        return not node.streams or node_id in self.connected

    def _free_node(self, node_id: str) -> None:
        self.holder.pop(node_id, None)
        self.freed_at[node_id] = self.clock()
        node = self.nodes.get(node_id)
        if node is not None and node.state is NodeState.DRAINING:
            transition(node, NODE_TRANSITIONS, NodeState.DRAINED, now=self.wall(), reason="permit ended")
            self._touch(f"node/{node_id}", node)
        self._notify(Notice(kind=NoticeKind.NODE, nodes=(node_id,)))

    def _enqueue(self, permit: PermitRecord, job: JobRecord) -> None:
        front = permit.phase is Phase.SYNC  # Sync continues Train on the training nodes
        permit.queued_at = self.clock()
        for n in self.phase_nodes(job, permit.phase):
            q = self.queues.setdefault(n, [])
            q.insert(0, job.name) if front else q.append(job.name)
            self._touch_queue(n)

    def _dequeue(self, permit: PermitRecord, job: JobRecord) -> None:
        for n in self.phase_nodes(job, permit.phase):
            q = self.queues.get(n)
            if q and job.name in q:
                q.remove(job.name)
                if not q:
                    del self.queues[n]
                self._touch_queue(n)

    def _pump(self, nodes: Iterable[str]) -> None:
        """Grant every queue head whose nodes are all free, ready and headed by it.

        A grant only consumes nodes, so one pass over the heads of the touched nodes suffices.
        """
        for n in list(dict.fromkeys(nodes)):
            q = self.queues.get(n)
            if not q:
                continue
            job = self.jobs[q[0]]
            permit = self.permits[job.name]
            needed = self.phase_nodes(job, permit.phase)
            if all(self.queues.get(m, [None])[0] == job.name and self._grantable(m) for m in needed):
                self._grant(permit, job, needed)

    def _grant(self, permit: PermitRecord, job: JobRecord, needed: tuple[str, ...]) -> None:
        self.meta.epoch += 1
        self._touch("meta", self.meta)
        for m in needed:
            self.queues[m].pop(0)
            if not self.queues[m]:
                del self.queues[m]
            self._touch_queue(m)
            self.holder[m] = job.name
        transition(permit, PERMIT_TRANSITIONS, PermitState.GRANTED, now=self.wall(),
                   reason=f"epoch {self.meta.epoch}")
        permit.epoch, permit.nodes, permit.migrated = self.meta.epoch, needed, False
        permit.expires_at = self.clock() + self.config.lease_ttl_s
        permit.grantable_at = max([permit.queued_at, *(self.freed_at.get(m, 0.0) for m in needed)])
        self._touch(f"permit/{job.name}", permit)
        self._notify(Notice(kind=NoticeKind.GRANTED, job=job.name, nodes=needed, epoch=permit.epoch))

