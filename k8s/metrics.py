"""Every Prometheus metric of the Kubernetes scheduler, in one place (``rollmux_scheduler_`` prefix).

Each scheduler builds its own registry (several live in one test process). Labels stay low-cardinality:
the outcome is a `Code` value or ``bound``.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS_S = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
"""A cycle or one coordinator call: milliseconds to seconds."""
GANG_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
"""A gang's wait for its binding: sub-second when placed at once, minutes to an hour when a bind is retried."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerMetrics:
    registry: CollectorRegistry
    gangs: Counter  # rollmux_scheduler_gang_decisions_total{outcome}: bound, or why it waits
    bindings: Counter  # rollmux_scheduler_bindings_total{outcome}: ok | conflict (the pod changed meanwhile) | error
    leader: Gauge  # rollmux_scheduler_leader: 1 while this replica may bind
    gang_latency: Histogram  # rollmux_scheduler_gang_bind_seconds: gang complete -> every pod bound
    pending_gangs: Gauge  # rollmux_scheduler_pending_gangs: gangs with a pending pod after the last cycle
    cycle_seconds: Histogram  # rollmux_scheduler_cycle_seconds: one scheduling cycle
    admit_seconds: Histogram  # rollmux_scheduler_admit_seconds: the coordinator's admission call (RegisterJob)

    @classmethod
    def create(cls) -> SchedulerMetrics:
        reg = CollectorRegistry()
        return cls(
            registry=reg,
            gangs=Counter("rollmux_scheduler_gang_decisions", "Gang decisions by outcome", ["outcome"],
                          registry=reg),
            bindings=Counter("rollmux_scheduler_bindings", "Pod bindings by outcome", ["outcome"], registry=reg),
            leader=Gauge("rollmux_scheduler_leader", "1 while this replica holds the Lease (or runs alone)",
                         registry=reg),
            gang_latency=Histogram("rollmux_scheduler_gang_bind_seconds",
                                   "From a gang's last pod pending to all its pods bound",
                                   buckets=GANG_BUCKETS_S, registry=reg),
            pending_gangs=Gauge("rollmux_scheduler_pending_gangs", "Gangs with a pending pod", registry=reg),
            cycle_seconds=Histogram("rollmux_scheduler_cycle_seconds", "One scheduling cycle",
                                    buckets=LATENCY_BUCKETS_S, registry=reg),
            admit_seconds=Histogram("rollmux_scheduler_admit_seconds", "The coordinator's admission of a gang's job",
                                    buckets=LATENCY_BUCKETS_S, registry=reg),
        )
