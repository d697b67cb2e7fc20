"""The node agent's permit relaying: one coordinator permit fanned out to every local rank of a job.

Permit flow for one job on one node::

    rank A Acquire(train, 3) --+-- first asker leads: JobClient.acquire(...) on the coordinator
    rank B Acquire(train, 3) --+-- others wait; all get the same lease (fan-out)
    rank A Release(epoch)      -- waits for B
    rank B Release(epoch)      -- last one leads: memory check of the job's local pids, then
                                  JobClient.release(duration = longest rank's) ; both return

The memory check reads the GPU bytes of each local rank and of every process below one (an inference
engine's workers; NVML, or its stand-in on a CPU machine) and waits
until every process holds at most ``gpu_mem_limit_bytes`` (about its CUDA context: see
``rollmux.sidecar.gpu``), at most ``memory_wait_s``; a process still above it then is reported by PID
and bytes in a ``gpu_memory_not_freed`` event, and the node is released anyway.

:class:`PermitRelay` is a part of :class:`~rollmux.sidecar.agent.NodeAgent`: it decides under the
agent's lock and makes the coordinator calls and the NVML polling outside it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from rollmux.core.errors import ErrorCode
from rollmux.core.model import Lease, Migration, Phase, phase_key
from rollmux.sidecar.agent_records import AgentConfig, LocalJob
from rollmux.sidecar.api import RankLease, RankState
from rollmux.sidecar.gpu import GpuProvider, holders_over
from rollmux.sidecar.proctree import with_descendants
from rollmux.wire.client import CoordinatorClient
from rollmux.wire.errors import (
    FailedPreconditionError,
    JobAbortedError,
    PermitTimeoutError,
    PermitWaitTimeoutError,
    RankLeaseError,
    ServiceError,
    SidecarUnreachableError,
)

log = logging.getLogger("rollmux.sidecar")


class PermitRelay:
    """Acquire, release and progress of local ranks, relayed to the coordinator (a NodeAgent part)."""

    config: AgentConfig
    coordinator: CoordinatorClient
    gpu: GpuProvider
    _cv: threading.Condition

    if TYPE_CHECKING:  # defined by NodeAgent
        def _rank(self, rank_id: str, conn: str) -> tuple[RankLease, LocalJob]: ...

        def _record(self, event: str, **fields: Any) -> None: ...

    def acquire(self, rank_id: str, phase: str, iteration: int, timeout_s: float, *, conn: str = "") -> Lease:
        """Block until the job's permit for (`phase`, `iteration`) holds this node; fan it out.

        Raises:
            PermitWaitTimeoutError: not granted within `timeout_s`.
            JobAbortedError: the job lost a rank meanwhile.
            RankLeaseError: unknown rank, or a phase out of on-policy order.
        """
        deadline = time.monotonic() + timeout_s
        with self._cv:
            lease, job = self._rank(rank_id, conn)
            lease.move(RankState.WAITING, f"Acquire {phase}({iteration})")
        try:
            return self._acquire(lease, job, phase, iteration, deadline)
        except BaseException:
            with self._cv:
                if lease.state is RankState.WAITING:
                    lease.move(RankState.IDLE, "permit wait failed")
            raise

    def _acquire(self, lease: RankLease, job: LocalJob, phase: str, iteration: int, deadline: float) -> Lease:
        want = (phase, iteration)
        while True:
            with self._cv:
                lead = False
                while not lead:
                    if job.aborted:
                        raise JobAbortedError(f"{job.aborted}; stop this rank too (its job cannot continue)")
                    p = job.permit
                    if p is not None and (p.phase.value, p.iteration) == want:
                        lease.move(RankState.RUNNING, f"epoch {p.epoch}")
                        return p
                    if job.acquiring is None and not job.releasing and p is None:
                        job.acquiring, lead = want, True
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise PermitWaitTimeoutError(f"job {job.name!r} {phase}({iteration}) was not granted on "
                                                     f"node {self.config.node_id} in time")
                    self._cv.wait(min(left, 0.5))
            try:
                permit = self._acquire_remote(job, phase, iteration, deadline)
            finally:
                with self._cv:
                    job.acquiring = None
                    self._cv.notify_all()
            if self.config.node_id not in permit.nodes:  # the job was relocated: its ranks run elsewhere now
                self._record("grant_elsewhere", job=job.name, phase=phase, iteration=iteration, epoch=permit.epoch,
                             nodes=list(permit.nodes))
                raise RankLeaseError(f"job {job.name!r} {phase}({iteration}) was granted on node(s) "
                                     f"{','.join(permit.nodes)}, not on this node {self.config.node_id}: the job "
                                     "was relocated; honour the directive (rollmux.relocate()) and attach there")
            with self._cv:
                if job.aborted is None:
                    job.permit, job.granted_at, job.released = permit, time.time(), {}
            self._record("granted", job=job.name, phase=phase, iteration=iteration, epoch=permit.epoch)

    def _acquire_remote(self, job: LocalJob, phase: str, iteration: int, deadline: float) -> Lease:
        """JobClient.acquire, waiting out the job's previous phase held on another node."""
        delay = 0.005
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PermitWaitTimeoutError(f"job {job.name!r} {phase}({iteration}) not granted in time")
            try:
                return job.client.acquire(Phase(phase), iteration, timeout_s=left)
            except PermitTimeoutError as exc:
                raise PermitWaitTimeoutError(str(exc)) from None
            except FailedPreconditionError as exc:
                if exc.code is not ErrorCode.OUT_OF_ORDER:
                    raise RankLeaseError(str(exc)) from None
                nxt = job.client.status()
                if phase_key(nxt.next_phase.value, nxt.next_iteration) > phase_key(phase, iteration):
                    raise RankLeaseError(f"job {job.name!r} asked for {phase}({iteration}) but the coordinator "
                                         f"is past it (next: {nxt.next_phase.value}({nxt.next_iteration}))") \
                        from None
                # the previous phase (held by the job's ranks on another node) is not released yet
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
            except ServiceError as exc:
                raise SidecarUnreachableError(f"coordinator {','.join(self.coordinator.targets)} failed the "
                                              f"permit call for job {job.name!r}: {exc}") from None

    def release(self, rank_id: str, epoch: int, duration_s: float, state_host_bytes: int, *,
                conn: str = "") -> tuple[bool, str, int]:
        """Release this rank's part of a phase; returns once the node went back to the coordinator.

        The last local rank to release checks the job's GPU memory (NVML), then releases the permit
        with the longest rank's duration. Returns (this call released the node, next phase, next iteration).

        Raises:
            RankLeaseError: unknown rank or an epoch this node does not hold.
            JobAbortedError: the job lost a rank meanwhile.
        """
        with self._cv:
            lease, job = self._rank(rank_id, conn)
            if job.permit is None or job.permit.epoch != epoch:
                if epoch and epoch <= job.last_released_epoch:  # retried, or revoked meanwhile
                    if lease.state is RankState.RUNNING:
                        lease.move(RankState.IDLE, f"epoch {epoch} already over")
                    lease.host_bytes = max(0, state_host_bytes)
                    return False, "", 0
                raise RankLeaseError(f"rank {rank_id} released epoch {epoch}, which node {self.config.node_id} "
                                     "does not hold: acquire the permit first")
            lease.move(RankState.RELEASING, f"Release epoch {epoch}")  # refused (unchanged) unless RUNNING
            lease.host_bytes = max(0, state_host_bytes)
            job.released[rank_id] = duration_s
            pending = [r.rank_id for r in job.live_ranks() if r.rank_id not in job.released]
            lead = not pending and not job.releasing
            if lead:
                job.releasing = True
            else:
                while job.last_released_epoch < epoch:
                    if job.aborted:
                        raise JobAbortedError(f"{job.aborted}; stop this rank too")
                    self._cv.wait(0.5)
                if lease.state is RankState.RELEASING:
                    lease.move(RankState.IDLE, "node released")
                return False, "", 0
            permit, durations = job.permit, dict(job.released)
            pids = [r.pid for r in job.live_ranks()]
            # no rank ran longer than the permit has been on this node: a rank's clock cannot say otherwise
            duration = min(max(durations.values()), max(0.0, time.time() - job.granted_at))
        try:
            gpu_bytes = self._wait_gpu_memory(job.name, pids)
            nxt_phase, nxt_it = job.client.release(permit, duration, node_id=self.config.node_id)  # this node alone
        finally:
            with self._cv:
                job.permit, job.releasing, job.released = None, False, {}
                job.last_released_epoch = max(job.last_released_epoch, epoch)
                for r in job.live_ranks():
                    if r.state is RankState.RELEASING:
                        r.move(RankState.IDLE, "node released")
                self._cv.notify_all()
        self._record("released", job=job.name, phase=permit.phase.value, iteration=permit.iteration, epoch=epoch,
                     duration_s=round(duration, 6), ranks=len(durations),
                     gpu_bytes=None if gpu_bytes is None else {str(p): b for p, b in gpu_bytes.items()})
        return True, nxt_phase.value, nxt_it

    def _wait_gpu_memory(self, job: str, pids: list[int]) -> dict[int, int] | None:
        """Wait (bounded) until each of the job's local processes, its ranks and every process below them
        (an inference engine's workers, ``rollmux.sidecar.proctree``), holds at most the per-process limit.

        Returns:
            The last per-PID reading: every rank, and each process below one that holds memory (None: the
            provider cannot tell, and the check is skipped).
        """
        limit, wait_s = self.config.gpu_mem_limit_bytes, self.config.memory_wait_s
        start = time.monotonic()
        if self.gpu.process_memory(pids) is None:  # the provider cannot tell: no process-tree walk for nothing
            return None
        pause = 0.002  # memory usually comes down within milliseconds of the release: poll fast, then back off
        while True:
            owner = with_descendants(pids)  # re-read each time: an engine may start or stop workers
            used = self.gpu.process_memory(list(owner))
            if used is None:
                return None
            over = holders_over(used, limit)
            if not over:
                return _reading(used, pids)
            waited = time.monotonic() - start
            if waited > wait_s:
                for h in over:
                    rank_pid = owner.get(h.pid, h.pid)
                    below = "" if rank_pid == h.pid else f" (a process under rank pid {rank_pid})"
                    log.warning("job %s: pid %d%s still holds %d GPU bytes (limit %d per process) after %.1fs on "
                                "node %s; releasing the node anyway", job, h.pid, below, h.used_bytes, limit, waited,
                                self.config.node_id)
                    self._record("gpu_memory_not_freed", job=job, pid=h.pid, rank_pid=rank_pid,
                                 used_bytes=h.used_bytes, limit_bytes=limit, waited_s=round(waited, 3))
                return _reading(used, pids)
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def progress(self, rank_id: str, epoch: int, finished: int, total: int, *, conn: str = "") -> Migration | None:
        """Forward rollout progress; returns the coordinator's migration directive, if any."""
        with self._cv:
            _, job = self._rank(rank_id, conn)
            permit = job.permit
        if permit is None or permit.epoch != epoch:
            return None
        return job.client.report_progress(permit, finished, total)


def _reading(used: dict[int, int], ranks: list[int]) -> dict[int, int]:
    """What the release reports: every rank's bytes, and those of each process below a rank that holds any."""
    return {p: b for p, b in used.items() if b or p in ranks}


__all__ = ["PermitRelay"]
