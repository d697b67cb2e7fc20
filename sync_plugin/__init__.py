"""Topology-aware weight sync from trainer ranks to rollout ranks (scatter, then all-gather).

Importing this package does not import torch; the collective code imports it inside functions.
See ``engine.py`` for the call order.
"""

from __future__ import annotations

from rollmux.sync_plugin.api import (
    BucketPlan,
    MetadataMismatchError,
    ParamMeta,
    Placement,
    PlanError,
    Scheme,
    Sharding,
    Span,
    SyncError,
    SyncTopology,
    TopologyError,
    Transfer,
    TransferPlan,
    metadata_digest,
)
from rollmux.sync_plugin.engine import receive, send, send_local_shard
from rollmux.sync_plugin.groups import SyncGroups, create_groups, exchange_metadata
from rollmux.sync_plugin.plan import DEFAULT_BUCKET_BYTES, own_spans, plan_full_buckets, plan_transfer
from rollmux.sync_plugin.tensors import param_metadata

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "BucketPlan",
    "MetadataMismatchError",
    "ParamMeta",
    "Placement",
    "PlanError",
    "Scheme",
    "Sharding",
    "Span",
    "SyncError",
    "SyncGroups",
    "SyncTopology",
    "TopologyError",
    "Transfer",
    "TransferPlan",
    "create_groups",
    "exchange_metadata",
    "metadata_digest",
    "own_spans",
    "param_metadata",
    "plan_full_buckets",
    "plan_transfer",
    "receive",
    "send",
    "send_local_shard",
]
