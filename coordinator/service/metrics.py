"""Every Prometheus metric of the coordinator, in one place (``rollmux_`` prefix, base units).

Each server builds its own `CollectorRegistry`, so several coordinators can live in one process
(tests, the load benchmark). Labels stay low-cardinality: pool, reason, outcome.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

POOLS = ("rollout", "train")  # label values of {pool}
REVOKE_REASONS = ("expired", "removed")  # label values of rollmux_permits_revoked_total{reason}
COMMIT_OUTCOMES = ("ok", "failed")  # label values of rollmux_store_commits_total{outcome}
RELOCATION_OUTCOMES = ("issued", "switched", "expired", "cancelled")  # rollmux_relocations_total{outcome}
GRANT_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
GC_PASSES = ("young", "full")  # label values of rollmux_gc_pause_seconds{pass}


@dataclass(frozen=True, slots=True, kw_only=True)
class Metrics:
    registry: CollectorRegistry
    permits_granted: Counter  # rollmux_permits_granted_total{pool}
    permits_revoked: Counter  # rollmux_permits_revoked_total{reason}
    permits_released: Counter  # rollmux_permits_released_total{pool}
    permit_nodes_unused: Counter  # rollmux_permit_nodes_unused_total{outcome}: grants a node's sidecar had no rank for
    grant_latency: Histogram  # rollmux_grant_latency_seconds: nodes free -> grant durable and sent
    queue_length: Gauge  # rollmux_queue_length{pool}: queued phases summed over the pool's nodes
    bubble_seconds: Counter  # rollmux_bubble_seconds_total{pool}: node-seconds free while work was queued
    provisioned_usd_per_h: Gauge  # rollmux_provisioned_usd_per_hour: Cost of all groups
    jobs: Gauge  # rollmux_jobs{state}
    nodes: Gauge  # rollmux_nodes{state}
    pool_nodes: Gauge  # rollmux_pool_nodes{pool}: READY nodes per pool (the bubble fraction's denominator)
    store_commits: Counter  # rollmux_store_commits_total{outcome}
    relocations: Counter  # rollmux_relocations_total{outcome}: directives issued and how they ended
    gc_pause: Histogram  # rollmux_gc_pause_seconds{pass}: the event loop's garbage-collection pauses
    loop_lag: Histogram  # rollmux_event_loop_lag_seconds: how late a task due on the event loop started
    ready: Gauge  # rollmux_ready: 1 when serving
    build_info: Gauge  # rollmux_build_info{version}


def create_metrics(version: str = "0.1.0") -> Metrics:
    r = CollectorRegistry()
    m = Metrics(
        registry=r,
        permits_granted=Counter("rollmux_permits_granted_total", "Run permits granted", ["pool"], registry=r),
        permits_revoked=Counter("rollmux_permits_revoked_total", "Leases ended other than by release",
                                ["reason"], registry=r),
        permits_released=Counter("rollmux_permits_released_total", "Run permits released by their holder",
                                 ["pool"], registry=r),
        permit_nodes_unused=Counter("rollmux_permit_nodes_unused_total",
                                    "Grants a node's sidecar got for a job with no rank on the node, by what "
                                    "the coordinator did (released on the job's behalf, kept, or taken back until the job asks)",
                                    ["outcome"], registry=r),
        grant_latency=Histogram("rollmux_grant_latency_seconds",
                                "From the moment a permit became grantable to its durable grant",
                                buckets=GRANT_BUCKETS_S, registry=r),
        queue_length=Gauge("rollmux_queue_length", "Queued phases over the pool's nodes", ["pool"], registry=r),
        bubble_seconds=Counter("rollmux_bubble_seconds_total",
                               "Node-seconds a node sat free while a phase was queued on it", ["pool"], registry=r),
        provisioned_usd_per_h=Gauge("rollmux_provisioned_usd_per_hour", "Hourly price of all groups' GPUs",
                                    registry=r),
        jobs=Gauge("rollmux_jobs", "Registered jobs", ["state"], registry=r),
        nodes=Gauge("rollmux_nodes", "Registered nodes", ["state"], registry=r),
        pool_nodes=Gauge("rollmux_pool_nodes", "READY nodes per pool", ["pool"], registry=r),
        store_commits=Counter("rollmux_store_commits_total", "Batched state-store commits", ["outcome"],
                              registry=r),
        relocations=Counter("rollmux_relocations_total", "Relocation directives issued, switched, expired, "
                            "cancelled", ["outcome"], registry=r),
        gc_pause=Histogram("rollmux_gc_pause_seconds", "Garbage-collection passes of the coordinator process "
                           "(young: paced; full: on heap growth or state reload)", ["pass"],
                           buckets=GRANT_BUCKETS_S, registry=r),
        loop_lag=Histogram("rollmux_event_loop_lag_seconds", "How late a task due on the coordinator's event "
                           "loop started (sampled every 50 ms by the collector's pacer)", buckets=GRANT_BUCKETS_S,
                           registry=r),
        ready=Gauge("rollmux_ready", "1 when the coordinator serves requests", registry=r),
        build_info=Gauge("rollmux_build_info", "Build information", ["version"], registry=r),
    )
    m.build_info.labels(version=version).set(1)
    # Every known label value exported from the start (at 0), so rate() and alerts see a series
    # before the first event instead of no data.
    for pool in POOLS:
        for family in (m.permits_granted, m.permits_released, m.bubble_seconds, m.queue_length, m.pool_nodes):
            family.labels(pool=pool)
    for reason in REVOKE_REASONS:
        m.permits_revoked.labels(reason=reason)
    for outcome in COMMIT_OUTCOMES:
        m.store_commits.labels(outcome=outcome)
    for outcome in RELOCATION_OUTCOMES:
        m.relocations.labels(outcome=outcome)
    for kind in GC_PASSES:
        m.gc_pause.labels(**{"pass": kind})
    return m
